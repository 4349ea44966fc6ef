"""`python -m planner bench export`: the time and size of a simulated step's profiling exports (issue #22).

Each row simulates a step in a fresh child (planner.runner.run_worker, payload kind "simulate") with
--memory-snapshot and --trace into a temporary folder, then checks here what the files hold: the memory_viz
snapshot's replayed active-memory peak (planner.measure.export.viewer_peak, MemoryViz.js's process_alloc_data)
and the chrome trace's "live bytes" counter maximum, both against the record's peak_bytes. The export time is
the child's own (export_time_s: alive_at_peak, the category timeline and both files), apart from the simulation.
"""
from __future__ import annotations

import json
import pickle
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .common import write_section
from planner.config import PRESETS, GPT2Config, config_to_dict
from planner.spec import TrainSpec

FULL_ROWS = [("llama-3-8b", TrainSpec(1, 4096, "bf16-amp", "adamw")),
             ("llama-3-8b", TrainSpec(1, 4096, "bf16-amp", "adamw", checkpointing=True)),
             ("gpt2-xl", TrainSpec(2, 1024, "fp32", "adamw"))]
QUICK_ROWS = [("tiny gpt2", TrainSpec(2, 32, "fp32", "adamw"))]
TINY = GPT2Config(vocab_size=300, context_length=64, emb_dim=32, n_heads=2, n_layers=2, drop_rate=0.1)


def run_export_bench(rows, timeout_s: float = 600, progress=print) -> list[dict]:
    from planner.measure.export import viewer_peak
    from planner.runner import run_worker

    out = []
    for name, spec in rows:
        cfg = PRESETS.get(name, TINY)
        with tempfile.TemporaryDirectory() as tmp:
            files = {"memory_snapshot": str(Path(tmp) / "step.pickle"), "trace": str(Path(tmp) / "step.json")}
            t0 = time.perf_counter()
            res = run_worker({"kind": "simulate", "config": config_to_dict(cfg), "spec": asdict(spec),
                              "exports": files}, timeout_s=timeout_s)
            wall = time.perf_counter() - t0
            rec = res.record
            if res.exit_code:
                raise RuntimeError(f"{name}: {rec.get('error')}")
            snap = pickle.loads(Path(files["memory_snapshot"]).read_bytes())
            trace = json.loads(Path(files["trace"]).read_text())
            counter = max(e["args"]["bytes"] for e in trace["traceEvents"] if e.get("ph") == "C")
            row = {"name": name, "spec": spec, "ops": rec["ops"], "peak_bytes": rec["peak_bytes"],
                   "viewer_peak": viewer_peak(snap), "counter_peak": counter, "events": rec["export_events"],
                   "snapshot_events": len(snap["device_traces"][0]) - 1,
                   "omitted": snap["planner"]["omitted_allocations"], "export_s": rec["export_time_s"],
                   "sim_s": rec["sim_time_s"], "wall_s": wall, "snapshot_bytes": rec["memory_snapshot_bytes"],
                   "trace_bytes": rec["trace_bytes"], "trace_events": len(trace["traceEvents"])}
            out.append(row)
            progress(f"{name}: {row['export_s']:.2f} s, snapshot {row['snapshot_bytes']:,} B, trace {row['trace_bytes']:,} B")
    return out


def export_markdown(rows: list[dict]) -> str:
    def label(r):
        s = r["spec"]
        return f"{r['name']} b{s.batch_size} s{s.seq_len} {s.precision}{' ckpt' if s.checkpointing else ''} {s.optimizer}"

    lines = ["# Profiling exports: time and size (issue #22)", "",
             f"Date: {time.strftime('%Y-%m-%d')}. Machine: {platform.machine()}, torch "
             f"{__import__('importlib.metadata').metadata.version('torch')}. Command: `python -m planner bench export`.",
             "Each row is `simulate train ... --memory-snapshot step.pickle --trace step.json` in a fresh child. "
             "export s: the child's time for alive_at_peak, the category timeline and both files (apart from the "
             "simulation); viewer peak: the snapshot's active-memory maximum replayed as memory_viz does; counter "
             "peak: the trace's \"live bytes\" maximum. Bounds: at most 200,000 snapshot events (the smallest "
             "allocations not alive at the peak are left out past that; none here), frames interned, one span per op.",
             "", "| step | ops | peak_bytes | viewer peak | counter peak | log events | snapshot events | export s "
             "| simulate s | snapshot | trace |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {label(r)} | {r['ops']:,} | {r['peak_bytes']:,} | {r['viewer_peak']:,} | {r['counter_peak']:,} "
                     f"| {r['events']:,} | {r['snapshot_events']:,} | {r['export_s']:.2f} | {r['sim_s']:.1f} "
                     f"| {r['snapshot_bytes'] / 2**20:.2f} MiB | {r['trace_bytes'] / 2**20:.2f} MiB |")
    return "\n".join(lines) + "\n"


def main(quick: bool = False, out: str | None = None) -> int:
    rows = run_export_bench(QUICK_ROWS if quick else FULL_ROWS)
    text = export_markdown(rows)
    print(text)
    if out:
        write_section(out, text)
    ok = all(r["viewer_peak"] == r["peak_bytes"] == r["counter_peak"] for r in rows)
    print("every file peaks at peak_bytes" if ok else "A FILE DOES NOT PEAK AT peak_bytes")
    return 0 if ok else 1
