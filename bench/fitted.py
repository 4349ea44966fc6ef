"""Any family by config.json (issue #20): the fitted estimate against measurement, and at full size against the
full simulation, with the first answer's and a query's time.

    python -m planner bench fitted [--quick] [--out docs/accuracy.md]      (the accuracy section; with --out, the
                                                                           timings section into speed.md beside it)
    python -m planner bench fitted-speed [--quick] [--out docs/speed.md]   (the timings section alone)

Tiny rows: tests/data/configs/*-tiny.json (OLMo 2, Granite, Phi-2, Cohere, SmolLM3: model types no family file
reads), each at two precisions: the real step measured in a child (`measure train --config`), simulated in another,
and estimated from a fit made for it (`estimate train --config`: every point simulated in two children at once). Full-size
rows: examples/configs/ (published-style configs), first answer timed from nothing (the fit made again, in a child,
as `estimate train` makes it), then the fitted peak against a full simulation at two points, and a query's time.
"""
from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

from planner.spec import TrainSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ["olmo2-tiny", "granite-tiny", "phi-tiny", "cohere-tiny", "smollm3-tiny"]
TINY_RUNS = [("fp32", "adamw", 3, 40), ("bf16-amp", "sgd-momentum", 2, 96)]
FULL = ["olmo2-7b", "granite-3-8b", "smollm3-3b", "phi-2", "command-r"]
FULL_SPEC = TrainSpec(batch_size=1, seq_len=2048, precision="bf16-amp", optimizer="adamw")
FULL_CHECKS = [(1, 2048), (4, 4096)]
FITTED_BAR_PCT = 1.0  # issue #20: the fitted estimate within 1% of measurement
SOLVE_FACTOR = 2  # the fit solver's timed query: the largest batch at s=2048 within twice the 1x2048 peak (a
# budget every model has an answer in: a 7B model's bf16-AMP AdamW step needs ~112 GiB before its activations)


def _child(kind: str, cfg, spec: TrainSpec) -> dict:
    from planner.config import config_to_dict
    from planner.runner import run_worker

    payload = {"config": config_to_dict(cfg), "spec": asdict(spec)}
    if kind == "simulate":
        payload["kind"] = "simulate"
    out = run_worker(payload, timeout_s=1200)
    if out.exit_code:
        raise RuntimeError(f"{kind} failed: {out.record.get('error')}")
    return out.record


def run_tiny(quick: bool = False, progress=print) -> list[dict]:
    from planner.config import load_config
    from planner.fitted import fitted_model

    rows = []
    for i, name in enumerate(TINY):
        cfg = load_config(ROOT / "tests" / "data" / "configs" / f"{name}.json")
        for j, (precision, optimizer, b, s) in enumerate(TINY_RUNS):
            if quick and (i + j) % 2:
                continue
            spec = TrainSpec(b, s, precision, optimizer)
            meas, sim = _child("measure", cfg, spec), _child("simulate", cfg, spec)
            t0 = time.perf_counter()
            what, _, _, info = fitted_model(cfg, spec, refit=True)
            fit_s = time.perf_counter() - t0
            est = what.peak_bytes(b, s)
            rows.append({"label": f"{cfg.model_type} ({name}) {precision} {optimizer} b{b} s{s}",
                         "measured": meas["peak_bytes"], "simulated": sim["peak_bytes"], "fitted": est,
                         "error_pct": 100.0 * (est - meas["peak_bytes"]) / meas["peak_bytes"], "status": what.status,
                         "terms": ", ".join(what.fits[0].terms), "fit_s": fit_s, "simulations": info["simulations"]})
            progress(f"{rows[-1]['label']}: measured {meas['peak_bytes']:,} simulated {sim['peak_bytes']:,} "
                     f"fitted {est:,} ({what.status}, {fit_s:.1f} s)")
    return rows


def run_full(quick: bool = False, progress=print) -> list[dict]:
    """First answer from nothing (a child, as `estimate train` runs it: the fit made again), its check, and the
    fitted peak against a full simulation at FULL_CHECKS; a query's time in this process."""
    from planner.config import load_config
    from planner.fitted import fitted_model

    rows = []
    for name in FULL[:2] if quick else FULL:
        cfg = load_config(ROOT / "examples" / "configs" / f"{name}.json")
        t0 = time.perf_counter()
        what, _, _, info = fitted_model(cfg, FULL_SPEC, refit=True)
        first_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        n = 200
        for k in range(n):
            what.peak_bytes(1 + k % 8, 512 + 7 * k)
        query_ms = 1000 * (time.perf_counter() - t1) / n
        t2 = time.perf_counter()
        longest, _ = what.max_batch(2048, SOLVE_FACTOR * what.peak_bytes(1, 2048))  # a bisection over the batch
        solve_ms = 1000 * (time.perf_counter() - t2)
        checks = []
        for b, s in FULL_CHECKS[:1] if quick else FULL_CHECKS:
            sim = _child("simulate", cfg, replace(FULL_SPEC, batch_size=b, seq_len=s))
            checks.append({"point": f"{b}x{s}", "fitted": what.peak_bytes(b, s), "simulated": sim["peak_bytes"]})
        depth = info.get("depth")
        rows.append({"label": cfg.name or name, "model_type": cfg.model_type, "layers": cfg.layers,
                     "params": info.get("param_count"), "depth": depth, "first_s": first_s,
                     "simulate_s": info.get("simulate_s"), "simulations": info["simulations"], "status": what.status,
                     "bound": what.bound_bytes, "terms": ", ".join(what.fits[0].terms), "query_ms": query_ms,
                     "solve_ms": solve_ms, "longest": longest, "checks": checks})
        progress(f"{name}: first answer {first_s:.1f} s ({info['simulations']} simulations), {what.describe()}; "
                 + "; ".join(f"{c['point']} fitted {c['fitted']:,} simulated {c['simulated']:,}" for c in checks))
    return rows


