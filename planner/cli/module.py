"""`--module FILE.py:FUNCTION` on `estimate train` and `measure train` (no torch here; planner/cli/simulate.py has
simulate's). Issue #20: a user's own model is measured, and estimated from its what-if fit.

    python -m planner estimate train --module my_model.py:make_model --batch-size 8 [--seq-len 512 | --input-shape 3x224x224] RUN [--json] [--progress] [--refit]
    python -m planner measure  train --module my_model.py:make_model --batch-size 8 [--seq-len 512 | --input-shape 3x224x224] RUN --device cpu [--json] [--progress]

estimate: answered from the module's what-if fit (planner.whatif), made once per file contents and settings (every
point simulated in one child: progress per point) and kept in the data folder; the record says
`"basis": "fitted simulation"`, the fit's basis and held-out check, and `bound_bytes` when the fit is not exact.
measure: the real step in a child (planner.routines.user_module.ModuleTrainingStep, the step `simulate --module`
runs on fake tensors), after a simulation of the same point in a child: the RAM guard, and the record's
`estimate` block (`"basis": "simulation"`), so simulate and measure compare number to number.
Both RUN as simulate --module's: --checkpointing, --attention, --loss, LoRA and --train-layers belong in the
module's own code (refused here, exit 2).
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

from .args import EXIT_INVALID, progress
from ..config import ConfigError
from ..units import fmt_bytes

ESTIMATE_MODULE_KEYS = ["peak_bytes", "peak_phase", "peak_op", "status", "bound_bytes"]


def add_module_args(p) -> None:
    """--module and --input-shape (simulate, estimate and measure train)."""
    if not any(a.dest == "module" for a in p._actions):
        p.add_argument("--module", metavar="FILE.py:FUNCTION",
                       help="your own model: FUNCTION() returns an nn.Module (this imports and runs your code; "
                            "default: none, give --model or --config instead)")
    p.add_argument("--input-shape", metavar="CxHxW",
                   help="with --module, a model without a sequence (images, tabular): one sample's shape, e.g. "
                        "3x224x224; inputs are randn(batch, *shape), targets class ids of the output's last "
                        "dimension; --seq-len is then not needed (default: none: token ids (batch, seq), or make_batch)")


def parse_module_run(args) -> tuple:
    """(spec, module tuple) for --module; ConfigError (exit 2) for what a module run cannot take."""
    from ..module_ref import parse_module_ref
    from ..module_ref import has_sequence, module_tuple, parse_input_shape
    from ..spec import TrainSpec, check_device

    if args.model or args.config:
        raise ConfigError("give either --module or --model/--config, not both")
    if args.checkpointing:
        raise ConfigError("--checkpointing applies to presets and configs; with --module, apply checkpointing "
                          "inside your model")
    if args.attention:
        raise ConfigError("--attention applies to presets and configs; with --module, choose attention in your model")
    if args.lora_r is not None or args.train_layers != "all" or getattr(args, "quantize_base", None):
        raise ConfigError("--lora-r, --quantize-base and --train-layers apply to presets and configs; with --module, "
                          "freeze or wrap your model inside make_model")
    if getattr(args, "loss", "default") != "default":
        raise ConfigError("--loss applies to presets and configs; with --module, define loss_fn(output, targets) "
                          "in your file")
    if getattr(args, "offload_activations", False) or getattr(args, "offload_optimizer", False):
        raise ConfigError("--offload-activations and --offload-optimizer apply to presets and configs (their terms "
                          "are a family's); with --module, wrap your step in torch.autograd.graph.save_on_cpu yourself")
    path, func = parse_module_ref(args.module)
    shape = parse_input_shape(getattr(args, "input_shape", None))
    from ..module_ref import make_batch_arity

    if shape and make_batch_arity(path) is not None:
        raise ConfigError(f"--input-shape replaces make_batch, and {path.name} defines make_batch: give one")
    if args.seq_len is None and has_sequence(path, shape):
        raise ConfigError(f"--seq-len is required: {path.name} has a sequence axis (its make_batch takes "
                          "(batch_size, seq_len), or it has none and gets token ids); give --input-shape for a model "
                          "without one")
    check_device(args.device)
    if args.batch_size is None:
        raise ConfigError("--batch-size is required")
    spec = TrainSpec(batch_size=args.batch_size, seq_len=args.seq_len or 1, precision=args.precision,
                     optimizer=args.optimizer, grad_accum=args.grad_accum, optimizer_impl=args.optimizer_impl,
                     device=args.device)
    from ..bnb import require_bitsandbytes

    require_bitsandbytes(spec.optimizer)
    return spec, module_tuple(path, func, shape)


def _emit_progress(args, stage: str, fraction: float) -> None:
    if args.json and getattr(args, "progress", False):
        print(json.dumps({"event": "progress", "stage": stage, "fraction": fraction}), flush=True)
    elif not args.json:
        progress(stage)


def fit_failure(exc: RuntimeError) -> int:
    """A point's simulation failed: exit 2 with its line when the module cannot be simulated, else 3."""
    if getattr(exc, "exit_code", EXIT_INVALID) == EXIT_INVALID:
        raise ConfigError(str(exc)) from None
    print(f"planner: {exc}", file=sys.stderr)
    return 3


