"""Which layout fits a training run in the fewest devices of a budget: DDP, FSDP2, TP or FSDP2 + TP (no torch).

The per-rank peaks are planner.estimate.distributed's; the search over world sizes is planner.fit.fewest_ranks's
(doubling, then bisection) for DDP and FSDP2, and here for the TP layouts:
  tp       the TP degree is the world size; it must divide the heads, KV heads, MLP width and vocabulary
           (planner.parallel.check_wrappable), so the candidates are those divisors, smallest first;
  fsdp+tp  the TP degree is fixed (the user's --tp, or each of TP_SIZES for the solver, torchtitan's TP stays
           inside a node of 8 devices), and the data-parallel degree dp >= 2 is searched: world = dp * tp.
planner.fit.choose_layout compares the fewest devices of DDP, FSDP2 and FSDP2 + TP (TP_SIZES); a tie goes to the
simpler one (DDP, then FSDP2, then FSDP2 + TP: fewer collectives per step).
"""
from __future__ import annotations

import dataclasses
import functools

from .config import ConfigError, ModelConfig
from .parallel import ParallelSpec, check_parallel_run, check_wrappable
from .units import fmt_bytes

TP_SIZES = (2, 4, 8)  # TP within one node (NVLink): torchtitan's and Megatron's usual degrees
RANK_LIMIT = 1 << 16  # as planner.fit.RANK_LIMIT


def _peak(cfg: ModelConfig, spec, pspec: ParallelSpec) -> int:
    from .estimate.distributed import estimate_distributed

    return estimate_distributed(cfg, spec, pspec).peak_bytes


def _valid(cfg: ModelConfig, spec, pspec: ParallelSpec) -> bool:
    try:
        check_parallel_run(spec, pspec)
        check_wrappable(cfg, pspec)
    except ConfigError:
        return False
    return True


def fewest_ranks_tp(cfg: ModelConfig, spec, pspec: ParallelSpec, budget: int) -> tuple[int, str]:
    """The fewest devices for a TP layout (pspec.parallel tp or fsdp+tp); 0 with the reason."""
    if pspec.parallel == "tp":
        tried = []
        for tp in range(2, RANK_LIMIT + 1):
            cand = dataclasses.replace(pspec, world_size=tp, tp=None)
            if not _valid(cfg, spec, cand):
                if tp > max(cfg.num_attention_heads, 2):
                    break  # no TP degree beyond the heads
                continue
            peak = _peak(cfg, spec, cand)
            tried.append((tp, peak))
            if peak <= budget:
                return tp, f"{tp} ranks: {fmt_bytes(peak)} per rank"
        if not tried:
            return 0, "no TP degree divides the heads, KV heads, MLP width and vocabulary"
        tp, peak = min(tried, key=lambda t: t[1])
        return 0, (f"no TP degree fits: the lowest per-rank peak is {fmt_bytes(peak)} at TP {tp} > {fmt_bytes(budget)} "
                   "(TP does not shard the residual stream's activations)")
    tp = pspec.tp_degree
    at = functools.cache(lambda dp: _peak(cfg, spec, dataclasses.replace(pspec, world_size=dp * tp)))
    lo, hi = 1, 2
    while at(hi) > budget:
        if hi * tp >= RANK_LIMIT:
            return 0, f"no world size up to {RANK_LIMIT:,} fits at TP {tp}: {fmt_bytes(at(hi))} per rank at {hi * tp:,}"
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mid >= 2 and at(mid) <= budget else (mid, hi)
    return hi * tp, f"{hi * tp} ranks (FSDP {hi} x TP {tp}): {fmt_bytes(at(hi))} per rank"