def _header(title: str) -> list[str]:
    from .common import _cpu_count, _torch_version, _version

    return [title, "", f"torch {_torch_version()}, transformers {_version('transformers')}, {_cpu_count()} CPUs "
            "(shared with other work: timings are a loaded machine's)."]


def accuracy_markdown(tiny: list[dict], full: list[dict]) -> str:
    worst = max(abs(r["error_pct"]) for r in tiny)
    worst_sim = max(abs(r["simulated"] - r["measured"]) for r in tiny)
    lines = _header("# Any family by config.json: fitted estimate vs measurement (cpu)") + [
        "", "Written by `python -m planner bench fitted` (bench/fitted.py). A config.json whose `model_type` "
        "transformers' AutoModelForCausalLM builds and no family file reads (planner/arch/auto.py) is simulated and "
        "measured as transformers' own model and estimated from a fit of simulations (planner/fitted.py; every record "
        "says `\"basis\": \"fitted simulation\"`). Each row: the real step measured in a child, simulated in another, "
        "and the fitted estimate (its fit made for the row, every point simulated in two children at once; checked on held-out "
        "points).", "",
        f"Worst |fitted - measured|: **{worst:.4f}%** (bar: {FITTED_BAR_PCT}%); worst |simulated - measured|: "
        f"**{worst_sim:,} B**.", "",
        "| model and run | measured (B) | simulated (B) | fitted estimate (B) | error | fit | basis | simulations | fit time (s) |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in tiny:
        lines.append(f"| {r['label']} | {r['measured']:,} | {r['simulated']:,} | {r['fitted']:,} | {r['error_pct']:+.4f}% | "
                     f"{r['status']} | {r['terms']} | {r['simulations']} | {r['fit_s']:.1f} |")
    if full:
        worst_full = max(abs(c["fitted"] - c["simulated"]) for r in full for c in r["checks"])
        lines += ["", "## Full size: the fitted estimate against the full simulation", "",
                  f"{FULL_SPEC.precision}, {FULL_SPEC.optimizer}. Published-style configs (examples/configs/). A deep "
                  "model is simulated at full width with 2, 3 and 4 units of layers (a unit: the layer-type period, "
                  "4 for SmolLM3's no-RoPE layers) and extrapolated to its depth (planner/whatif_depth.py), checked "
                  "op by op at held-out points simulated at full depth. Worst |fitted - full simulation|: "
                  f"**{worst_full:,} B**.", "",
                  "| model | model_type | layers | parameters (simulated) | depth fit | fit check | point | fitted (B) | full simulation (B) | diff (B) |",
                  "|---|---|---:|---:|---|---|---|---:|---:|---:|"]
        for r in full:
            d = r["depth"]
            depth = f"{d['base'] + 2 * d['unit']}, {d['base'] + 3 * d['unit']}, {d['base'] + 4 * d['unit']} layers" if d else "full depth"
            for c in r["checks"]:
                lines.append(f"| {r['label']} | {r['model_type']} | {r['layers']} | {r['params'] or 0:,} | {depth} | "
                             f"{r['status']} | {c['point']} | {c['fitted']:,} | {c['simulated']:,} | "
                             f"{c['fitted'] - c['simulated']:,} |")
    return "\n".join(lines) + "\n"


def speed_markdown(full: list[dict]) -> str:
    lines = _header("# Fitted estimates: first answer and query time (issue #20)") + [
        "", "Written by `python -m planner bench fitted-speed` (bench/fitted.py). The first answer for a model "
        "no family file reads is the fit: every point simulated in two child processes at once (planner/fitted.py "
        "FIT_CHILDREN; torch and transformers imported once in each), then fitted; it is kept on disk, and every later answer (a slider move, the fit solver's bisection) "
        "reads it. Target (issue #20): a 7B-class first answer under 60 s on 2 cores, a query under 1 ms.", "",
        "| model | layers | simulations | first answer (s) | of which simulating (s) | one query (ms) | largest batch at s=2048 in twice the 1x2048 peak | its bisection (ms) | fit check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in full:
        lines.append(f"| {r['label']} | {r['layers']} | {r['simulations']} | {r['first_s']:.1f} | {r['simulate_s']:.1f} | "
                     f"{r['query_ms']:.3f} | {r.get('longest', '')} | {r['solve_ms']:.2f} | {r['status']} |")
    return "\n".join(lines) + "\n"


def main(what: str = "fitted", quick: bool = False, out: str | None = None) -> int:
    from .common import write_section

    say = lambda line: print(line, flush=True)  # noqa: E731
    if what == "fitted":
        tiny = run_tiny(quick, say)
        full = run_full(quick, say)
        text = accuracy_markdown(tiny, full)
        worst = max(abs(r["error_pct"]) for r in tiny)
        print(text)
        print(f"worst |error| {worst:.4f}% ({'meets' if worst <= FITTED_BAR_PCT else 'MISSES'} the {FITTED_BAR_PCT}% bar)")
    else:
        full = run_full(quick, say)
        text = speed_markdown(full)
        print(text)
    if out:
        write_section(out, text)
        if what == "fitted":  # the same full-size runs give the timings: docs/speed.md beside docs/accuracy.md
            write_section(Path(out).parent / "speed.md", speed_markdown(full))
    return 0
