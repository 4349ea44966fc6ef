"""User modules (issue #20): simulate against measure, to the byte, and the what-if fit's held-out check.

    python -m planner bench modules [--quick] [--out docs/accuracy.md]

The modules are the files in examples/ (a CNN with BatchNorm run with --input-shape, a ViT-like patch model and a
tabular MLP with one-argument make_batch, a text model fed token ids), each at fp32 and bf16-AMP (the full grid adds
pure bf16 and fp16-AMP). Each row measures the real step (planner.measure.training with the module) and simulates it
(planner.measure.simulate), both in fresh child processes, as `measure train --module` and `simulate train --module`
run them, and compares the peaks and every phase's peak. The second table fits each module's what-if at each
precision (planner.whatif: the basis the data call for, checked on held-out points) and answers a point outside
the fitted range, against a fresh simulation there.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from planner.spec import TrainSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# (label, file, input shape or None, batch, seq): seq 1 for a model without a sequence axis
MODULES = [
    ("CNN + BatchNorm (--input-shape 3x32x32)", "cnn.py", (3, 32, 32), 8, 1),
    ("ViT-like patches (make_batch(batch))", "vit.py", None, 4, 1),
    ("tabular MLP (make_batch(batch), loss_fn)", "mlp.py", None, 32, 1),
    ("text LM (token ids)", "text_lm.py", None, 3, 40),
]
QUICK_PRECISIONS = ("fp32", "bf16-amp")
PRECISIONS = ("fp32", "bf16-amp", "bf16", "fp16-amp")
# (b, s) the what-if table answers, outside every fit's points: a sequence model's and a batch-only model's
WHATIF_QUERY = {True: (12, 96), False: (24, 1)}


def module_grid(quick: bool = False) -> list[tuple[str, tuple, TrainSpec]]:
    from planner.module_ref import module_tuple

    rows = []
    for i, (label, file, shape, b, s) in enumerate(MODULES):
        for j, precision in enumerate(QUICK_PRECISIONS if quick else PRECISIONS):
            optimizer = ("adamw", "sgd-momentum")[(i + j) % 2]
            rows.append((f"{label} {precision} {optimizer}", module_tuple(EXAMPLES / file, "make_model", shape),
                         TrainSpec(batch_size=b, seq_len=s, precision=precision, optimizer=optimizer)))
    return rows


def run_row(module: tuple, spec: TrainSpec, in_process: bool = False) -> dict:
    """The module's step measured and simulated: {measured, simulated, phase peaks of both, diff}."""
    if in_process:
        from planner.measure.simulate import simulate_training
        from planner.measure.training import measure_training

        meas = measure_training(None, spec, module=module)
        sim = simulate_training(None, spec, module=module)
    else:
        from planner.runner import run_worker

        outs = [run_worker({"spec": asdict(spec), "module": list(module)}, timeout_s=600),
                run_worker({"kind": "simulate", "spec": asdict(spec), "module": list(module)}, timeout_s=600)]
        for o in outs:
            if o.exit_code:
                raise RuntimeError(f"{module}: {o.record.get('error')}")
        meas, sim = outs[0].record, outs[1].record
    phases = {p: sim["phase_peak_bytes"][p] - meas["phase_peak_bytes"][p] for p in meas["phase_peak_bytes"]}
    return {"measured_bytes": meas["peak_bytes"], "simulated_bytes": sim["peak_bytes"],
            "diff_bytes": sim["peak_bytes"] - meas["peak_bytes"], "phase_diff_bytes": phases,
            "peak_phase": meas["peak_phase"], "sim_peak_phase": sim["peak_phase"]}


def run_modules(rows, in_process: bool = False, progress=print) -> list[dict]:
    out = []
    for label, module, spec in rows:
        t0 = time.perf_counter()
        r = {"label": label, **run_row(module, spec, in_process)}
        progress(f"{label}: measured {r['measured_bytes']:,} simulated {r['simulated_bytes']:,} "
                 f"({time.perf_counter() - t0:.1f} s)")
        out.append(r)
    return out


def run_whatif(rows, progress=print) -> list[dict]:
    """Each row's module fitted at its precision (every point in one child), then answered outside the fit."""
    from planner.module_ref import fit_points, has_sequence
    from planner.whatif import child_trace, fit_whatif

    out = []
    for label, module, spec in rows:
        shape = module[2] if len(module) > 2 else None
        sequence = has_sequence(Path(module[0]), shape)
        points, holdout = fit_points(sequence)
        t0 = time.perf_counter()
        what = fit_whatif(None, spec, points, module=module, holdout=holdout, sequence=sequence)
        fit_s = time.perf_counter() - t0
        b, s = WHATIF_QUERY[sequence]
        query = TrainSpec(**{**asdict(spec), "batch_size": b, "seq_len": s})
        simulated = max(child_trace(None, query, module)["bytes"])
        fitted = what.peak_bytes(b, s)
        v = what.validation
        out.append({"label": label, "terms": ", ".join(what.fits[0].terms), "status": what.status,
                    "held_out": ", ".join(f"{p[0]}x{p[1]}" for p in v.points),
                    "held_out_error_bytes": v.max_op_error_bytes, "bound_bytes": what.bound_bytes,
                    "query": f"{b}x{s}", "fitted_bytes": fitted, "simulated_bytes": simulated,
                    "error_bytes": fitted - simulated, "fit_s": fit_s})
        progress(f"{label}: {what.describe()}; at {b}x{s} fitted {fitted:,} simulated {simulated:,}")
    return out


