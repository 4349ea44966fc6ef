"""bitsandbytes' optimizers: which they are, what they cannot do, and whether bitsandbytes can run here
(no torch; bitsandbytes itself is never imported). Their memory is in planner/estimate/bnb_optim.py.
"""
from __future__ import annotations

import importlib.util

from .validation import ConfigError

BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw")
PAGED = ("paged-adamw-8bit", "paged-adamw")
EIGHT_BIT = ("adamw-8bit", "paged-adamw-8bit")


def is_bnb(optimizer: str) -> bool:
    return optimizer in BNB_OPTIMIZERS


def bnb_available() -> bool:
    """Whether the measuring child can import bitsandbytes (the estimate itself needs no bitsandbytes)."""
    return importlib.util.find_spec("bitsandbytes") is not None


def require_bitsandbytes(optimizer: str) -> None:
    """The one line for a measurement / simulation of a bitsandbytes optimizer without bitsandbytes."""
    if is_bnb(optimizer) and not bnb_available():
        raise ConfigError(f"--optimizer {optimizer} runs bitsandbytes' optimizer, and bitsandbytes is not installed "
                          "(pip install bitsandbytes); the estimate alone (planner estimate) does not need it")


def check_spec(optimizer: str, optimizer_impl: str, device_type: str) -> None:
    """One clear line for what a bitsandbytes optimizer cannot do."""
    if not is_bnb(optimizer):
        return
    if optimizer_impl != "default":
        raise ConfigError(f"--optimizer-impl {optimizer_impl} picks a torch.optim kernel; {optimizer} is "
                          "bitsandbytes' own kernel (leave --optimizer-impl default)")
    if optimizer in PAGED and device_type == "cpu":
        raise ConfigError(f"{optimizer} needs a CUDA device: paged optimizers keep their states in CUDA unified "
                          "memory (bitsandbytes functional.get_paged, cudaMallocManaged) and on the CPU bitsandbytes "
                          "falls back to the unpaged optimizer; use adamw-8bit (or adamw) on the CPU")
