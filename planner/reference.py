"""Published figures of other tools, shown beside this planner's own answers and labelled as theirs (never
as a measurement of ours). Each entry says where it comes from and what setting it is for.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LongestContext:
    """A published "longest context that fits" table: budget (GB as published) -> tokens (None: out of memory)."""
    source: str
    url: str
    model: str            # the preset this table is for
    setting: str          # in words: what was run
    columns: dict         # column label -> {budget_gb: tokens or None}

    def rows(self) -> list[dict]:
        budgets = sorted({gb for col in self.columns.values() for gb in col})
        return [{"budget_gb": gb, **{label: col.get(gb) for label, col in self.columns.items()}} for gb in budgets]


# Unsloth's README ("Llama 3.1 (8B) max. context length", also unsloth.ai/blog/llama3-3): Llama 3.1 8B, 4-bit
# QLoRA on all linear layers (q, k, v, o, gate, up, down), rank 32, batch 1, sequences padded to the length;
# Unsloth's column uses its offloaded gradient checkpointing and Apple's Cut Cross Entropy, the other is
# Hugging Face + FlashAttention-2. Copied from research/next-frontier.md ("Fine-tuning").
UNSLOTH_LLAMA31_8B = LongestContext(
    source="Unsloth (published)",
    url="https://github.com/unslothai/unsloth#-performance-benchmarking",
    model="llama-3.1-8b",
    setting="QLoRA (4-bit base) r=32 on all linear layers, batch 1",
    columns={
        "Unsloth": {8: 2_972, 12: 21_848, 16: 40_724, 24: 78_475, 40: 153_977, 48: 191_728, 80: 342_733},
        "Hugging Face + FA2": {8: None, 12: 932, 16: 2_551, 24: 5_789, 40: 12_264, 48: 15_502, 80: 28_454},
    },
)


# The seed notebook's GPT-2 XL fp32 loading figures, method -> (GPU GB, CPU GB) peaks (LLMs-from-scratch
# ch05 memory-efficient loading notebook, Colab L4, torch 2.4.1, GB = 1024**3): shown beside ours, as theirs.
NOTEBOOK_GPT2_XL = {"baseline": (12.8, 4.4), "sequential": (6.7, 6.3), "meta": (12.8, 1.3), "mmap": (6.4, 5.9),
                    "per-tensor": (6.4, 0.3)}
