"""The real torch models (imported only by routines that run in a child process, and by tests).

Each architecture's file in planner/arch says how to build its model: the book's GPT-2 is
planner/models/gpt2.py; every Hugging Face family is transformers' own implementation.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from .gpt2 import GPTModel

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu", dtype: str = "float32") -> torch.nn.Module:
    """Instantiate the model for `cfg` directly in `dtype` on `device` ("meta" allocates nothing).

    Building in the target dtype (rather than `.to(dtype)` afterwards) never holds an fp32 and a bf16
    copy at once, and gives the same parameter and buffer dtypes.
    """
    from ..arch import family_of

    return family_of(cfg).build(cfg, device, dtype)


__all__ = ["GPTModel", "build_model", "TORCH_DTYPES"]
