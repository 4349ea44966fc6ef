"""Measure one steady-state training step: exact live-tensor peak (CPU) or the CUDA allocator's peak.

Sequence: step 1 warms up (creates optimizer state, the quantity's "steady state"); step 2 runs
untracked and gives the step time, the peak RSS (VmHWM reset just before it) and on CUDA
max_memory_allocated/reserved; step 3 runs under the live-bytes tracker and gives the exact peak,
the phase it falls in, per-phase peaks and the timeline. Steps 2 and 3 are the same computation,
so they have the same tensor peak; only the tracker's bookkeeping differs.
"""
from __future__ import annotations

import gc
import time
from typing import Callable

import torch

from ..config import ModelConfig
from ..spec import TrainSpec
from ..routines.training import TrainingStep
from . import procmem
from .tracker import LiveBytesTracker

PHASES = ("forward", "loss", "backward", "optimizer", "zero_grad")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _PhaseRecorder:
    """Per-phase peak of a live-bytes reader, as the phase callback of TrainingStep.run."""

    def __init__(self, tracker: LiveBytesTracker, device: torch.device):
        self.tracker, self.device = tracker, device
        self.phase_peak: dict[str, int] = {}
        self.phase_start: dict[str, int] = {}
        self._current = None

    def __call__(self, phase: str) -> None:
        t = self.tracker
        if self._current is not None:
            self.phase_peak[self._current] = max(self.phase_peak.get(self._current, 0), t.peak)
        t.set_phase(phase)
        t.reset_peak()
        self.phase_start.setdefault(phase, t.current)
        self._current = phase


def measure_training(cfg: ModelConfig, spec: TrainSpec, emit: Callable[[dict], None] = lambda e: None,
                     max_timeline_points: int = 600, exports: dict | None = None, module: tuple | None = None) -> dict:
    """Run the three steps; an exception leaves `train_phase` (build, forward, backward, ...) on itself.

    The tracked step keeps an event log (planner.measure.events): the record gains `alive_at_peak`, and
    `exports` ({"memory_snapshot": FILE.pickle, "trace": FILE.json}, either optional) writes those files
    (planner.measure.export); the record names them. `module`: a user's module (path, function[, input shape]),
    trained by planner.routines.user_module.ModuleTrainingStep, as `simulate --module` runs it (cfg is None)."""
    holder: dict = {}
    try:
        return _measure(cfg, spec, emit, max_timeline_points, holder, exports, module)
    except BaseException as exc:
        step = holder.get("step")
        exc.train_phase = step.current_phase if step is not None else "build"
        raise


def resolve_device(name: str) -> "torch.device":
    """The device a run measures on, with its index: torch.cuda.set_device refuses a bare "cuda" (torch 2.11,
    _get_device_index: "Expected a torch.device with a specified index"; seen on the H100 run of docs/gpu.md),
    so "cuda" means the current device, as torch's own tensors placed on "cuda" do."""
    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def _measure(cfg: ModelConfig, spec: TrainSpec, emit: Callable[[dict], None], max_timeline_points: int,
             holder: dict, exports: dict | None = None, module: tuple | None = None) -> dict:
    device = resolve_device(spec.device)
    emit({"event": "progress", "stage": "build", "fraction": 0.05})
    if module is not None:
        from pathlib import Path

        from ..routines.user_module import ModuleTrainingStep

        step = holder["step"] = ModuleTrainingStep(Path(module[0]), module[1], spec,
                                                   input_shape=module[2] if len(module) > 2 else None)
    else:
        step = holder["step"] = TrainingStep(cfg, spec)
    emit({"event": "progress", "stage": "warm-up step", "fraction": 0.2})
    step.run()
    gc.collect()

    # Step 2: untracked, timed; RSS and CUDA allocator peaks.
    emit({"event": "progress", "stage": "timed step", "fraction": 0.45})
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        cuda_before = torch.cuda.memory_allocated(device)
    rss_before = procmem.read_status()
    procmem.reset_peak_rss()
    _sync(device)
    t0 = time.perf_counter()
    step.run()
    _sync(device)
    step_time = time.perf_counter() - t0
    rss_after = procmem.read_status()
    result: dict = {
        "kind": "measure",  # planner.measure.simulate's records say "simulate"
        "device": str(device),
        "step_time_s": step_time,
        "rss_before_bytes": rss_before.get("VmRSS", 0),
        "peak_rss_bytes": rss_after.get("VmHWM", 0),
        "rss_anon_bytes": rss_after.get("RssAnon", 0),
        "rss_file_bytes": rss_after.get("RssFile", 0),
    }
    if device.type == "cuda":
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        result["allocated_before_bytes"] = cuda_before
        result["gpu_name"] = torch.cuda.get_device_name(device)
    gc.collect()

    # Step 3: tracked.
    emit({"event": "progress", "stage": "tracked step", "fraction": 0.7})
    tracker = LiveBytesTracker()
    # --offload-optimizer: the host's copies and states, counted apart
    tracker.register_host(step.host_tensors() if hasattr(step, "host_tensors") else [])
    tracker.track(step.persistent_tensors())
    tracker.reset_peak()
    persistent = tracker.current
    recorder = _PhaseRecorder(tracker, device)
    log = start_log(tracker, step)
    tracker.recording = True
    step.pack_scope = tracker.host_scope  # --offload-activations: the host copies counted apart
    t0 = time.perf_counter()
    try:
        with tracker:
            step.run(on_phase=recorder)
            _sync(device)
    finally:
        stop_log(tracker, log)  # the global module hooks go, whatever happened
        step.pack_scope = None
    tracked_time = time.perf_counter() - t0
    tracker.recording = False
    peak_phase = max(recorder.phase_peak, key=recorder.phase_peak.get)

    result.update({
        "tracked_peak_bytes": max(recorder.phase_peak.values()),
        "peak_phase": peak_phase,
        "phase_peak_bytes": {p: recorder.phase_peak.get(p, 0) for p in PHASES},
        "persistent_bytes": persistent,
        "optimizer_bytes": step.optimizer_state_bytes(),
        "tracked_step_time_s": tracked_time,
        "tracker_overhead": tracked_time / step_time if step_time > 0 else None,
        "timeline": downsample(tracker.samples, max_timeline_points),
    })
    # The headline figure: on CUDA the allocator's own peak; on CPU the exact live-tensor peak.
    result["peak_bytes"] = result["peak_allocated_bytes"] if device.type == "cuda" else result["tracked_peak_bytes"]
    if device.type == "cuda":
        result["peak_phase_source"] = "tracked step (timeline), peak from max_memory_allocated"
    result.update(host_figures(tracker, spec))
    result.update(finish_log(log, exports, emit))
    emit({"event": "progress", "stage": "done", "fraction": 1.0})
    return result


