"""Exact peak of live tensor bytes on CPU: a dispatch-level tracker of distinct live storages.

Why not torch.distributed._tools.MemTracker: it refuses a module called twice per step, which the
book's model (dropout modules reused) and checkpointing (recompute) both do. This is the same design
(storage weakrefs; research/pytorch-memory-facts.md 4.3): after every aten op, each output's storage
is registered once; a weakref callback subtracts it when its last view dies. Storage sizes are exact
(`untyped_storage().nbytes()`); on CUDA the allocator's own counter is read instead.
"""
from __future__ import annotations

import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytesTracker(TorchDispatchMode):
    """Tracks the sum of live storage bytes, its peak, and a timeline of (t, bytes, phase)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[weakref.ref, int]] = {}
        self.current = 0
        self.peak = 0
        self.phase = "setup"
        self.peak_phase = "setup"
        self.samples: list[tuple[float, int, str]] = []
        self.t0 = time.perf_counter()
        self.recording = False
        self.log = None  # planner.measure.events.EventLog when attached (off by default: no cost)
        # --offload-activations (planner/estimate/offload_act.py): storages made inside save_on_cpu's pack hook are
        # the host's copies, counted apart (host_current / host_peak); `current` / `peak` are then the device figure.
        # --offload-optimizer (planner/routines/offload_optim.py): its host copies and states, registered in
        # host_scope before the step, are counted the same way
        self.host_depth = 0
        self.host_keys: set[int] = set()
        self.host_current = 0
        self.host_peak = 0
        self.host_registered = 0  # the host bytes registered before the step (register_host: the offloaded optimizer)

    def _forget(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None and key in self.host_keys:
            self.host_keys.discard(key)
            self.host_current -= entry[1]
        elif entry is not None:
            self.current -= entry[1]
            if self.log is not None:
                self.log.free(key)

    def track(self, *objs) -> None:
        for obj in tree_flatten(objs)[0]:
            if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
                storage = obj.untyped_storage()
                key = id(storage)
                if key not in self.live and self.host_depth:  # a host copy (save_on_cpu's pack hook)
                    nbytes = storage.nbytes()
                    self.live[key] = (weakref.ref(storage, lambda _r, k=key: self._forget(k)), nbytes)
                    self.host_keys.add(key)
                    self.host_current += nbytes
                    self.host_peak = max(self.host_peak, self.host_current)
                elif key not in self.live:
                    nbytes = storage.nbytes()
                    self.live[key] = (weakref.ref(storage, lambda _r, k=key: self._forget(k)), nbytes)
                    self.current += nbytes
                    if self.log is not None:
                        self.log.alloc(key, obj, nbytes)
        if self.current > self.peak:
            self.peak = self.current
            self.peak_phase = self.phase

    def host_scope(self):
        """A context for save_on_cpu's pack hook (planner/routines/training.py) and for registering the offloaded
        optimizer's host tensors (planner/measure/training.py): what is tracked inside it is the host's."""
        tracker = self

        class _Scope:
            def __enter__(self):
                tracker.host_depth += 1

            def __exit__(self, *exc):
                tracker.host_depth -= 1
        return _Scope()

    def register_host(self, tensors) -> None:
        """What lives on the host before the step (--offload-optimizer's copies and states), counted apart; what the
        step's pack hook adds later (--offload-activations) is host_peak - host_registered."""
        with self.host_scope():
            self.track(tensors)
        self.host_registered = self.host_current

    def track_module(self, module: torch.nn.Module) -> None:
        self.track(list(module.parameters()), list(module.buffers()))

    def track_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.track([v for state in optimizer.state.values() for v in state.values()])

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        if self.log is not None:
            self.log.set_phase(phase)
        self._sample()

    def reset_peak(self) -> None:
        self.peak = self.current
        self.peak_phase = self.phase

    def _sample(self) -> None:
        if self.recording:
            self.samples.append((time.perf_counter() - self.t0, self.current, self.phase))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        log = self.log
        if log is not None:
            log.before_op(func)
        kernel = python_kernel(func, args) if func.namespace == "bitsandbytes" else None
        if kernel is not None:
            with self:  # re-entered: the kernel's own ops (its temporaries) are tracked one by one
                out = kernel(*args, **(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        self.track(out)
        if log is not None:
            log.after_op(out)
        self._sample()
        return out


def python_kernel(func, args):
    """bitsandbytes' CPU optimizer updates, as the Python functions their ops run, else None.

    bitsandbytes 0.50 registers `bitsandbytes::optimizer_update_8bit_blockwise` / `optimizer_update_32bit`
    with torch.library (bitsandbytes/_ops.py) and implements them on the CPU in Python
    (bitsandbytes/backends/cpu/ops.py: dequantize both states to fp32, update, re-quantize). A dispatch mode
    sees such an op as one call returning nothing and runs it with the mode off, which would hide its fp32
    temporaries (up to 24 bytes per element of the parameter: planner/estimate/bnb_optim.py). So the tracker
    runs that very Python function itself, under the mode. Only on CPU tensors (on CUDA the op is one C
    kernel that allocates nothing, and the allocator's own counter is read). Fake tensors (planner/measure/simulate.py)
    are CPU tensors too: the function's inner bitsandbytes ops then run their registered fake kernels."""
    if func.__name__ not in ("optimizer_update_8bit_blockwise.default", "optimizer_update_32bit.default"):
        return None
    p = args[2] if len(args) > 2 else None
    if not isinstance(p, torch.Tensor) or p.device.type != "cpu":
        return None
    from bitsandbytes.backends.cpu import ops as cpu_ops

    return {"optimizer_update_8bit_blockwise.default": cpu_ops._optimizer_update_8bit_blockwise_cpu,
            "optimizer_update_32bit.default": cpu_ops._optimizer_update_32bit_cpu}[func.__name__]
