"""The CUDA check's large grids (issue #25): every recorded CPU grid and the inference grids, re-run on the GPU.

    python -m planner bench gpu --out-json DIR --parts recorded,infer

The rows are the ones measured on the CPU and kept in tests/data/measured/<grid>.jsonl (every Hugging Face
family x precision x attention x checkpointing x optimizer, fine-tuning with frozen layers, LoRA, QLoRA and
AdamW8bit, fine-tuning under AMP, the book's GPT-2) plus the inference grids (bench/inference.py and
bench/infer_caches.py), each with its device set to cuda. Thousands of tiny rows do not each get a
fresh process (a CUDA child's start costs seconds): SHARDS processes each run a share of them one after
another, in shuffled order (a run cut short by its deadline keeps a sample of every grid), with the caching
allocator emptied and its peak reset before each row (planner.measure.training / inference reset the peak).
What a shard cannot make per row is a fresh reserved pool: `max_memory_reserved` is only compared on the
fresh-child rows of bench/gpu.py. Each row is one JSON line in DIR/cuda-rows.jsonl.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARDS = 12            # processes sharing the GPU (16 CPU cores on the lent machine; the grid part runs beside)
ROWS_FILE = "cuda-rows.jsonl"
RECORDED_GRIDS = ("accuracy", "families", "finetune", "finetune-amp", "finetune-book", "qlora", "8bit")


def recorded_rows() -> list[dict]:
    """The recorded CPU rows with their device set to cuda: {"grid", "label", "config", "spec", "cpu"}."""
    from .recorded import RECORD_DIR, load

    rows = []
    for grid in RECORDED_GRIDS:
        path = RECORD_DIR / f"{grid}.jsonl"
        if not path.exists():
            continue
        _, recs = load(path)
        for r in recs:
            rows.append({"kind": "train", "grid": grid, "label": r["label"], "config": r["config"],
                         "spec": {**r["spec"], "device": "cuda"},
                         "cpu": {"peak_bytes": r["peak_bytes"], "peak_phase": r["peak_phase"]}})
    return rows


def infer_rows() -> list[dict]:
    """The inference grids (dynamic / static / no cache; sliding and quantized caches) on cuda, and the
    offloaded cache on a real 1B model (a few new tokens: its device peak is reached in the first decode step)."""
    import dataclasses

    from . import infer_caches, inference
    from planner.config import PRESETS, config_to_dict
    from planner.infer_spec import InferSpec

    rows = []
    for grid, mod in (("inference", inference), ("inference-caches", infer_caches)):
        for name, label, cfg, ispec in mod.grid_rows(False):
            spec = dataclasses.replace(ispec, device="cuda")
            rows.append({"kind": "infer", "grid": grid, "label": f"{name} {label} {getattr(cfg, 'attention', 'eager')} "
                         f"{spec.precision} {spec.cache}", "config": config_to_dict(cfg), "spec": spec.to_dict()})
    for name, b, s in (("llama-3.2-1b", 4, 4096), ("qwen2.5-0.5b", 8, 4096)):
        for cache in ("dynamic", "offloaded"):
            spec = InferSpec(b, s, 8, precision="bf16", cache=cache, device="cuda")
            rows.append({"kind": "infer", "grid": "inference-full", "label": f"{name} b{b} s{s} bf16 {cache}",
                         "config": config_to_dict(PRESETS[name]), "spec": spec.to_dict()})
    return rows


def technique_rows() -> list[dict]:
    """Issue #24's techniques on cuda: the fused losses (chunked-ce, cce), the checkpointing policies (every:K,
    selective), --offload-activations (save_on_cpu(pin_memory=True): on CUDA its unpack hook makes device copies in
    backward and the host copies are pinned) and --offload-optimizer, each grid as the CPU benches run it."""
    from dataclasses import asdict, replace

    from . import offload_act, offload_opt, techniques
    from planner.config import config_to_dict
    from planner.spec import TrainSpec

    runs = [("losses", label, cfg, spec) for label, cfg, spec in techniques.losses_grid()]
    runs += [("policies", label, cfg, spec) for label, cfg, spec in techniques.policy_grid()]
    for label, cfg, b, s in offload_act.grid() + offload_act.family_grid():
        for prec in ("fp32", "bf16-amp"):
            for ckpt in (False, True):
                runs.append(("offload-activations", f"{label} b{b} s{s} {prec}{' ckpt' if ckpt else ''}", cfg,
                             TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_activations=True)))
    for label, cfg, b, s in offload_opt.grid():
        for prec in ("fp32", "bf16-amp"):
            for ckpt in (False, True):
                runs.append(("offload-optimizer", f"{label} b{b} s{s} {prec}{' ckpt' if ckpt else ''}", cfg,
                             TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_optimizer=True)))
    return [{"kind": "train", "grid": grid, "label": label, "config": config_to_dict(cfg),
             "spec": asdict(replace(spec, device="cuda"))} for grid, label, cfg, spec in runs]


def _measure_row(row: dict) -> dict:
    import gc

    import torch

    from planner.config import config_from_dict

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_host_memory_stats()  # the pinned host allocator (save_on_cpu's copies, offload's states)
    cfg = config_from_dict(row["config"])
    t0 = time.perf_counter()
    if row["kind"] == "train":
        from planner.measure.training import measure_training
        from planner.spec import TrainSpec

        m = measure_training(cfg, TrainSpec(**row["spec"]))
    else:
        from planner.infer_spec import InferSpec
        from planner.measure.inference import measure_inference

        m = measure_inference(cfg, InferSpec(**row["spec"]))
    keep = ("peak_bytes", "peak_phase", "phase_peak_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
            "allocated_before_bytes", "tracked_peak_bytes", "tracked_phase_peak_bytes", "gpu_name",
            "host_activation_offload_bytes", "host_optimizer_offload_bytes", "host_peak_bytes")
    host = torch.cuda.host_memory_stats()
    pinned = {k: host[k] for k in ("allocated_bytes.peak", "reserved_bytes.peak", "allocated_bytes.current")
              if k in host}
    return {"measured": {k: m[k] for k in keep if k in m}, "pinned_host": pinned,
            "wall_s": round(time.perf_counter() - t0, 3)}


def shard_main(rows_path: str, shard: int, shards: int, out_path: str, deadline: float) -> int:
    """One shard: rows shard, shard + shards, ... of the shuffled list, until the deadline (a unix time)."""
    rows = json.loads(Path(rows_path).read_text())
    for row in rows[shard::shards]:
        if time.time() > deadline:
            break
        try:
            rec = {**row, **_measure_row(row)}
        except Exception as exc:  # noqa: BLE001 - a row that fails is a record, the shard goes on
            rec = {**row, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        line = json.dumps(rec) + "\n"
        with open(out_path, "a") as fh:  # one write per line in append mode: shards' lines never interleave
            fh.write(line)
    return 0


def run_rows(out_dir: Path, parts: tuple[str, ...], budget_s: float, progress=print) -> None:
    rows = (recorded_rows() if "recorded" in parts else []) + (infer_rows() if "infer" in parts else [])
    random.Random(0).shuffle(rows)
    # the techniques first, in their own order: few rows (they finish early in every shard), the ones no run has seen
    rows = (technique_rows() if "techniques" in parts else []) + rows
    rows_path = Path(tempfile.mkdtemp()) / "cuda-rows-todo.json"  # outside DIR: only the records come back
    rows_path.write_text(json.dumps(rows))
    out_path = out_dir / ROWS_FILE
    deadline = time.time() + budget_s
    from . import child_env

    env = child_env({**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})  # the GPU does the work
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; from bench.gpu_grids import shard_main; "
                               f"sys.exit(shard_main({str(rows_path)!r}, {i}, {SHARDS}, {str(out_path)!r}, {deadline}))"],
                              env=env) for i in range(SHARDS)]
    for p in procs:
        p.wait()
    rows_path.unlink()
    done = sum(1 for _ in out_path.open()) if out_path.exists() else 0
    progress(f"cuda rows: {done} of {len(rows)} measured within {budget_s:.0f} s")


RECORDS_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "cuda" / "2026-11-27-h200"  # one H200 run


def read_records(path) -> list[dict]:
    """JSON lines, plain or gzipped (the records kept in the repo are gzipped)."""
    import gzip

    path = Path(path)
    if not path.exists() and Path(str(path) + ".gz").exists():
        path = Path(str(path) + ".gz")
    if not path.exists():
        return []
    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def live_error(rec: dict) -> tuple[int, int, float] | None:
    """A training (or inference) row's estimate of live tensor bytes (its peak without the CUDA allocator's own
    lines: the 512-B rounding and the cuBLAS workspaces) against the tracked live tensor bytes of the real step on the GPU:
    (estimate, measured, error %), None for a refused estimate or a row without a tracked peak. This is the
    comparison a shard's row supports exactly (a shard's `max_memory_allocated` also holds what earlier rows in
    the same process left behind: bench/gpu_grids.py module doc)."""
    from planner.config import config_from_dict
    from planner.estimate.training import estimate_training
    from planner.spec import TrainSpec
    from planner.validation import ConfigError

    tracked = (rec.get("measured") or {}).get("tracked_peak_bytes")
    if rec.get("kind") == "infer" and (rec.get("spec") or {}).get("cache") == "offloaded":
        return None  # its tracked bytes hold the host copies too; its device figure is compared with allocated
    if rec.get("kind") == "infer" and tracked:  # generate(): its one cuBLAS workspace is the allocator's line
        from planner.infer_spec import InferSpec
        from planner.estimate.inference import estimate_inference

        try:
            est = estimate_inference(config_from_dict(rec["config"]), InferSpec(**rec["spec"]))
        except ConfigError:
            return None
        live = est["peak_bytes"] - est.get("cublas_workspace_bytes", 0)
        return live, tracked, 100 * (live - tracked) / tracked
    if rec.get("kind") != "train" or not tracked:
        return None
    try:
        est = estimate_training(config_from_dict(rec["config"]), TrainSpec(**rec["spec"]))
    except ConfigError:
        return None
    live = est.peak_bytes - est.transients.get("allocator_rounding", 0) - est.transients.get("cublas_workspace", 0)
    return live, tracked, 100 * (live - tracked) / tracked


def _estimate(rec: dict):
    """(estimated peak bytes, estimated peak phase) of one row with today's estimator, or (None, why)."""
    from planner.config import config_from_dict

    cfg = config_from_dict(rec["config"])
    try:
        if rec["kind"] == "train":
            from planner.estimate.training import estimate_training
            from planner.spec import TrainSpec

            e = estimate_training(cfg, TrainSpec(**rec["spec"]))
            return e.peak_bytes, e.peak_phase
        from planner.estimate.inference import estimate_inference
        from planner.infer_spec import InferSpec

        e = estimate_inference(cfg, InferSpec(**rec["spec"]))
        return e["peak_bytes"], e["peak_phase"]
    except Exception as exc:  # noqa: BLE001 - a refused estimate is shown as such
        return None, str(exc).splitlines()[0][:120]


