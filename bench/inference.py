"""`python -m planner bench inference [--quick] [--out docs/accuracy.md]`: generate()'s peak, estimated
(planner.estimate.inference) against measured (planner.measure.inference, live bytes) and simulated on fake
tensors (planner.measure.simulate_infer), on every family's tiny grid configs x cache x precision x attention;
then full size: presets at serving settings, the formula against the simulation. The grid's rows run in one
child process (each builds its own model); each full-size row in a fresh child (planner.runner.run_worker); no
torch in this process.
"""
from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import platform
import subprocess
import sys

from .common import _torch_version, _version, write_section
from planner.config import PRESETS, config_to_dict
from planner.infer_spec import InferSpec, check_infer

BAR_PCT = 1.0
NEW_TOKENS = 4
# Families whose block the estimate models (planner/arch/decoder.py RMSDecoder.infer_*); the others are measured
# and simulated, their estimate refused with a line saying so.
GRID_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gpt2-hf", "gpt2")
# the sliding, quantized and offloaded caches have their own grid (bench/infer_caches.py)
GRID_CACHES = ("dynamic", "static", "none")
FULL_SIZE_ROWS = [
    ("llama-3-8b", InferSpec(8, 4096, 16, precision="bf16")),
    ("llama-3.1-8b", InferSpec(8, 32000, 16, precision="bf16")),
    ("llama-3.1-8b", InferSpec(1, 32000, 16, precision="bf16", cache="static")),
    ("mistral-7b-v0.1", InferSpec(4, 4000, 16, precision="bf16")),
    ("qwen2.5-7b", InferSpec(4, 8192, 16, precision="bf16")),
    ("qwen3-8b", InferSpec(4, 8192, 16, precision="bf16")),
    ("llama-3.2-1b", InferSpec(16, 8192, 16, precision="bf16")),
    # the book's GPT-2, generate_text_simple: the whole context recomputed per token (its own attention, eager)
    ("gpt2-small", InferSpec(4, 1000, 24, precision="bf16", cache="none")),
    ("gpt2-xl", InferSpec(1, 1000, 24, precision="bf16", cache="none")),
]


def grid_rows(quick: bool, family: str | None = None):
    """(family, config label, config, InferSpec) of the grid; `family`: only that family's rows."""
    from planner.arch import families

    precs = ("fp32", "bf16") if not quick else ("fp32",)
    for name in GRID_FAMILIES:
        fam = families().get(name)
        if fam is None or (family is not None and name != family):
            continue
        configs = fam.grid_configs()[: (1 if quick else None)]
        if not configs and fam.source == "book":
            configs = [("V97 h32 a2 L2 ctx64 b2 s16", fam.config_cls(vocab_size=97, context_length=64, emb_dim=32,
                                                                     n_heads=2, n_layers=2), 2, 16)]
        for label, cfg, b, s in configs:
            if getattr(cfg, "sliding_window", None) is not None:  # windows shorter than the run: bench inference-caches
                cfg = dataclasses.replace(cfg, sliding_window=None) if name != "gemma2" else dataclasses.replace(
                    cfg, sliding_window=4096)
            for att, prec, cache in itertools.product(fam.attention_kinds(cfg) if hasattr(cfg, "attention") else
                                                      ("eager",), precs, [c for c in fam.infer_caches(cfg) if c in GRID_CACHES]):
                c = dataclasses.replace(cfg, attention=att) if hasattr(cfg, "attention") else cfg
                ispec = InferSpec(b, s, NEW_TOKENS, precision=prec, cache=cache)
                try:
                    check_infer(c, ispec)
                except Exception:  # noqa: BLE001
                    continue
                yield name, label, c, ispec


def _child(kind, cfg, ispec, timeout_s=600):
    from planner.runner import run_worker

    out = run_worker({"kind": kind, "config": config_to_dict(cfg), "spec": ispec.to_dict()}, timeout_s=timeout_s)
    return out.record if out.exit_code == 0 else {"error": out.record.get("error") or out.stderr[-300:]}


def _estimate(cfg, ispec):
    from planner.config import ConfigError
    from planner.estimate.inference import estimate_inference

    try:
        return estimate_inference(cfg, ispec)
    except (NotImplementedError, ConfigError):  # a family the estimate does not model: the row shows —
        return None


