"""The command line for a model whose estimate is a fitted simulation (issue #20; planner/fitted.py; no torch).

    python -m planner estimate train --config olmo2.json --batch-size 4 --seq-len 2048 [--json] [--progress] [--refit]

The first estimate of a model and settings makes the fit (every point simulated in two children at once: progress per point,
on stderr, or JSON lines with --json --progress) and keeps it; later ones read it (milliseconds). The record is
the estimate's, with `"basis": "fitted simulation"`, the fit's `status` (exact | approximate) and `bound_bytes`.
measure and simulate of such a model carry the kept fit's answer as their `estimate` block when there is one;
measure's RAM guard otherwise simulates the point first.
"""
from __future__ import annotations

import json
import sys

from .args import progress
from ..config import ConfigError
from ..units import fmt_bytes

from ..fitted import estimate_block  # planner/fitted.py (planner/api.py reads it too, without the CLI)


def _say(args, stage: str, fraction: float) -> None:
    if getattr(args, "json", False) and getattr(args, "progress", False):
        print(json.dumps({"event": "progress", "stage": stage, "fraction": fraction}), flush=True)
    elif not getattr(args, "json", False):
        progress(stage)


def cmd_estimate_fitted(args, cfg, spec) -> int:
    from . import parallel as cli_parallel
    from .module import fit_failure
    from ..fitted import fitted_model, fitted_record
    from ..whatif import MisalignedError

    if cli_parallel.parallel_requested(args):
        raise ConfigError(f"{cfg.model_type}: --world-size / --parallel needs a formula family")

    def on_point(p, done, total):
        where = f"b={p[0]} s={p[1]}" + (f" with {p[2]} layers" if len(p) > 2 else " at full depth")
        _say(args, f"fitting {cfg.model_type}: simulated {where} ({done}/{total})", done / total)

    try:
        what, path, cached, info = fitted_model(cfg, spec, on_point, timeout_s=getattr(args, "timeout", 600.0),
                                                refit=getattr(args, "refit", False))
        rec = fitted_record(cfg, spec, what, path, cached, info)
    except MisalignedError as exc:
        raise ConfigError(str(exc)) from None
    except RuntimeError as exc:
        return fit_failure(exc)
    if args.json:
        print(json.dumps(rec))
        return 0
    bound = "" if what.exact else (f" (APPROXIMATE: +/- {what.bound_bytes:,} B)" if what.bound_bytes is not None
                                   else " (unvalidated)")
    print(f"fitted peak {fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes']:,} B){bound} in {rec['peak_phase']}")
    print("phase peaks: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in rec["phase_peak_bytes"].items()))
    made = "kept" if cached else f"made from {info.get('simulations')} simulations in {info.get('simulate_s', 0):.1f} s"
    print(f"basis: fitted simulation ({made}): {what.describe()}")
    return 0


def guard_peak(cfg, spec, timeout_s: float) -> int:
    """The peak measure's RAM guard compares: the kept fit's, else a simulation of the point in a child."""
    block = estimate_block(cfg, spec)
    if block is not None:
        return block["peak_bytes"]
    from dataclasses import asdict

    from ..config import config_to_dict
    from ..runner import run_worker

    progress("simulating the point first (the RAM guard: no fit is kept for this model yet)")
    out = run_worker({"kind": "simulate", "spec": asdict(spec), "config": config_to_dict(cfg)}, timeout_s=timeout_s)
    if out.exit_code == 2:
        raise ConfigError(out.record.get("error", "invalid request"))
    if out.exit_code:
        print(f"planner: simulating the point failed: {out.record.get('error')}", file=sys.stderr)
        raise SystemExit(out.exit_code)
    return out.record["peak_bytes"]


def fit_report_fitted(cfg, spec, budget: int, batch_given: bool, args) -> dict:
    """planner.fit.fit_report's record for a fitted model: the largest batch (or, with a batch, the longest
    sequence) that fits, answered from the fit (made first if none is kept); no advice (the formula families'
    changes are not modelled here)."""
    import dataclasses

    from ..fit import cuda_context_bytes, tensor_budget
    from ..fitted import fitted_model

    def on_point(p, done, total):
        _say(args, f"fitting {cfg.model_type}: simulated point {done}/{total}", done / total)

    what, path, cached, info = fitted_model(cfg, spec, on_point, refit=False)
    rec: dict = {"budget_bytes": budget, "cuda_context_bytes": cuda_context_bytes(spec.device),
                 "basis": "fitted simulation"}
    usable = tensor_budget(budget, spec.device, spec.checkpointing)
    if batch_given:
        rec["max_seq_len"], rec["reason"] = what.max_seq(spec.batch_size, usable, cfg.max_seq_len)
        target = spec
    else:
        rec["max_batch_size"], rec["reason"] = what.max_batch(spec.seq_len, usable)
        target = dataclasses.replace(spec, batch_size=max(1, rec["max_batch_size"]))
    rec["run"] = dataclasses.asdict(target)
    rec["peak_bytes"] = what.peak_bytes(target.batch_size, target.seq_len)
    rec["fits"] = rec["peak_bytes"] <= usable
    rec.update(status=what.status, bound_bytes=what.bound_bytes, fit_file=str(path), fit_cached=cached, advice=[])
    return rec
