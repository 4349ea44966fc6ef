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
