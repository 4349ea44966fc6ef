"""Measure one generate() call: the exact live-tensor peak (CPU) or the CUDA allocator's peak, per phase.

Sequence as planner/measure/training.py: run 1 warms up (library code, lazy buffers); run 2 is untracked
and gives the time, the peak RSS and on CUDA max_memory_allocated; run 3 runs under the live-bytes tracker
and gives the exact peak, its phase (prefill | decode), per-phase peaks and the timeline. The weights,
buffers and the prompt batch are counted (tracked before the call): the record's peak_bytes is what the
process holds in tensors at generate()'s high point.
"""
from __future__ import annotations

import gc
import time
from typing import Callable

import torch

from ..config import ModelConfig
from ..infer_spec import InferSpec
from ..routines.inference import GenerationRun
from . import procmem
from .tracker import LiveBytesTracker
from .training import _PhaseRecorder, _sync, downsample, resolve_device

INFER_PHASES = ("prefill", "decode")


def measure_inference(cfg: ModelConfig, ispec: InferSpec, emit: Callable[[dict], None] = lambda e: None,
                      max_timeline_points: int = 600) -> dict:
    holder: dict = {}
    try:
        return _measure(cfg, ispec, emit, max_timeline_points, holder)
    except BaseException as exc:
        run = holder.get("run")
        exc.train_phase = run.current_phase if run is not None else "build"
        raise


def _measure(cfg, ispec, emit, max_timeline_points, holder) -> dict:
    device = resolve_device(ispec.device)
    emit({"event": "progress", "stage": "build", "fraction": 0.05})
    run = holder["run"] = GenerationRun(cfg, ispec)
    emit({"event": "progress", "stage": "warm-up generate", "fraction": 0.2})
    run.run()
    gc.collect()

    emit({"event": "progress", "stage": "timed generate", "fraction": 0.45})
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rss_before = procmem.read_status()
    procmem.reset_peak_rss()
    _sync(device)
    t0 = time.perf_counter()
    run.run()
    _sync(device)
    gen_time = time.perf_counter() - t0
    rss_after = procmem.read_status()
    result: dict = {"kind": "measure", "device": str(device), "generate_time_s": gen_time,
                    "tokens_per_s": ispec.batch_size * ispec.new_tokens / gen_time if gen_time > 0 else None,
                    "rss_before_bytes": rss_before.get("VmRSS", 0), "peak_rss_bytes": rss_after.get("VmHWM", 0)}
    if device.type == "cuda":
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        result["gpu_name"] = torch.cuda.get_device_name(device)
    gc.collect()

    emit({"event": "progress", "stage": "tracked generate", "fraction": 0.7})
    tracker = LiveBytesTracker()
    tracker.track(run.persistent_tensors())
    tracker.reset_peak()
    persistent = tracker.current
    recorder = _PhaseRecorder(tracker, device)
    tracker.recording = True
    with tracker:
        run.run(on_phase=recorder)
        _sync(device)
    tracker.recording = False
    peaks = {p: recorder.phase_peak.get(p, 0) for p in INFER_PHASES}
    peak_phase = max(peaks, key=peaks.get)
    result.update({"tracked_peak_bytes": peaks[peak_phase], "peak_phase": peak_phase, "phase_peak_bytes": peaks,
                   "persistent_bytes": persistent, "timeline": downsample(tracker.samples, max_timeline_points)})
    result["peak_bytes"] = result["peak_allocated_bytes"] if device.type == "cuda" else result["tracked_peak_bytes"]
    emit({"event": "progress", "stage": "done", "fraction": 1.0})
    return result
