"""`python -m planner bench inference-caches [--quick] [--out docs/accuracy.md]`: generate()'s peak with the cache
types beyond dynamic and static (issue #21): `sliding` (the configs' own windows, shorter than the run) and
`quantized` (QuantizedCache, fp8 backend), every family that can use the cache x its tiny grid configs x
precision x eager/sdpa; estimated (planner/estimate/inference.py) against measured (live bytes) and simulated (fake
tensors). `offloaded` needs CUDA (planner/estimate/infer_caches.py): its device and host figures are shown for
full-size presets, estimated only, for the CUDA check. The rows run in one child process, the inference grid's
(bench/inference.py grid_records; this one imports no torch); each row builds its own model, so rows do
not share tensors.
"""
from __future__ import annotations

import dataclasses
import datetime
import itertools
import platform

from .common import _torch_version, _version, write_section
from planner.config import PRESETS
from planner.infer_spec import InferSpec, check_infer

BAR_PCT = 1.0
SLIDING_FAMILIES = ("mistral", "phi3", "gemma2")
QUANTIZED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma")
NEW_TOKENS = {"sliding": 16, "quantized": 4}  # sliding: the decode crosses the window from a prompt inside it too
OFFLOADED_ROWS = [("llama-3.1-8b", InferSpec(8, 32000, 256, precision="bf16", cache="offloaded")),
                  ("qwen2.5-7b", InferSpec(4, 30000, 256, precision="bf16", cache="offloaded")),
                  ("llama-3.2-1b", InferSpec(16, 8192, 256, precision="bf16", cache="offloaded"))]


# rows outside the bar, explained (measured with --cache dynamic on the same configs: the same bytes are missing)
OUTSIDE_NOTE = ("Every row outside the bar misses bytes that the dynamic cache's estimate misses on the same config "
                "too (measured: the prompt's forward of Gemma 2 V2000 eager fp32, and of Qwen 3 / Gemma V2000 fp32 "
                "at the RoPE of q): gaps of the family's prefill points, not of the cache's model.")


def grid_rows(quick: bool):
    from planner.arch import families

    precs = ("fp32",) if quick else ("fp32", "bf16")
    for cache, names in (("sliding", SLIDING_FAMILIES), ("quantized", QUANTIZED_FAMILIES)):
        for name in names:
            fam = families()[name]
            configs = fam.grid_configs()[: (1 if quick else (None if cache == "sliding" else 2))]
            for label, cfg, b, s in configs:
                if cache == "quantized" and getattr(cfg, "sliding_window", None) is not None:
                    cfg = dataclasses.replace(cfg, sliding_window=None)  # QuantizedCache: full-attention layers only
                for att, prec in itertools.product(fam.attention_kinds(cfg), precs):
                    c = dataclasses.replace(cfg, attention=att)
                    ispec = InferSpec(b, s, NEW_TOKENS[cache], precision=prec, cache=cache)
                    try:
                        check_infer(c, ispec)
                    except Exception:  # noqa: BLE001
                        continue
                    yield name, label, c, ispec


def _record(m: dict, s: dict) -> dict:
    """A row's measured and simulated figures from the shared child's records (bench/inference.py
    _run_rows): the peak and phase peaks of each, the measured phase (else the simulated one), the last error."""
    out = {}
    for kind, r in (("measured", m), ("simulated", s)):
        if "error" in r:
            out["error"] = f"{kind}: {r['error']}"
        else:
            out[kind], out[kind + "_phases"] = r["peak_bytes"], r["phase_peak_bytes"]
            out.setdefault("phase", r["peak_phase"])
    return out


def run_grid(quick: bool, progress=print) -> list[dict]:
    from planner.estimate.inference import estimate_inference
    from .inference import grid_records

    rows = list(grid_rows(quick))
    out = []
    for (name, label, cfg, ispec), (m, s) in zip(rows, grid_records(rows)):
        r = _record(m, s)
        est = estimate_inference(cfg, ispec)
        row = {"family": name, "label": label, "attention": cfg.attention, "precision": ispec.precision,
               "cache": ispec.cache, "prompt": ispec.prompt_len, "new": ispec.new_tokens,
               "window": getattr(cfg, "sliding_window", None), "measured": r.get("measured"),
               "simulated": r.get("simulated"), "phase": r.get("phase"), "estimated": est["peak_bytes"],
               "est_phases": est["phase_peak_bytes"], "meas_phases": r.get("measured_phases"),
               "error": r.get("error")}
        if row["measured"]:
            row["err_pct"] = 100.0 * (row["estimated"] - row["measured"]) / row["measured"]
        progress(f"{name} {label} {row['attention']} {ispec.precision} {ispec.cache}: {row.get('err_pct')}")
        out.append(row)
    return out


