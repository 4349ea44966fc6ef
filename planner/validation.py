"""What every config check shares, below the architecture files (no torch, no planner imports).

The one error type a user sees for an invalid model or run (one line), the value sets a config is held to,
and the small checks the families' config classes run in __post_init__. planner/config.py re-exports these
names, so `from planner.config import ConfigError` keeps working.
"""
from __future__ import annotations

from typing import Any


# A model with more parameters than this is refused: 1e13 parameters is ~20x the largest dense model
# ever published, so a config this size is a typo (an extra zero in a width), and its byte counts
# would be meaningless to plan for.
MAX_PARAMETERS = 10**13

ATTENTION_KINDS = ("eager", "sdpa")
# The dtypes a checkpoint is saved in (HF's torch_dtype); a config without one is read as float32.
CHECKPOINT_DTYPES = ("float32", "float16", "bfloat16")


class ConfigError(ValueError):
    """An invalid model or run description; its message is one line, shown to the user as is."""


# Attention kernels transformers offers that need a CUDA GPU and an extra package: refused with the reason.
GPU_ONLY_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention", "paged_attention")

# transformers 5.23's ACT2FN names (activations.py); the planner models the ones in ACTIVATION_SAVED.
HF_ACTIVATIONS = ("gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh",
                  "gelu_python_tanh", "gelu_accurate", "hardswish", "laplace", "leaky_relu", "linear", "mish",
                  "quick_gelu", "relu", "relu2", "relu6", "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh",
                  "prelu", "xielu")
# Tensors of the activation's input size that its autograd nodes save, besides its output (which the
# next op saves): one fused kernel saves its input (silu, gelu, gelu tanh: aten derivatives.yaml) or its
# output (relu: threshold_backward(result)); transformers' Python tanh-GELUs (NewGELUActivation,
# GELUTanh(use_gelu_tanh_python)) save x, 0.5x, tanh(.) and 1 + tanh(.) (measured, saved-tensor hooks).
ACTIVATION_SAVED = {"silu": 1, "swish": 1, "gelu": 1, "gelu_pytorch_tanh": 1, "relu": 0, "gelu_new": 4,
                    "gelu_python_tanh": 4}


def check_attention_kind(attention: str) -> None:
    if attention in GPU_ONLY_ATTENTION:
        raise ConfigError(f"attention {attention!r} needs a CUDA GPU and its kernel package; the planner "
                          f"measures on this machine's CPU with one of: {', '.join(ATTENTION_KINDS)}")
    if attention not in ATTENTION_KINDS:
        raise ConfigError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}")


def check_activation(act: str) -> None:
    if act not in HF_ACTIVATIONS:
        raise ConfigError(f"hidden_act {act!r} is not an activation transformers knows; it accepts: "
                          f"{', '.join(HF_ACTIVATIONS)}")
    if act not in ACTIVATION_SAVED:
        raise ConfigError(f"hidden_act {act!r} is valid in transformers but its memory is not modelled yet; "
                          f"supported: {', '.join(ACTIVATION_SAVED)}")


def _check_optional(cfg: Any) -> None:
    if cfg.torch_dtype is not None and cfg.torch_dtype not in CHECKPOINT_DTYPES:
        raise ConfigError(f"torch_dtype must be one of {', '.join(CHECKPOINT_DTYPES)}, got {cfg.torch_dtype!r}")
    if cfg.name is not None and not (isinstance(cfg.name, str) and 0 < len(cfg.name) <= 100):
        raise ConfigError(f"name must be a string of 1 to 100 characters, got {cfg.name!r}")


def _check_positive(cfg: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")