def rows_markdown(records_dir: str, bar_pct: float) -> list[str]:
    """Per grid and family: rows, worst error of the estimate against max_memory_allocated, and how far CUDA's
    live tensor bytes moved from the CPU's recorded peak (kernels that differ by device: SDPA's flash /
    memory-efficient kernels keep a logsumexp where the CPU's math kernel keeps s x s weights)."""
    recs = read_records(Path(records_dir) / ROWS_FILE)
    if not recs:
        return []
    groups: dict[tuple[str, str], list] = {}
    worst_rows = []
    failed = []
    for r in recs:
        fam = r["config"].get("arch", "?")
        g = groups.setdefault((r["grid"], fam), [])
        if "error" in r:
            failed.append(f"| {r['grid']} | {r['label']} | {r['error']} |")
            continue
        m = r["measured"]
        est, phase = _estimate(r)
        alloc = m.get("peak_allocated_bytes")
        err = 100 * (est - alloc) / alloc if est is not None and alloc else None
        cpu = r.get("cpu", {}).get("peak_bytes")
        dev = 100 * (m["tracked_peak_bytes"] - cpu) / cpu if cpu and m.get("tracked_peak_bytes") else None
        g.append((err, dev, phase if est is not None else None))
        live = live_error(r)
        if live is not None:
            worst_rows.append((abs(live[2]), r, live[0], live[1], live[2], phase))
    lines = ["## Every recorded grid and the inference grids on CUDA", "",
             f"{len(recs)} rows (bench/gpu_grids.py; each row's device set to cuda, in shards of one process "
             "each; allocated peak reset before each row). Error = estimate against `max_memory_allocated`, which in a "
             "shard also holds what earlier rows left (a tiny row's few MB sit on ~67 MB of cuBLAS workspaces; an "
             "inference row after a training row holds the backward thread's workspace too): the live-bytes table "
             "above is the check of the estimate's terms; "
             "live-bytes shift = CUDA's tracked tensor bytes against the CPU's recorded peak of the same row.", "",
             f"| grid | family | rows | estimated | worst \\|error\\| | within {bar_pct:g}% | live-bytes shift (min / max) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for (grid, fam), g in sorted(groups.items()):
        errs = [e for e, _, _ in g if e is not None]
        devs = [d for _, d, _ in g if d is not None]
        lines.append(f"| {grid} | {fam} | {len(g)} | {len(errs)} | "
                     f"{max(map(abs, errs)):.3f}% | {sum(abs(e) <= bar_pct for e in errs)} | "
                     + (f"{min(devs):+.2f}% / {max(devs):+.2f}%" if devs else "—") + " |"
                     if errs else f"| {grid} | {fam} | {len(g)} | 0 | — | — | "
                     + (f"{min(devs):+.2f}% / {max(devs):+.2f}%" if devs else "—") + " |")
    worst_rows.sort(key=lambda t: -t[0])
    lines += ["", "Worst rows in live bytes (the estimate less its allocator lines against the tensors alive in the "
              "real step):", "", "| grid | row | estimate (B) | live (B) | err % | phase est / meas |",
              "|---|---|---:|---:|---:|---|"]
    for _, r, est, alloc, err, phase in worst_rows[:25]:
        lines.append(f"| {r['grid']} | {r['label']} | {est:,} | {alloc:,} | {err:+.3f} | "
                     f"{phase} / {r['measured'].get('peak_phase')} |")
    if failed:
        lines += ["", f"Rows that failed on CUDA ({len(failed)}):", "", "| grid | row | error |", "|---|---|---|",
                  *failed[:40]]
    return lines + [""]


def explain_main(rows_path: str, out_path: str) -> int:
    """Rows (a JSON list of cuda-rows records) measured one after another in this process with their whole record
    (what was alive at the peak, by op and module; each phase's categories): what a CUDA error is made of, read
    where no CUDA simulation runs (`python -c "from bench.gpu_grids import explain_main; ..."`)."""
    import torch

    from planner.config import config_from_dict

    for row in json.loads(Path(rows_path).read_text()):
        torch.cuda.empty_cache()
        cfg = config_from_dict(row["config"])
        try:
            if row["kind"] == "train":
                from planner.measure.training import measure_training
                from planner.spec import TrainSpec

                m = measure_training(cfg, TrainSpec(**row["spec"]))
            else:
                from planner.infer_spec import InferSpec
                from planner.measure.inference import measure_inference

                m = measure_inference(cfg, InferSpec(**row["spec"]))
            rec = {**row, "measured": {k: v for k, v in m.items() if k not in ("timeline", "category_timeline")}}
        except Exception as exc:  # noqa: BLE001 - a row that fails is a record
            rec = {**row, "error": f"{type(exc).__name__}: {exc}"[:500]}
        with open(out_path, "a") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")
    return 0