def offloaded_rows() -> list[dict]:
    from planner.estimate.inference import estimate_inference

    out = []
    for name, ispec in OFFLOADED_ROWS:
        cfg = PRESETS[name]
        check_infer(cfg, ispec)
        off = estimate_inference(cfg, ispec)
        dyn = estimate_inference(cfg, dataclasses.replace(ispec, cache="dynamic"))
        out.append({"model": name, "spec": ispec, "device": off["peak_bytes"], "phase": off["peak_phase"],
                    "host": off["host_kv_cache_bytes"], "dynamic": dyn["peak_bytes"]})
    return out


def _fmt(n):
    return f"{n:,}" if isinstance(n, int) else "—"


def markdown(grid: list[dict], offl: list[dict]) -> str:
    today = datetime.date.today().isoformat()
    lines = ["# Inference: sliding-window, quantized and offloaded caches (issue #21)", "",
             f"`python -m planner bench inference-caches` ({today}; torch {_torch_version()}, transformers "
             f"{_version('transformers')}, {platform.machine()}). `sliding`: generate's DynamicCache on the configs' own "
             "sliding windows (32 or 48 tokens, shorter than prompt + new tokens: DynamicSlidingWindowLayer keeps the "
             "prompt's storage, then min(T, w) tokens); `quantized`: `cache_implementation='quantized'`, "
             "`cache_config={'backend': 'fp8'}` (Fp8QuantizedLayer: 1-byte K/V, a scale per tensor; quanto and hqq "
             "are not installed). measured = live tensor bytes of the real call, simulated = the same call on fake "
             "tensors, estimated = planner/estimate/inference.py (planner/arch/infer_windows.py, "
             "planner/estimate/infer_caches.py).", "",
             "| family | config | window | prompt + new | attention | precision | cache | phase | measured B | "
             "simulated B | sim = meas | estimated B | error | both phases exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in grid:
        same = "yes" if r["measured"] is not None and r["measured"] == r["simulated"] else (
            "—" if r["measured"] is None else f"{(r['simulated'] or 0) - r['measured']:+,} B")
        err = f"{r['err_pct']:+.3f}%" if "err_pct" in r else "—"
        both = "yes" if r["meas_phases"] == r["est_phases"] else "no"
        lines.append(f"| {r['family']} | {r['label']} | {r['window'] or '—'} | {r['prompt']} + {r['new']} | "
                     f"{r['attention']} | {r['precision']} | {r['cache']} | {r['phase'] or r['error'] or ''} | "
                     f"{_fmt(r['measured'])} | {_fmt(r['simulated'])} | {same} | {_fmt(r['estimated'])} | {err} | {both} |")
    errs = [abs(r["err_pct"]) for r in grid if "err_pct" in r]
    exact = sum(1 for r in grid if r["measured"] is not None and r["measured"] == r["simulated"])
    lines += ["", (f"Rows: {len(grid)}; estimate within {BAR_PCT}%: {sum(e <= BAR_PCT for e in errs)} of {len(errs)}, "
                   f"worst |error| {max(errs):.3f}%; simulated = measured to the byte: {exact} of {len(grid)}.")
              if errs else "No rows.", ""]
    if any(e > BAR_PCT for e in errs):
        lines += [OUTSIDE_NOTE, ""]
    if offl:
        lines += ["## Offloaded cache (CUDA only): device and host, estimated", "",
                  "transformers' `cache_implementation='offloaded'` (DynamicCache(offloading=True)) calls "
                  "`torch.cuda.default_stream` in Cache.update, which a CPU build refuses: `measure` and `simulate` are "
                  "refused here (exit 2) and the device figure below is for the CUDA check. The device holds the layer "
                  "being updated and the prefetched one; the host every other layer.", "",
                  "| model | batch | prompt | new | precision | device peak (offloaded) | phase | host K/V | "
                  "device peak (dynamic) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in offl:
            s = r["spec"]
            lines.append(f"| {r['model']} | {s.batch_size} | {s.prompt_len} | {s.new_tokens} | {s.precision} | "
                         f"{r['device'] / 2**30:.2f} GiB | {r['phase']} | {r['host'] / 2**30:.2f} GiB | "
                         f"{r['dynamic'] / 2**30:.2f} GiB |")
    return "\n".join(lines) + "\n"


def main(quick: bool = False, out: str | None = None, progress=print) -> int:
    grid = run_grid(quick, progress)
    text = markdown(grid, offloaded_rows())
    print(text)
    if out:
        write_section(out, text)
    return 0
