"""What a page asks the planner for a run it may start, in one call (no torch, no streamlit).

The Training step page reads its settings, calls `step_run` once and renders: the estimate it compares with
(the per-rank one under data parallelism), the budget, the memory a CPU run may take, whether the run is
refused here and why (in the words the command line uses), the child's command line for measure and simulate,
and the component table that sets a finished record beside the estimate. The command line applies the same
guard (RAM_GUARD_FRACTION), so the page and `python -m planner measure` refuse the same runs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .config import ConfigError, ModelConfig
from .parallel import ParallelSpec
from .spec import TrainSpec, prepare, run_args
from .units import fmt_bytes

# A CPU measurement may use at most this share of the RAM that is available when it starts: the estimate
# is of live tensors, and the process adds allocator slack and torch itself (~0.3-0.5 GB).
RAM_GUARD_FRACTION = 0.8


def check_ram_guard(need_bytes: int, what: str) -> None:
    """The CLI's guard before a CPU run: ConfigError (one line, exit 2) when `what` (e.g. "the estimated peak") of
    `need_bytes` exceeds RAM_GUARD_FRACTION of the RAM available now."""
    import psutil

    available = psutil.virtual_memory().available
    if need_bytes > RAM_GUARD_FRACTION * available:
        raise ConfigError(f"refused: {what} {fmt_bytes(need_bytes)} exceeds {RAM_GUARD_FRACTION:.0%} of the "
                          f"{fmt_bytes(available)} of RAM available now")


@dataclass
class StepRun:
    cfg: ModelConfig                 # the model as the run uses it (attention override applied, validated)
    spec: TrainSpec
    parallel: ParallelSpec | None
    estimate: dict                   # TrainEstimate.to_dict() or, with `parallel`, DistEstimate.to_dict()
    budget_bytes: int                # the device's memory (cuda) or the RAM available now (cpu), or as given
    limit_bytes: int                 # what the run's estimated peak may reach here before it is refused
    refusal: str = ""                # "" when the run may be measured here; else one line saying why not
    notes: list[str] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return bool(self.refusal)

    def child_args(self, kind: str = "measure", timeout_s: int = 600, exports: dict | None = None) -> list[str]:
        """`python -m planner measure|simulate train ...` for exactly these settings (the job adds the config);
        `exports` ({"memory_snapshot": path, "trace": path}) adds --memory-snapshot / --trace (one process only)."""
        args = [kind, "train", *run_args(self.spec), "--json", "--progress", "--timeout", str(timeout_s)]
        if exports and not self.parallel:
            args += ["--memory-snapshot", exports["memory_snapshot"], "--trace", exports["trace"]]
        p = self.parallel
        if p:
            args += ["--world-size", str(p.world_size), "--parallel", p.parallel]
            if p.parallel == "fsdp":
                args += ["--reshard-after-forward", str(p.reshard_after_forward).lower()]
                args += ["--mp-param-dtype", p.mp_param_dtype] if p.mp_param_dtype else []
                args += ["--mp-reduce-dtype", p.mp_reduce_dtype] if p.mp_reduce_dtype else []
                args += ["--cpu-offload"] if p.cpu_offload else []
        return args


def step_run(cfg: ModelConfig, spec: TrainSpec, attention: str | None = None, parallel: dict | None = None,
             budget_bytes: int | None = None, gpu: dict | None = None, available_ram: int = 0) -> StepRun:
    """The run the page shows for these settings: raises ConfigError (one line) for settings that do not fit
    this model. `gpu` is planner.fit.gpu_info()'s answer (None without one); on a machine without a GPU a
    cuda run is measured on the CPU instead, and a note says so."""
    from .distributed import check_real_ranks
    from .estimate.distributed import estimate_distributed
    from .estimate.training import estimate_training
    from .fit import max_batch_size

    notes = []
    if spec.device_type == "cuda" and not gpu:
        spec = dataclasses.replace(spec, device="cpu")
        notes.append("No GPU here: the step is measured on the CPU (live tensor bytes and RSS).")
    run_cfg = prepare(cfg, spec, attention)
    pspec = ParallelSpec(**parallel) if parallel else None
    from .fitted import is_fitted

    if is_fitted(run_cfg):  # issue #20: no formula family; the estimate is the kept fit's (planner/fitted.py)
        return _fitted_step_run(run_cfg, spec, pspec, budget_bytes, gpu, available_ram, notes)
    est = estimate_distributed(run_cfg, spec, pspec) if pspec else estimate_training(run_cfg, spec)
    budget = budget_bytes or (gpu["total_bytes"] if gpu and spec.device_type == "cuda" else available_ram)
    limit = int(RAM_GUARD_FRACTION * available_ram) if spec.device_type == "cpu" else budget
    refusal = ""
    if pspec:
        try:  # the CLI refuses the same (exit 2): more ranks than this machine runs, or more RAM than it has
            check_real_ranks(pspec, spec.device, est.peak_bytes + est.host_bytes)
        except ConfigError as exc:
            refusal = (f"Not measured here: {str(exc).removeprefix('refused: ')}. "
                       "Simulate runs any number of ranks.")
    elif est.peak_bytes > limit:
        best, _ = max_batch_size(run_cfg, spec, int(limit))
        refusal = (f"Not started: the estimated peak {fmt_bytes(est.peak_bytes)} exceeds the {fmt_bytes(limit)} this "
                   f"machine can give it. The largest batch that fits is {best}; the Planner page lists other changes.")
    return StepRun(run_cfg, spec, pspec, est.to_dict(), budget, limit, refusal, notes)


def _fitted_step_run(run_cfg, spec, pspec, budget_bytes, gpu, available_ram, notes) -> StepRun:
    """A model whose estimate is a fitted simulation: the kept fit's answer (basis "fitted simulation"), or a
    refusal to measure until there is one (simulate needs none); no data-parallel layouts."""
    from .fitted import estimate_block

    budget = budget_bytes or (gpu["total_bytes"] if gpu and spec.device_type == "cuda" else available_ram)
    limit = int(RAM_GUARD_FRACTION * available_ram) if spec.device_type == "cpu" else budget
    if pspec:
        raise ConfigError(f"{run_cfg.model_type}: data-parallel layouts need a formula family")
    block = estimate_block(run_cfg, spec)
    if block is None:
        est = {"peak_bytes": 0, "peak_phase": "forward", "phase_peak_bytes": {}, "basis": "fitted simulation"}
        return StepRun(run_cfg, spec, None, est, budget, limit, "Not measured yet: no formula family reads this "
                       "model_type and its fit is not made for these settings. Make it on the Planner page (Fit by "
                       "simulation), or simulate the step here.", notes + ["Basis: fitted simulation."])
    refusal = ""
    if block["peak_bytes"] > limit:
        refusal = (f"Not started: the fitted peak {fmt_bytes(block['peak_bytes'])} exceeds the {fmt_bytes(limit)} this "
                   "machine can give it.")
    return StepRun(run_cfg, spec, None, block, budget, limit, refusal,
                   notes + ["The estimate is a fitted simulation (no formula family reads this model_type)."])


def component_rows(estimate: dict, record: dict, source: str) -> list[dict]:
    """The finished record beside the estimate, component by component (component, source, bytes): what
    lives through the whole step (weights, buffers, the batch, optimizer state, the fp16 loss scaler) and the
    optimizer state alone. The record's persistent_bytes is the tracker's count of the same tensors. A fitted
    estimate (issue #20) has no components: the record's rows alone."""
    if "params_bytes" not in estimate:
        label = "persistent (weights, batch, optimizer)"
        return [{"component": label, "source": source, "bytes": record["persistent_bytes"]},
                {"component": "optimizer state", "source": source, "bytes": record["optimizer_bytes"]}]
    persistent = (estimate["params_bytes"] + estimate["buffers_bytes"] + estimate["inputs_bytes"]
                  + estimate["optimizer_bytes"] + estimate.get("transients", {}).get("gradscaler", 0))
    label = "persistent (weights, batch, optimizer)"
    return [{"component": label, "source": "estimate", "bytes": persistent},
            {"component": label, "source": source, "bytes": record["persistent_bytes"]},
            {"component": "optimizer state", "source": "estimate", "bytes": estimate["optimizer_bytes"]},
            {"component": "optimizer state", "source": source, "bytes": record["optimizer_bytes"]}]


def phase_rows(estimate: dict, record: dict, source: str) -> list[dict]:
    """The peak of each phase, estimated and from the record (phase, source, bytes)."""
    return [{"phase": p, "source": src, "bytes": val}
            for p in estimate["phase_peak_bytes"]
            for src, val in (("estimate", estimate["phase_peak_bytes"][p]), (source, record["phase_peak_bytes"].get(p, 0)))]


def category_rows(estimate: dict, record: dict, source: str) -> list[dict]:
    """The `categories` blocks side by side (issue #19 item 3): per phase and category (MemTracker's names),
    the estimate's bytes, the record's, their difference and how the estimate split the phase (`split`: exact or
    approximate, planner/estimate/categories.py); an older estimate's one sum for several categories is compared
    with the record's same sum. Empty when either side has no categories (a record from before they were kept)."""
    est_c, rec_c = estimate.get("categories") or {}, record.get("categories") or {}
    rows = []
    for phase, e in est_c.items():
        r = rec_c.get(phase)
        if not r:
            continue
        split = e.get("split", "exact")
        for name, value in e.items():
            if value is None or name == "split":
                continue
            parts = [p.strip() for p in name.replace(" and ", ", ").split(",")]
            measured = sum(r.get(p, 0) for p in parts) if len(parts) > 1 else r.get(name)
            if measured is None:
                continue
            rows.append({"phase": phase, "category": name, "estimate": value, source: measured,
                         "difference": value - measured, "split": split})
    return rows


def category_stack_rows(estimate: dict) -> list[dict]:
    """The estimate's `categories` (planner/estimate/categories.py) as the rows of the stacked chart
    (planner/charts.py category_bars): per phase and category (named as the measured timeline names them), its
    bytes and how the phase was split (exact or approximate). Empty for an estimate without categories."""
    rows = []
    for phase, cats in (estimate.get("categories") or {}).items():
        for name, value in cats.items():
            if name in ("total", "split") or not isinstance(value, int):
                continue
            rows.append({"phase": phase, "category": "input" if name == "inputs" else name, "bytes": value,
                         "split": cats.get("split", "exact")})
    return rows
