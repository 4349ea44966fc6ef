"""bitsandbytes' optimizers: which they are, what they cannot do, and whether bitsandbytes can run here; and
the storage of one quantized weight, which QLoRA's base and quantized inference share (no torch; bitsandbytes
itself is never imported). The optimizers' memory is in planner/estimate/bnb_optim.py.
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


# bitsandbytes/nn/modules.py Params4bit(blocksize=64) and BitsAndBytesConfig(bnb_4bit_blocksize=None -> 64):
# one absmax per 64 weights (functional.quantize_4bit)
BLOCKSIZE_4BIT = 64
# functional.quantize_4bit with compress_statistics: the fp32 absmax is itself quantized blockwise, 256 per
# block (quantize_blockwise(absmax, blocksize=256)), to uint8 with an fp32 absmax per block, the 256-entry
# fp32 dynamic code (create_dynamic_map) and the fp32 offset (absmax.mean()) subtracted first
BLOCKSIZE_NESTED = 256
CODE_4BIT_ENTRIES = 16     # QuantState.code: get_4bit_type(nf4 | fp4), 16 fp32 values
CODE_NESTED_ENTRIES = 256  # state2.code: create_dynamic_map(signed=True), 256 fp32 values


def quantized_linear_bytes(n_out: int, n_in: int, spec) -> int:
    """Storage of one quantized weight and its statistics (bitsandbytes/functional.py quantize_4bit /
    QuantState; int8: bitsandbytes/nn/modules.py Int8Params, int8 weight and an fp32 SCB per row)."""
    n = n_out * n_in
    if spec.quantize_base == "int8":
        return n + 4 * n_out
    packed = (n + 1) // 2  # two 4-bit codes per uint8, shape ((n + 1) // 2, 1)
    blocks = -(-n // BLOCKSIZE_4BIT)
    if not spec.double_quant:
        return packed + 4 * blocks + 4 * CODE_4BIT_ENTRIES
    nested_blocks = -(-blocks // BLOCKSIZE_NESTED)
    return (packed + blocks + 4 * nested_blocks + 4 * CODE_NESTED_ENTRIES + 4 * CODE_4BIT_ENTRIES
            + 4)  # offset: a 0-d fp32 tensor
