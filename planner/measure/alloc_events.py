"""The simulated step's allocations and frees, in the order the CUDA caching allocator would see them, for
planner.allocator's replay (what nvidia-smi shows: reserved memory, fragmentation, where a request fails).

The tracked step's event log (planner.measure.events: every storage's birth with its nbytes and the op that made it,
every death when its last view dies, the phase marks) is dispatch order; autograd's backward runs its nodes (and
allocates) in that order on its device thread, the events include them as they ran. The request a storage makes of
the allocator is its nbytes (c10::StorageImpl's size: CUDAAllocator::allocate(nbytes)); a zero-byte storage asks for
nothing.
"""
from __future__ import annotations

import contextlib

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


def replay_figures(log: EventLog, capacity: int | None = None, run: list | None = None) -> dict:
    """planner.allocator's figures for a simulated run, with the cuBLAS workspaces of a CUDA training step and this
    process's PYTORCH_CUDA_ALLOC_CONF (the child inherits the user's). run: the whole run (RunLog.join: build,
    step 1, step 2), else a run made up from the tracked step's `log` (planner.allocator.training_events)."""
    import os
    import time

    from ..allocator import events_from_run, figures, training_events
    from ..estimate.training import CUBLAS_WORKSPACE_BYTES_PER_HANDLE

    t0 = time.perf_counter()
    if run is not None:
        events = events_from_run(run, CUBLAS_WORKSPACE_BYTES_PER_HANDLE)
        how = "the build, the warm-up step and the tracked step"
    else:
        initial, step = step_events(log)
        events = training_events(initial, step, steps=2, cublas_workspace=CUBLAS_WORKSPACE_BYTES_PER_HANDLE)
        how = "the tracked step, twice after the build (step 1 making the optimizer's state)"
    out = figures(events, capacity, os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    out["allocator_replay"]["replay_time_s"] = time.perf_counter() - t0
    out["reserved_peak_source"] = f"simulate: {how} replayed through the caching allocator's rules (planner/allocator.py)"
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


def convert(events, uid=lambda u: u) -> list:
    """An event log's events as planner.allocator.events_from_run takes them; `uid` renames the storages."""
    out = []
    for e in events:
        if e[0] == "a":
            out.append(("a", uid(e[1]), e[2], op_label(e[4]) if e[4] is not None else "", e[6], len(e[7])))
        elif e[0] == "f":
            out.append(("f", uid(e[1])))
        else:
            out.append((e[0], e[1]))
    return out


class RunLog:
    """The simulate's build and warm-up step logged for the allocator replay, joined to its tracked step
    (planner/measure/simulate.py on cuda): the same run simulate_run logs, without simulating it again."""

    def __init__(self):
        from .tracker import LiveBytesTracker

        self.tracker = LiveBytesTracker()
        self.log = EventLog(None)
        self.log.start(self.tracker)
        self.tracker.log = self.log
        self.events: list | None = None
        self.keys: dict = {}

    @contextlib.contextmanager
    def tracking(self):
        """The build or the warm-up under the log; a failure takes the log's module hooks away."""
        try:
            with self.tracker:
                yield self.tracker
        except BaseException:
            self.close()
            raise

    def mark(self, label: str) -> None:
        self.log.events.append(("m", label, self.log.op_index))

    def end_warmup(self) -> None:
        """After step 1: keep its events and which storage each live uid names (the tracked step's log names the
        same storages by its own uids)."""
        self.events = list(self.log.events)
        self.keys = dict(self.log.uid_of)
        self.close()

    def close(self) -> None:
        if self.tracker.log is not None:
            from .training import stop_log

            stop_log(self.tracker, self.log)

    def join(self, tracked: EventLog, tracked_keys: dict) -> list:
        """The whole run: build and step 1 from this log, a ("m", "step 2") mark, the tracked step with its
        initial storages renamed to this log's uids (tracked_keys: storage key -> the tracked log's uid at its
        start)."""
        rename = {tu: ("w", self.keys[k]) for k, tu in tracked_keys.items() if k in self.keys}
        run = convert(self.events or [], lambda u: ("w", u))
        run.append(("m", "step 2"))
        return run + convert(tracked.events, lambda u: rename.get(u, ("t", u)))
