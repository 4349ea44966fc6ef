"""The simulated step's allocations and frees, in the order the CUDA caching allocator would see them, for
planner.allocator's replay (what nvidia-smi shows: reserved memory, fragmentation, where a request fails).

The tracked step's event log (planner.measure.events: every storage's birth with its nbytes and the op that made it,
every death when its last view dies, the phase marks) is dispatch order; autograd's backward runs its nodes (and
allocates) in that order on its device thread, the events include them as they ran. The request a storage makes of
the allocator is its nbytes (c10::StorageImpl's size: CUDAAllocator::allocate(nbytes)); a zero-byte storage asks for
nothing.
"""
from __future__ import annotations

from .events import EventLog, op_label


def step_events(log: EventLog) -> tuple[list, list]:
    """(initial, step) as planner.allocator.training_events takes them, from a closed event log."""
    initial = [(uid, nbytes, cat) for uid, (nbytes, cat, _owner) in log.initial.items()]
    step = []
    for e in log.events:
        if e[0] == "a":
            step.append(("a", e[1], e[2], op_label(e[4]) if e[4] is not None else "", e[6]))
        elif e[0] == "f":
            step.append(("f", e[1]))
        else:
            step.append(("p", e[1]))
    return initial, step


def simulate_events(cfg, spec) -> tuple[dict, list, list]:
    """Simulate the step (planner.measure.simulate, fake tensors) and keep its event log: (record, initial, step)."""
    from . import simulate as sim

    kept = {}
    original = sim.finish_log

    def keep(log, exports, emit=lambda e: None):
        kept["log"] = log
        return original(log, exports, emit)
    sim.finish_log = keep
    try:
        rec = sim.simulate_training(cfg, spec)
    finally:
        sim.finish_log = original
    initial, step = step_events(kept["log"])
    return rec, initial, step


def replay_figures(log: EventLog, capacity: int | None = None) -> dict:
    """planner.allocator.run_figures for a simulated step's log, with the cuBLAS workspaces of a CUDA training
    step and this process's PYTORCH_CUDA_ALLOC_CONF (the child inherits the user's)."""
    import os
    import time

    from ..allocator import run_figures
    from ..estimate.training import CUBLAS_WORKSPACE_BYTES_PER_HANDLE

    t0 = time.perf_counter()
    initial, step = step_events(log)
    out = run_figures(initial, step, CUBLAS_WORKSPACE_BYTES_PER_HANDLE, capacity,
                      os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    out["allocator_replay"]["replay_time_s"] = time.perf_counter() - t0
    out["reserved_peak_source"] = "simulate: the step's allocations replayed through the caching allocator's rules"
    return out


def device_capacity(device) -> int | None:
    """What cudaMalloc can hand this process: the device's total (torch.cuda.mem_get_info) less the CUDA context
    (planner/estimate/training.py CUDA_CONTEXT_BYTES, outside the allocator); None where it cannot be read."""
    import torch

    from ..estimate.training import CUDA_CONTEXT_BYTES

    try:
        return torch.cuda.mem_get_info(device)[1] - CUDA_CONTEXT_BYTES
    except (RuntimeError, AssertionError):
        return None


def simulate_run(cfg, spec, steps: int = 2) -> list:
    """The whole run as planner/measure/training.py makes it on the device, simulated (fake tensors) under one
    event log: the model's build (its parameters, buffers and the temporaries their initialisation makes), then
    `steps` steps (step 1 creates the optimizer's state where torch.optim creates it, lazily in its first step).
    Returns the log's events with ("m", "step K") before each step: planner.allocator.events_from_run's input."""
    import gc

    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..routines import training as routine
    from . import simulate as sim
    from .tracker import LiveBytesTracker
    from .training import stop_log

    tracker = LiveBytesTracker()
    log = EventLog(None)
    log.start(tracker)
    tracker.log = log
    out: list = []
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            with tracker:
                step = routine.TrainingStep(cfg, spec)
            sim.adopt_fake_tensors(step.model, mode)
            answers = sim._Answers(step)
            for k in range(1, steps + 1):
                log.events.append(("m", f"step {k}", log.op_index))
                with answers, sim.CpuKernelDtypes(), tracker, sim.real_run_branches(), \
                        sim.cpu_grouped_mm_meta(spec.device):
                    step.run(on_phase=tracker.set_phase)
                gc.collect()
            for e in log.events:
                if e[0] == "a":
                    out.append(("a", e[1], e[2], op_label(e[4]) if e[4] is not None else "", e[6], len(e[7])))
                elif e[0] == "f":
                    out.append(("f", e[1]))
                else:
                    out.append((e[0], e[1]))
    finally:
        stop_log(tracker, log)
    return out