def cmd_estimate_module(args) -> int:
    from ..module_ref import module_fit, module_label
    from ..whatif import MisalignedError

    spec, module = parse_module_run(args)

    def on_point(p, done, total):
        _emit_progress(args, f"fitting the what-if: simulated b={p[0]} s={p[1]} ({done}/{total})", done / total)

    try:
        what, path, cached, seconds = module_fit(module, spec, on_point, timeout_s=args.timeout,
                                                 refit=getattr(args, "refit", False))
    except MisalignedError as exc:
        raise ConfigError(str(exc)) from None
    except RuntimeError as exc:
        return fit_failure(exc)
    try:
        ans = what.answer(spec.batch_size, spec.seq_len)
        phases = what.phase_peak_bytes(spec.batch_size, spec.seq_len)
    except MisalignedError as exc:  # batch 1 not covered
        raise ConfigError(str(exc)) from None
    rec = {"kind": "estimate", "basis": "fitted simulation", "module": module_label(module), "run": asdict(spec),
           "sequence": what.has_seq, **ans, "phase_peak_bytes": phases, "fit": what.to_dict(), "fit_file": str(path),
           "fit_cached": cached, "fit_time_s": seconds}
    if args.json:
        print(json.dumps(rec))
        return 0
    where = f"batch {spec.batch_size}" + (f", seq {spec.seq_len}" if what.has_seq else "")
    bound = "" if what.exact else (f" (APPROXIMATE: +/- {what.bound_bytes:,} B)" if what.bound_bytes is not None
                                   else " (unvalidated)")
    print(f"fitted peak at {where}: {fmt_bytes(ans['peak_bytes'])} ({ans['peak_bytes']:,} B){bound} in "
          f"{ans['peak_phase']} (op {ans['peak_op']})")
    print("phase peaks: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in phases.items()))
    print(f"from the what-if fit ({'kept' if cached else f'made in {seconds:.1f} s'}): {what.describe()}")
    return 0


def cmd_measure_module(args) -> int:
    from ..api import check_ram_guard
    from .paths import export_paths
    from ..module_ref import module_label
    from ..runner import run_worker

    spec, module = parse_module_run(args)
    from . import parallel as cli_parallel

    if cli_parallel.parallel_requested(args):
        raise ConfigError("--module with --world-size / --parallel is not available yet")
    exports = export_paths(args)
    _emit_progress(args, "simulating the point first (the RAM guard)", 0.02)
    sim = run_worker({"kind": "simulate", "spec": asdict(spec), "module": list(module)}, timeout_s=args.timeout)
    if sim.exit_code == EXIT_INVALID:
        raise ConfigError(sim.record.get("error", "invalid request"))
    if sim.exit_code:
        print(f"planner: simulating the point failed: {sim.record.get('error')}", file=sys.stderr)
        return sim.exit_code
    est = {"basis": "simulation", **{k: sim.record[k] for k in ("peak_bytes", "peak_phase", "phase_peak_bytes",
                                                                "persistent_bytes", "optimizer_bytes")}}
    if spec.device_type == "cpu":
        check_ram_guard(est["peak_bytes"], "the simulated peak")
    payload = {"spec": asdict(spec), "module": list(module)}
    if exports:
        payload["exports"] = exports
    if args.memory_limit:
        from ..units import parse_size

        try:
            payload["memory_limit_bytes"] = parse_size(args.memory_limit)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def on_event(event: dict) -> None:
        if event.get("event") == "progress":
            _emit_progress(args, f"measuring: {event.get('stage')}", float(event.get("fraction", 0)))

    outcome = run_worker(payload, timeout_s=args.timeout, on_event=on_event)
    if outcome.exit_code == EXIT_INVALID:
        raise ConfigError(outcome.record.get("error", "invalid request"))
    rec = {k: v for k, v in outcome.record.items() if k != "event"}
    rec["module"] = module_label(module)
    rec["run"] = asdict(spec)
    rec["estimate"] = est
    if outcome.exit_code == 0:
        rec["error_pct"] = 100.0 * (est["peak_bytes"] - rec["peak_bytes"]) / rec["peak_bytes"]
    else:
        rec.setdefault("stderr_tail", outcome.stderr[-1500:])
    if args.json:
        print(json.dumps(rec))
    elif outcome.exit_code == 0:
        print(f"measured peak {fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes']:,} B) in {rec['peak_phase']}; "
              f"simulated {est['peak_bytes']:,} B ({rec['error_pct']:+.4f}%)")
        print(f"peak RSS {fmt_bytes(rec['peak_rss_bytes'])}; step time {rec['step_time_s']:.3f} s")
    else:
        print(f"measurement failed in phase {rec.get('phase')}: {rec['error']}", file=sys.stderr)
    return outcome.exit_code