def host_figures(tracker: LiveBytesTracker, spec) -> dict:
    """--offload-optimizer: the host's parameter and grad copies and optimizer states (planner/routines/
    offload_optim.py); --offload-activations: the host copies save_on_cpu's pack hook made (their peak), apart from the device
    figure (`peak_bytes`: everything else). On a CPU device the 'device' is the same RAM: the device figure is the
    mechanism measured here, for the CUDA check (on CUDA the unpack hook's device copies in backward add to it)."""
    note = {"device_figure_note": "device figure: for the CUDA check (measured on " + str(spec.device) + ")"}
    out = {}
    if getattr(spec, "offload_optimizer", False):  # planner/routines/offload_optim.py: all persistent on the host
        out["host_optimizer_offload_bytes"] = tracker.host_registered
    if getattr(spec, "offload_activations", False):  # the pack hook's copies, on top of what was registered
        out["host_activation_offload_bytes"] = tracker.host_peak - tracker.host_registered
    if len(out) == 2:  # both: the host's peak, the two together
        out["host_peak_bytes"] = tracker.host_peak
    return {**out, **note} if out else {}


def start_log(tracker: LiveBytesTracker, step):
    """Attach an event log (planner.measure.events) to the tracker for the tracked step."""
    from .events import EventLog

    log = EventLog(step)
    log.start(tracker)
    tracker.log = log
    return log


def stop_log(tracker: LiveBytesTracker, log) -> None:
    tracker.log = None
    log.close()


def finish_log(log, exports: dict | None, emit: Callable[[dict], None] = lambda e: None) -> dict:
    """The record's `alive_at_peak` and, when asked, the written files (their keys name them)."""
    from .export import alive_at_peak, category_timeline, phase_categories, write_exports

    t0 = time.perf_counter()
    out = {"alive_at_peak": alive_at_peak(log), "category_timeline": category_timeline(log),
           "categories": {p: c for p, c in phase_categories(log).items() if p in PHASES}}  # per phase (issue #19 item 3)
    if exports and (exports.get("memory_snapshot") or exports.get("trace")):
        emit({"event": "progress", "stage": "writing the snapshot and trace", "fraction": 0.95})
        out.update(write_exports(log, exports.get("memory_snapshot"), exports.get("trace")))
        out["export_events"] = len(log.events)
    out["export_time_s"] = time.perf_counter() - t0  # alive_at_peak, the category timeline and the files
    return out


def downsample(samples: list[tuple[float, int, str]], n: int) -> list[dict]:
    """At most ~n points that keep each bucket's maximum (a chart must not hide the peak)."""
    if not samples:
        return []
    size = max(1, -(-len(samples) // n))
    out = []
    for i in range(0, len(samples), size):
        bucket = samples[i:i + size]
        t, b, phase = max(bucket, key=lambda s: s[1])
        out.append({"t_s": round(t, 6), "bytes": b, "phase": phase})
    return out