def markdown(results: list[dict], whatif: list[dict]) -> str:
    from .common import _cpu_count, _torch_version, _version

    worst = max(abs(r["diff_bytes"]) for r in results)
    worst_phase = max(abs(d) for r in results for d in r["phase_diff_bytes"].values())
    lines = ["# Your own module: simulate vs measure, and the what-if's held-out check (cpu)", "",
             f"torch {_torch_version()}, transformers {_version('transformers')}, {_cpu_count()} CPUs. Written by "
             "`python -m planner bench modules` (bench/modules.py); the modules are the files in `examples/`. "
             "Each row is the real step measured in a child (`measure train --module`) and the same step simulated on "
             "fake tensors in another (`simulate train --module`).", "",
             f"Worst |simulated - measured| peak: **{worst:,} B**; worst phase peak difference: **{worst_phase:,} B** "
             "(bar: 0, to the byte).", "",
             "| module and run | measured peak (B) | simulated peak (B) | diff (B) | phase peaks, largest diff (B) | peak phase |",
             "|---|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['label']} | {r['measured_bytes']:,} | {r['simulated_bytes']:,} | {r['diff_bytes']:,} | "
                     f"{max(abs(d) for d in r['phase_diff_bytes'].values()):,} | {r['peak_phase']} |")
    lines += ["", "Found on the way (issue #20): under bf16 autocast a BatchNorm after a convolution gets a bf16 input "
              "and fp32 parameters; the CPU kernel then keeps its saved mean and inverse std in fp32 where the fake "
              "kernel kept bf16 (also LayerNorm's and GroupNorm's statistics, and GroupNorm's backward input "
              "gradient). The simulator now returns the CPU kernels' dtypes (planner/measure/cpu_kernels.py); before, "
              "the forward, loss and backward phase peaks of examples/cnn.py at bf16-AMP simulated 448 B low (2 x 2 x C bytes per "
              "BatchNorm of C channels: 16 + 32 + 64), the issue's 192 B on a 16 + 32 channel CNN. And "
              "nn.TransformerEncoder deep-copies its layer: copied fake tensors belonged to a copy of the fake mode, "
              "so every view of a copied weight was counted again (the ViT's fp32 step simulated 393,216 B high); "
              "the simulation now adopts them (planner/measure/simulate.py adopt_fake_tensors).", ""]
    if whatif:
        worst_fit = max(abs(r["error_bytes"]) for r in whatif)
        lines += ["## What-if fits: the basis the data call for, the held-out check, and a point outside the fit", "",
                  "Each module's what-if (`simulate whatif --module`, planner/whatif.py) fitted at the run's settings; "
                  "the basis is the smallest set of terms that reproduces every op at every fitted point; the held-out "
                  "points are simulated and never fitted. Then a point outside the fitted range is answered from the "
                  f"fit and simulated fresh. Worst |fitted - simulated| there: **{worst_fit:,} B**.", "",
                  "| module and run | basis | held-out points | held-out error (B) | status | query | fitted (B) | "
                  "simulated (B) | error (B) | fit time (s) |", "|---|---|---|---:|---|---|---:|---:|---:|---:|"]
        for r in whatif:
            lines.append(f"| {r['label']} | {r['terms']} | {r['held_out']} | {r['held_out_error_bytes']:,.0f} | "
                         f"{r['status']} | {r['query']} | {r['fitted_bytes']:,} | {r['simulated_bytes']:,} | "
                         f"{r['error_bytes']:,} | {r['fit_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(quick: bool = False, out: str | None = None) -> int:
    from .common import write_section

    rows = module_grid(quick)
    results = run_modules(rows, progress=lambda line: print(line, flush=True))
    whatif = run_whatif(rows, progress=lambda line: print(line, flush=True))
    text = markdown(results, whatif)
    print(text)
    if out:
        write_section(out, text)
    worst = max(abs(r["diff_bytes"]) for r in results)
    print(f"worst |simulated - measured| {worst:,} B ({'meets' if worst == 0 else 'MISSES'} the bar of 0 B)")
    return 0
