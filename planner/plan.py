"""Everything the Planner page shows for one set of settings, in one call (no torch, no streamlit).

The page reads its widgets, calls plan() once and renders the result. What a slider move does not change
is memoised per model and run settings: a batch move reuses the largest batch and the batch curve, a
sequence move the longest sequence and the sequence curve.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .accounting import per_config
from .config import ModelConfig
from .estimate.training import TrainEstimate, estimate_training
from .fit import Option, advice, cuda_context_bytes, max_batch_size, max_seq_len, tensor_budget
from .spec import TrainSpec

CURVE_POINTS = 25
BATCH_LIMIT = 1 << 20  # max_batch_size's search limit


@dataclass
class Plan:
    estimate: TrainEstimate
    budget_bytes: int          # as given (typed or the default)
    cuda_context_bytes: int    # taken off the budget on cuda, as its own line
    tensor_budget_bytes: int   # what the estimated peak is compared with
    breakdown: list[dict]      # scenario, component, bytes
    max_batch: int
    max_batch_reason: str
    max_seq: int
    max_seq_reason: str
    advice: list[Option]
    batch_curve: list[dict]    # batch, peak_bytes
    seq_curve: list[dict]      # seq, peak_bytes

    @property
    def fits(self) -> bool:
        return self.estimate.peak_bytes <= self.tensor_budget_bytes


def nice_ceil(x: float) -> int:
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above x (an axis end a reader can take in)."""
    step = 1
    while True:
        for m in (1, 2, 2.5, 5):
            if m * step >= x and m * step == int(m * step):
                return int(m * step)
        step *= 10


def curve_end(crossing: int, current: int, limit: int, floor: int = 8) -> int:
    """Where a curve's x axis ends: the limit (the model's context) when everything up to it fits, else
    twice the largest value that fits (rounded up to a nice number), so the budget line stays readable;
    never before the current setting."""
    end = limit if crossing >= limit else nice_ceil(2 * max(crossing, 1))
    return min(max(end, floor, current), limit)


def _points(end: int) -> list[int]:
    return sorted({max(1, round(end * i / (CURVE_POINTS - 1))) for i in range(CURVE_POINTS)})


@per_config
def _sweep(cfg: ModelConfig, spec: TrainSpec, field: str, end: int) -> list[dict]:
    """The estimated peak at CURVE_POINTS values of one setting (batch_size or seq_len) from 1 to end."""
    key = "batch" if field == "batch_size" else "seq"
    return [{key: v, "peak_bytes": estimate_training(cfg, dataclasses.replace(spec, **{field: v})).peak_bytes}
            for v in _points(end)]


def breakdown(est: TrainEstimate, grad_accum: int) -> list[dict]:
    """Two bars: what is alive at the peak (by component), and each component's full size."""
    persistent = {"params": est.params_bytes, "buffers": est.buffers_bytes, "inputs": est.inputs_bytes,
                  "optimizer": est.optimizer_bytes}
    at_peak = dict(persistent)
    rest = est.peak_bytes - sum(persistent.values())
    if est.peak_phase in ("optimizer", "zero_grad") or grad_accum > 1:
        at_peak["grads"] = est.grads_bytes
        rest -= est.grads_bytes
    if est.peak_phase in ("forward", "loss", "backward"):
        at_peak["activations"] = min(est.activations_bytes, max(rest, 0))
        rest -= at_peak["activations"]
    at_peak["transients"] = max(rest, 0)
    totals = {**persistent, "grads": est.grads_bytes, "activations": est.activations_bytes}
    return ([{"scenario": f"at the peak ({est.peak_phase})", "component": k, "bytes": v} for k, v in at_peak.items()]
            + [{"scenario": "each component's full size", "component": k, "bytes": v} for k, v in totals.items()])


def plan(cfg: ModelConfig, spec: TrainSpec, budget: int) -> Plan:
    """cfg: the model as the run uses it (planner.spec.prepare); budget: the memory budget in bytes."""
    est = estimate_training(cfg, spec)
    usable = tensor_budget(budget, spec.device)
    # Each side is memoised without the setting it sweeps, so moving that slider reuses it.
    any_batch, any_seq = dataclasses.replace(spec, batch_size=1), dataclasses.replace(spec, seq_len=1)
    best_batch, batch_reason = max_batch_size(cfg, any_batch, usable)
    best_seq, seq_reason = max_seq_len(cfg, any_seq, usable)
    batch_end = curve_end(best_batch, spec.batch_size, BATCH_LIMIT)
    seq_end = curve_end(best_seq, spec.seq_len, cfg.max_seq_len)
    return Plan(estimate=est, budget_bytes=budget, cuda_context_bytes=cuda_context_bytes(spec.device),
                tensor_budget_bytes=usable, breakdown=breakdown(est, spec.grad_accum),
                max_batch=best_batch, max_batch_reason=batch_reason, max_seq=best_seq, max_seq_reason=seq_reason,
                advice=advice(cfg, spec, usable), batch_curve=_sweep(cfg, any_batch, "batch_size", batch_end),
                seq_curve=_sweep(cfg, any_seq, "seq_len", seq_end))
