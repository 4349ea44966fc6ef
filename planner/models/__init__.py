"""The real torch models (imported only by routines that run in a child process, and by tests)."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..config import GPT2Config, LlamaConfig, ModelConfig
from .gpt2 import GPTModel
from .llama import LlamaForCausalLM

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu", dtype: str = "float32") -> torch.nn.Module:
    """Instantiate the model for `cfg` directly in `dtype` on `device` ("meta" allocates nothing).

    Building under the target default dtype (rather than `.to(dtype)` afterwards) never holds an fp32
    and a bf16 copy at once, and gives the same parameter and buffer dtypes.
    """
    cls = GPTModel if isinstance(cfg, GPT2Config) else LlamaForCausalLM if isinstance(cfg, LlamaConfig) else None
    if cls is None:
        raise TypeError(f"not a model config: {cfg!r}")
    with _default_dtype(TORCH_DTYPES[dtype]), torch.device(device):
        model = cls(cfg)
    return model


__all__ = ["GPTModel", "LlamaForCausalLM", "build_model", "TORCH_DTYPES"]
