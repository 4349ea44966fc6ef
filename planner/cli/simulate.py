"""`python -m planner simulate train`: the real training step on fake tensors, in a child process (no torch here).

    python -m planner simulate train (--model PRESET | --config FILE.json | --module FILE.py:FUNCTION) RUN
                                     [--device cpu|cuda[:N]] [--json] [--timeout S] [--progress]

RUN is measure train's (--batch-size, --seq-len, --precision, --optimizer, ...). The JSON record is the one
`measure train` prints (peak_bytes, peak_phase, phase_peak_bytes, persistent_bytes, optimizer_bytes, timeline)
with "kind": "simulate", the simulator's cost (sim_time_s, sim_peak_rss_bytes) and, for a preset or config,
the "estimate" block and error_pct, so estimate, simulate and measure compare field by field. The timeline's
x is "op" (the op's index in the step). planner.measure.simulate says how the step's data-dependent reads are answered.

--module runs YOUR code: the file is imported and the function called in the child (planner/routines/
user_module.py says what the file may define). There is no RAM guard: fake tensors allocate nothing.
Exit codes as measure: 2 for what cannot be simulated (one line on stderr), 3 for a timeout or a child that died.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from .args import ESTIMATE_KEYS, EXIT_INVALID, _add_model, _add_run, _estimate_record, parse_train, policy_estimated
from ..config import ConfigError, config_to_dict
from ..spec import WHATIF_HOLDOUT, WHATIF_HOLDOUT_NO_SEQ, WHATIF_POINTS, WHATIF_POINTS_NO_SEQ
from ..units import fmt_bytes
from .paths import export_paths


def add_simulate(top, command) -> None:
    """Add `simulate train` to the top-level subparsers of planner.cli.main.build_parser (`command` adds a
    subcommand with its sentence of help)."""
    sim = command(top, "simulate", "Run the real training step on fake tensors: the exact peak of any model at "
                                   "full size, with no memory used.")
    sub = sim.add_subparsers(dest="what", required=True, parser_class=type(sim), metavar="WHAT")
    p = command(sub, "train", "The training step's peak, phase by phase, simulated in a child process.")
    _add_model(p)
    p.add_argument("--module", metavar="FILE.py:FUNCTION",
                   help="your own model: FUNCTION() returns an nn.Module (this imports and runs your code; "
                        "default: none, give --model or --config instead)")
    _add_run(p, seq_required=False)
    from .module import add_module_args

    add_module_args(p)  # --input-shape
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before the child is killed (exit 3; default: %(default)s)")
    p.add_argument("--progress", action="store_true", help="with --json: JSON progress lines before the result")
    add_export_args(p)
    from . import parallel as cli_parallel

    cli_parallel.add_parallel_args(p)

    from .infer import add_infer

    add_infer(sub, command, "simulate")
    w = command(sub, "whatif", "Fit instant what-ifs: simulate a few small (batch, sequence) points, fit each op's "
                               "live bytes as a polynomial in b and s, and answer any (b, s) from the fit.")
    _add_model(w)
    w.add_argument("--module", metavar="FILE.py:FUNCTION",
                   help="your own model: FUNCTION() returns an nn.Module (this imports and runs your code; "
                        "default: none, give --model or --config instead)")
    _add_run(w, seq_required=False)
    add_module_args(w)  # --input-shape
    w.add_argument("--points", default=None,
                   help="the (batch)x(seq) points simulated for the fit, comma-separated (default: "
                        + ",".join(f"{b}x{s}" for b, s in WHATIF_POINTS) + "; without a sequence axis "
                        + ",".join(f"{b}x{s}" for b, s in WHATIF_POINTS_NO_SEQ) + ")")
    w.add_argument("--holdout", default=None,
                   help="points simulated only to check the fit, never fitted (default: "
                        + ",".join(f"{b}x{s}" for b, s in WHATIF_HOLDOUT) + "; without a sequence axis "
                        + ",".join(f"{b}x{s}" for b, s in WHATIF_HOLDOUT_NO_SEQ) + ")")
    w.add_argument("--out", help="write the fit (every op's coefficients) to this JSON file; default: only with "
                                 "--json, inside the printed record under \"fit\"")
    w.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before each point's child is killed (exit 3; default: %(default)s)")
    w.add_argument("--progress", action="store_true", help="with --json: JSON progress lines before the result")


def add_export_args(p) -> None:
    """--memory-snapshot and --trace (simulate train, measure train): files the child writes (planner.measure.export)."""
    p.add_argument("--memory-snapshot", metavar="FILE.pickle",
                   help="write the step as a torch.cuda.memory._snapshot() pickle (opens at pytorch.org/memory_viz; "
                        "its active-memory peak is peak_bytes); default: none")
    p.add_argument("--trace", metavar="FILE.json",
                   help="write a chrome trace of the step (phases and ops as spans, live bytes as a counter; opens in "
                        "ui.perfetto.dev and chrome://tracing); default: none")


def _points(text: str) -> tuple[tuple[int, int], ...]:
    try:
        pts = tuple((int(b), int(s)) for b, s in (p.strip().lower().split("x") for p in text.split(",") if p.strip()))
    except ValueError:
        raise ConfigError(f"--points must be BxS pairs like 2x16,3x40; got {text!r}") from None
    if any(b < 1 or s < 1 for b, s in pts):
        raise ConfigError(f"--points: batch and sequence must be at least 1; got {text!r}")
    return pts


def cmd_simulate_whatif(args: argparse.Namespace) -> int:
    """Simulate every point in one child (progress: one line per point), fit the basis the points call for, check
    it on the held-out points, and answer the run's (b, s) with how far the answer can be trusted."""
    from .module import fit_failure
    from ..module_ref import fit_points, has_sequence, module_label
    from ..whatif import MIN_POINTS, MisalignedError, fit_whatif

    cfg, spec, module = parse_simulate(args)
    sequence = has_sequence(module[0], module[2] if len(module) > 2 else None) if module else True
    default_points, default_holdout = fit_points(sequence)
    points = _points(args.points) if args.points else default_points
    holdout = _points(args.holdout) if args.holdout else default_holdout
    if sum(b >= 2 for b, _ in points) < MIN_POINTS:  # refused before any child runs (WhatIf.fit says the same)
        raise ConfigError(f"--points: need at least {MIN_POINTS} points with batch >= 2 to fit; "
                          f"got {sum(b >= 2 for b, _ in points)}")
    total = len(points) + len([p for p in holdout if p not in points])
    show_progress = args.json and args.progress
    done: list = []

    def on_point(p):
        done.append(p)
        if show_progress:
            print(json.dumps({"event": "progress", "stage": f"simulated b={p[0]} s={p[1]} ({len(done)}/{total})",
                              "fraction": len(done) / total}), flush=True)

    try:
        what = fit_whatif(cfg, spec, points, module=module, holdout=holdout, sequence=sequence, on_point=on_point,
                          timeout_s=args.timeout)
        ans = what.answer(spec.batch_size, spec.seq_len)
    except MisalignedError as exc:
        raise ConfigError(str(exc)) from None
    except RuntimeError as exc:  # a point's simulation failed: its one line
        return fit_failure(exc)
    summary = what.to_dict()
    rec = {"kind": "whatif", "basis": "fitted simulation",
           "model": module_label(module) if module else config_to_dict(cfg),
           "run": asdict(spec), "points": [list(p) for p in points], "holdout": [list(p) for p in holdout],
           **ans, "phase_peak_bytes": what.phase_peak_bytes(spec.batch_size, spec.seq_len),
           "terms": summary["terms"], "held_out": summary["validation"], "summary": summary}
    if args.out:
        Path(args.out).write_text(json.dumps(what.save_dict()))
        rec["fit_file"] = str(Path(args.out).resolve())
    if args.json:
        if not args.out:
            rec["fit"] = what.save_dict()
        print(json.dumps(rec))
        return 0
    peak, phase, op = ans["peak_bytes"], ans["peak_phase"], ans["peak_op"]
    trust = ("exact at the held-out points" if what.exact else f"APPROXIMATE: +/- {what.bound_bytes:,} B"
             if what.bound_bytes is not None else "UNVALIDATED")
    print(f"fitted peak at batch {spec.batch_size}, seq {spec.seq_len}: {fmt_bytes(peak)} ({peak:,} B), {trust}; "
          f"in {phase} (op {op}); {len(points)} points fitted, {len(holdout)} held out")
    print(what.describe())
    return 0


