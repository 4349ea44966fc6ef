"""The real torch models (imported only by routines that run in a child process, and by tests).

Each architecture's file in planner/arch says how to build its model (planner.routines.build_model
asks it): the book's GPT-2 is planner/models/gpt2.py; every Hugging Face family is transformers' own
implementation. Nothing here imports the planner's registry.
"""
from __future__ import annotations

import torch

from .gpt2 import GPTModel

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


__all__ = ["GPTModel", "TORCH_DTYPES"]
