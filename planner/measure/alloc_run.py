"""The simulated run's allocator events, made by simulating it (planner.measure.simulate on fake tensors): the
drivers of planner.measure.alloc_events' log, kept apart so that the simulate itself (which logs through
alloc_events.RunLog) and the event list do not import each other."""
from __future__ import annotations

from .alloc_events import convert, step_events
from .events import EventLog


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
            out = convert(log.events)
    finally:
        stop_log(tracker, log)
    return out