def parse_simulate(args: argparse.Namespace) -> tuple:
    """(config or None, spec, (path, function) or None) from the parsed arguments."""
    cfg, spec, module = _parse_simulate(args)
    from ..bnb import require_bitsandbytes

    require_bitsandbytes(spec.optimizer)  # the simulating child runs bitsandbytes' optimizer on fake tensors
    return cfg, spec, module


def _parse_simulate(args: argparse.Namespace) -> tuple:
    if not (args.module or args.model or args.config):
        raise ConfigError("give one of --model PRESET, --config FILE.json or --module FILE.py:FUNCTION")
    if args.module:
        from .module import parse_module_run

        spec, module = parse_module_run(args)
        return None, spec, module
    if getattr(args, "input_shape", None):
        raise ConfigError("--input-shape goes with --module (a preset or config is a text model)")
    cfg, spec = parse_train(args)
    from ..finetune import check_quantize_runnable

    check_quantize_runnable(spec)  # QLoRA's simulating child imports bitsandbytes
    from ..estimate.offload import refuse_run

    refuse_run(spec)  # --offload-optimizer: the combinations the estimate refuses (plain-torch equivalent)
    return cfg, spec, None


def _fitted(cfg) -> bool:
    from ..fitted import is_fitted

    return is_fitted(cfg)