def _run_rows(rows: list[dict]) -> None:
    """The inference grids' child (this grid's and bench/infer_caches.py's): measure and simulate each row
    (torch), one JSON line per row on stdout. Each row builds its own model and measures after a warm-up call
    (planner.measure.inference), so rows share no tensors; one child saves the grid a torch / transformers import
    per row."""
    from planner.config import config_from_dict
    from planner.measure.inference import measure_inference
    from planner.measure.simulate_infer import simulate_inference

    for row in rows:
        cfg, ispec = config_from_dict(row["config"]), InferSpec(**row["spec"])
        out = {}
        for kind, fn in (("measure", measure_inference), ("simulate", simulate_inference)):
            try:
                r = fn(cfg, ispec)
                out[kind] = {k: r[k] for k in ("peak_bytes", "peak_phase", "phase_peak_bytes") if k in r}
            except Exception as exc:  # noqa: BLE001
                out[kind] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(json.dumps(out), flush=True)


def grid_records(rows):
    """(measure record, simulate record) per (family, label, config, InferSpec) row, from one child process
    (_run_rows); each record is {"peak_bytes", "peak_phase", "phase_peak_bytes"} or {"error": "<type>: <text>"}."""
    payload = [{"config": config_to_dict(c), "spec": i.to_dict()} for _, _, c, i in rows]
    from . import child_env

    proc = subprocess.Popen([sys.executable, "-m", "bench.inference"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=child_env())
    proc.stdin.write(json.dumps(payload))
    proc.stdin.close()
    for line in proc.stdout:
        r = json.loads(line)
        yield r["measure"], r["simulate"]
    proc.wait()


def run_grid(quick: bool, progress=print, family: str | None = None) -> list[dict]:
    rows = []
    grid = list(grid_rows(quick, family))
    for (name, label, cfg, ispec), (m, s) in zip(grid, grid_records(grid)):
        est = _estimate(cfg, ispec)
        row = {"family": name, "label": label, "attention": getattr(cfg, "attention", "eager"),
               "precision": ispec.precision, "cache": ispec.cache, "measured": m.get("peak_bytes"),
               "phase": m.get("peak_phase"), "simulated": s.get("peak_bytes"),
               "estimated": est["peak_bytes"] if est else None, "error": m.get("error") or s.get("error"),
               "meas_phases": m.get("phase_peak_bytes"), "sim_phases": s.get("phase_peak_bytes"),
               "est_phases": est["phase_peak_bytes"] if est else None}
        if row["measured"] and row["estimated"]:
            row["err_pct"] = 100.0 * (row["estimated"] - row["measured"]) / row["measured"]
        progress(f"{name} {label} {row['attention']} {ispec.precision} {ispec.cache}: {row}")
        rows.append(row)
    return rows


def run_full(progress=print) -> list[dict]:
    rows = []
    for name, ispec in FULL_SIZE_ROWS:
        cfg = PRESETS[name]
        check_infer(cfg, ispec)
        s = _child("simulate-infer", cfg, ispec)
        est = _estimate(cfg, ispec)
        row = {"model": name, "spec": ispec, "simulated": s.get("peak_bytes"), "phase": s.get("peak_phase"),
               "estimated": est["peak_bytes"] if est else None, "est_phase": est["peak_phase"] if est else None,
               "sim_time_s": s.get("sim_time_s"), "error": s.get("error")}
        if row["simulated"] and row["estimated"]:
            row["err_pct"] = 100.0 * (row["estimated"] - row["simulated"]) / row["simulated"]
        progress(f"{name}: {row}")
        rows.append(row)
    return rows


def _fmt(n):
    return f"{n:,}" if isinstance(n, int) else "—"


def _decode_cell(r) -> str:
    """The decode phase's peak, measured, and the estimate's error on it (— without a decode phase or estimate)."""
    m, e = (r.get("meas_phases") or {}).get("decode"), (r.get("est_phases") or {}).get("decode")
    if not m:
        return "— | —"
    return f"{m:,} | " + (f"{100.0 * (e - m) / m:+.2f}%" if e is not None else "—")


def _both_exact(r) -> str:
    """yes: the estimate equals the measurement to the byte in both phases (prefill and decode)."""
    if not r.get("est_phases") or not r.get("meas_phases"):
        return "—"
    return "yes" if all(r["est_phases"].get(ph) == r["meas_phases"].get(ph) for ph in ("prefill", "decode")) else "no"


def markdown(grid: list[dict], full: list[dict], family: str | None = None) -> str:
    today = datetime.date.today().isoformat()
    which = (f"`--family {family}`: only that family's rows. " if family else "")
    lines = ["# Inference: generate()'s peak (issue #21)", "",
             f"`python -m planner bench inference` ({today}; torch {_torch_version()}, transformers "
             f"{_version('transformers')}, {platform.machine()}). transformers' `generate(max_new_tokens={NEW_TOKENS}, "
             f"min_new_tokens={NEW_TOKENS}, do_sample=False)` (the book's GPT-2: `generate_text_simple`) on tiny configs; "
             "measured = live tensor bytes (weights and prompt included), simulated = the same call on fake tensors, "
             "estimated = planner/estimate/inference.py. Sliding windows are set beyond the run here; windows shorter "
             "than the run (`--cache sliding`), the quantized and the offloaded caches have their own section "
             "(`bench inference-caches`). A family without an estimate shows —. The peak columns are the call's peak "
             "(its phase named); `decode B` is the measured peak of the decode phase (the second forward on) and "
             "`decode error` the estimate's `phase_peak_bytes[\"decode\"]` against it; `both phases exact`: the estimate "
             f"equals the measurement to the byte in the prefill and in the decode phase. {which}", "",
             "| family | config | attention | precision | cache | phase | measured B | simulated B | sim = meas | "
             "estimated B | error | decode B | decode error | both phases exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in grid:
        same = "yes" if r["measured"] is not None and r["measured"] == r["simulated"] else (
            "—" if r["measured"] is None else f"{r['simulated'] - r['measured']:+,} B" if r["simulated"] else "fails")
        err = f"{r['err_pct']:+.2f}%" if "err_pct" in r else "—"
        lines.append(f"| {r['family']} | {r['label']} | {r['attention']} | {r['precision']} | {r['cache']} | "
                     f"{r['phase'] or r['error'] or ''} | {_fmt(r['measured'])} | {_fmt(r['simulated'])} | {same} | "
                     f"{_fmt(r['estimated'])} | {err} | {_decode_cell(r)} | {_both_exact(r)} |")
    errs = [abs(r["err_pct"]) for r in grid if "err_pct" in r]
    within = sum(e <= BAR_PCT for e in errs)
    exact = sum(1 for r in grid if r["measured"] is not None and r["measured"] == r["simulated"])
    dec = [abs(100.0 * (r["est_phases"]["decode"] - r["meas_phases"]["decode"]) / r["meas_phases"]["decode"])
           for r in grid if r.get("est_phases") and (r.get("meas_phases") or {}).get("decode")]
    both = sum(_both_exact(r) == "yes" for r in grid)
    lines += ["", f"Estimated rows: {len(errs)}, within {BAR_PCT}%: {within}; worst |error| "
                  f"{max(errs):.2f}%." if errs else "",
              (f"Decode phase: {len(dec)} rows, within {BAR_PCT}%: {sum(e <= BAR_PCT for e in dec)}, worst |error| "
               f"{max(dec):.3f}%; both phases exact to the byte: {both} of {len(errs)}.") if dec else "",
              f"Simulated = measured to the byte: {exact} of {len(grid)}.", ""]
    if full:
        lines += ["## Full size: formula against simulation", "",
                  "| model | batch | prompt | new | precision | cache | simulated peak | phase | estimated | error | "
                  "sim time |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in full:
            s = r["spec"]
            err = f"{r['err_pct']:+.2f}%" if "err_pct" in r else "—"
            sim = f"{r['simulated'] / 2**30:.2f} GiB" if r["simulated"] else (r["error"] or "")[:80]
            est = f"{r['estimated'] / 2**30:.2f} GiB" if r["estimated"] else "—"
            t = f"{r['sim_time_s']:.0f} s" if r.get("sim_time_s") else ""
            lines.append(f"| {r['model']} | {s.batch_size} | {s.prompt_len} | {s.new_tokens} | {s.precision} | {s.cache} | "
                         f"{sim} | {r['phase'] or ''} | {est} | {err} | {t} |")
    return "\n".join(lines) + "\n"


def main(quick: bool = False, out: str | None = None, progress=print, family: str | None = None) -> int:
    """`family`: only that family's grid rows (and no full-size rows)."""
    grid = run_grid(quick, progress, family)
    full = [] if quick or family else run_full(progress)
    text = markdown(grid, full, family)
    print(text)
    if out:
        write_section(out, text)
    return 0


if __name__ == "__main__":  # the grid's child (run_grid): rows as JSON on stdin
    _run_rows(json.loads(sys.stdin.read()))
