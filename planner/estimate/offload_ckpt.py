"""Unsloth's offloaded gradient checkpointing, derived from full checkpointing's estimate (issue #24 item 5; no torch).

Unsloth (unsloth/models/_utils.py, class Unsloth_Offloaded_Gradient_Checkpointer; unsloth.ai/blog/long-context)
wraps each decoder layer in an autograd Function whose forward copies the layer's input to the host
(`hidden_states.to("cpu", non_blocking=True)`) and saves only that copy; its backward copies it back to the device
(`.to("cuda", non_blocking=True)`), recomputes the layer and runs its backward. So what full checkpointing keeps on
the device per block, its stashed input (b*s*h*e_r, the estimate's "checkpointed block inputs" term), lives on the
host instead; one block's input is back on the device while that block recomputes.

This is a DERIVED figure, not a measured one: the estimate of full checkpointing (measured on the CPU) less the
stashed inputs of all blocks but the one in flight, on every phase that holds them. The device figure is left to the
CUDA check (it runs only on CUDA: `.to("cuda")`); it is used only for the longest-context table beside Unsloth's
published figures (docs/finetune.md), never as a `--flag` of a run.
"""
from __future__ import annotations

import dataclasses

STASH_TERM = "checkpointed block inputs"


def offloaded_checkpoint(est, cfg) -> tuple[int, int]:
    """(device peak, host bytes) of a fully checkpointed estimate with its block inputs on the host."""
    stash = sum(t["bytes"] for t in est.terms if t["name"].startswith(STASH_TERM))
    one = stash // max(cfg.layers, 1)
    moved = stash - one  # every block's input but the one recomputing
    phases = {k: v - (moved if k in ("forward", "loss", "backward") else 0) for k, v in est.phase_peak_bytes.items()}
    return max(phases.values()), stash


def longest_offloaded(cfg, spec, usable: int) -> int:
    """The longest sequence (up to the model's context) whose derived device peak fits in `usable` bytes."""
    from .training import estimate_training

    at = lambda s: offloaded_checkpoint(estimate_training(cfg, dataclasses.replace(spec, seq_len=s)), cfg)[0]
    if at(1) > usable:
        return 0
    lo, hi = 1, cfg.max_seq_len + 1  # at(lo) fits, at(hi) does not (the peak grows with the sequence)
    if at(cfg.max_seq_len) <= usable:
        return cfg.max_seq_len
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) <= usable else (lo, mid)
    return lo