def cmd_simulate_train(args: argparse.Namespace) -> int:
    from ..runner import run_worker

    cfg, spec, module = parse_simulate(args)
    payload = {"kind": "simulate", "spec": asdict(spec)}
    exports = export_paths(args)
    if exports:
        payload["exports"] = exports
    if module:
        payload["module"] = list(module)
    else:
        payload["config"] = config_to_dict(cfg)
    show_progress = args.json and args.progress
    outcome = run_worker(payload, timeout_s=args.timeout,
                         on_event=lambda e: print(json.dumps(e), flush=True) if show_progress
                         and e.get("event") == "progress" else None)
    if outcome.exit_code == EXIT_INVALID:
        raise ConfigError(outcome.record.get("error", "invalid request"))
    rec = {"kind": "simulate", **{k: v for k, v in outcome.record.items() if k != "event"}}
    est = None
    if module:
        from ..module_ref import module_label

        rec["module"] = module_label(module)
    elif _fitted(cfg):  # issue #20: the kept fit's answer, if there is one (planner/cli/fitted.py)
        from .fitted import estimate_block

        est = estimate_block(cfg, spec)
        rec["estimate"] = est
    elif policy_estimated(cfg, spec):  # a checkpointing policy not estimated for this run: none
        est = _estimate_record(cfg, spec)
        rec["estimate"] = {k: est[k] for k in ESTIMATE_KEYS + ["phase_peak_bytes", "basis"]}
    if outcome.exit_code == 0 and est is not None:
        rec["error_pct"] = 100.0 * (est["peak_bytes"] - rec["peak_bytes"]) / rec["peak_bytes"]
    elif outcome.exit_code:
        rec.setdefault("stderr_tail", outcome.stderr[-1500:])
    if args.json:
        print(json.dumps(rec))
    elif outcome.exit_code == 0:
        line = f"simulated peak {fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes']:,} B) in {rec['peak_phase']}"
        if est is not None:
            line += f"; estimated {fmt_bytes(est['peak_bytes'])}; error {rec['error_pct']:+.2f}%"
        print(line)
        print(f"persistent {fmt_bytes(rec['persistent_bytes'])}, optimizer state {fmt_bytes(rec['optimizer_bytes'])}; "
              f"phase peaks: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in rec["phase_peak_bytes"].items()))
        if "host_activation_offload_bytes" in rec:  # --offload-activations: the host copies, apart
            print(f"host (offloaded activations) {fmt_bytes(rec['host_activation_offload_bytes'])} "
                  f"({rec['host_activation_offload_bytes']:,} B); {rec['device_figure_note']}")
        if "host_optimizer_offload_bytes" in rec:  # --offload-optimizer: the host copies and states, apart
            print(f"host (offloaded optimizer) {fmt_bytes(rec['host_optimizer_offload_bytes'])} "
                  f"({rec['host_optimizer_offload_bytes']:,} B); {rec['device_figure_note']}")
        print(f"{rec['ops']:,} ops simulated in {rec['sim_time_s']:.1f} s; the simulator's peak RSS "
              f"{fmt_bytes(rec['sim_peak_rss_bytes'])}")
    else:
        print(f"simulation failed in phase {rec.get('phase')}: {rec['error']}", file=sys.stderr)
    return outcome.exit_code
