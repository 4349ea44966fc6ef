"""One rank of a data-parallel training step (DDP or FSDP2), measured for real or simulated on fake tensors.

Real run: `python -m planner.measure.distributed '<json payload>'` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment (planner.distributed starts the N ranks); gloo on the CPU, nccl on CUDA.
Simulation: `simulate_rank` runs the same code in this process under FakeTensorMode with the fake process
group (torch.testing._internal.distributed.fake_pg), as torchtitan's scripts/estimate/estimation.py does,
so any world size runs on one CPU and allocates nothing.

Each rank runs the project's TrainingStep with its model wrapped (DDP around the model; FSDP2
`fully_shard` on every block, then on the root) and measures, as planner.measure.training does, the
exact peak of live tensor storage bytes, its phase, per-phase peaks and the timeline:
  steps 1-2 warm up (optimizer state; DDP builds its buckets, and rebuilds them in step 2's forward in
  the order the gradients came: gradients only become bucket views from then on), step 3 is timed and
  untracked (RSS high-water mark; on CUDA max_memory_allocated, the headline there), step 4 is tracked
  to discover the storages that outlive a step without being parameters or optimizer state (DDP's
  buckets, held by the C++ reducer), step 5 is tracked and reported. A simulation skips step 3.
Events are JSON lines on stdout, as planner.measure.worker prints them, each with the rank.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
import weakref
from contextlib import contextmanager, nullcontext
from functools import wraps
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from ..config import ModelConfig, config_from_dict
from ..parallel import ParallelSpec
from ..routines.training import TrainingStep, make_optimizer
from ..spec import TrainSpec
from . import procmem
from .tracker import LiveBytesTracker
from .training import PHASES, _PhaseRecorder, downsample

EXIT_INVALID, EXIT_FAILED = 2, 3


def _leaf_tensors(obj):
    """Plain tensors behind DTensors and other wrapper subclasses (their storage is the local shard's)."""
    if is_traceable_wrapper_subclass(obj):
        attrs, _ = obj.__tensor_flatten__()
        for a in attrs:
            yield from _leaf_tensors(getattr(obj, a))
    elif isinstance(obj, torch.Tensor):
        yield obj


class DistLiveBytesTracker(LiveBytesTracker):
    """LiveBytesTracker that also sees DTensor shards and storage resizes.

    FSDP2 frees an unsharded parameter by `untyped_storage().resize_(0)` and re-allocates it with
    `resize_(n)` before the next all-gather (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    alloc_storage / free_storage); UntypedStorage.resize_ is not an aten op, so it is wrapped here while
    the tracker is active (as torch.distributed._tools.mem_tracker does)."""

    def __init__(self, fake_scalars: bool = False):
        super().__init__()
        self.fake_scalars = fake_scalars
        self._orig_resize = None
        # gloo's worker threads drop the last reference to a collective's tensors, so the weakref
        # callbacks (_forget) run on them, concurrently with the main thread's `current += n`: every
        # update of the counters holds this lock (re-entrant: a callback can fire inside track()).
        self._lock = threading.RLock()
        # Storages whose last reference dies on another thread than the one that runs the step: on gloo,
        # a collective's c10d Work (ProcessGroupGloo AsyncWork, holding its input and output tensors) is
        # released by gloo's worker thread, which may run after FSDP2 has dropped its own reference, so the
        # buffer lives on while the step goes on (measured: an all-gather output held until the next
        # group's all-gather, +3.4% on one step in ~6% of steps on 2 cores). Counted, so a step with a late
        # release can be told apart from FSDP2's own schedule (planner.measure.distributed._run_steps).
        self._owner = threading.get_ident()
        self.late_frees = 0
        self.late_free_bytes = 0
        self._inside = False

    def _forget(self, key: int) -> None:
        with self._lock:
            if self._inside and threading.get_ident() != self._owner and key in self.live:
                self.late_frees += 1
                self.late_free_bytes += self.live[key][1]
            super()._forget(key)

    def track(self, *objs) -> None:
        leaves = [t for obj in tree_flatten(objs)[0] for t in _leaf_tensors(obj)]
        with self._lock:
            super().track(leaves)

    def _resized(self, storage, nbytes: int) -> None:
        with self._lock:
            self._resized_locked(storage, nbytes)

    def _resized_locked(self, storage, nbytes: int) -> None:
        key = id(storage)
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = (weakref.ref(storage, lambda _r, k=key: self._forget(k)), nbytes)
            self.current += nbytes
        else:
            self.live[key] = (entry[0], nbytes)
            self.current += nbytes - entry[1]
        if self.current > self.peak:
            self.peak = self.current
            self.peak_phase = self.phase
        self._sample()

    def __enter__(self):
        orig = self._orig_resize = torch.UntypedStorage.resize_
        tracker = self

        @wraps(orig)
        def resize_(storage, size):
            out = orig(storage, size)
            tracker._resized(storage, storage.nbytes())
            return out

        torch.UntypedStorage.resize_ = resize_
        self._inside = True
        return super().__enter__()

    def __exit__(self, *exc):
        self._inside = False
        torch.UntypedStorage.resize_ = self._orig_resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.fake_scalars and func is torch.ops.aten._local_scalar_dense.default:
            return _fake_scalar(args[0])
        if self.fake_scalars and func is torch.ops._c10d_functional.wait_tensor.default:
            # DTensor's collectives (functional: all_reduce / all_gather_into_tensor, then wait_tensor). In eager
            # wait_tensor returns its input; its fake kernel returns a new tensor (as FSDPMemTracker notes,
            # torch/distributed/_tools/fsdp2_mem_tracker.py), which would count the collective's output twice.
            return args[0]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.fake_scalars and func is torch.ops.c10d._reduce_scatter_base_.default:
            # The simulation stands for gloo ranks: gloo reduce-scatters a flat copy of the input
            # (ProcessGroupGloo::_reduce_scatter_base -> reduce_scatter flattens its inputs), which the
            # real measurement sees until the result is copied out; the fake process group allocates
            # nothing, so the copy is added here, for that moment.
            copy = torch.empty_like(args[1])
            self.track(copy)
            del copy
        return out


def _fake_scalar(t: torch.Tensor):
    """A stand-in for `.item()` of a fake tensor (loss.item(), Adam's step count): memory does not depend
    on the value; 1 keeps Adam's bias corrections finite."""
    return True if t.dtype == torch.bool else 1 if not t.dtype.is_floating_point else 1.0


class _FakeScalars(TorchDispatchMode):
    """Outside the tracked steps of a simulation, the same `.item()` stand-in."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            return _fake_scalar(args[0])
        return func(*args, **(kwargs or {}))


class WrapError(ValueError):
    """The model cannot be wrapped as asked (no blocks to fully_shard)."""


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a decoder: the longest ModuleList / Sequential of modules of one class."""
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) and len(module):
            kids = list(module)
            if len({type(k) for k in kids}) == 1 and any(True for _ in kids[0].parameters()) and len(kids) > len(best):
                best = kids
    return best


def make_mesh(pspec: ParallelSpec, device: torch.device):
    """The 1-D data-parallel mesh, on the run's device type explicitly (PyTorch issue #132471: the default
    may pick CUDA). Built outside FakeTensorMode: the mesh computes its coordinates on real tensors."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (pspec.world_size,))


def wrap_model(model: torch.nn.Module, pspec: ParallelSpec, device: torch.device, mesh=None) -> torch.nn.Module:
    if pspec.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Defaults: bucket_cap_mb=25 (the first bucket 1 MiB), gradient_as_bucket_view=False.
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                   gradient_as_bucket_view=pspec.gradient_as_bucket_view)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    from ..models import TORCH_DTYPES

    blocks = transformer_blocks(model)
    if not blocks:
        raise WrapError("cannot apply FSDP: the model has no repeated blocks to fully_shard")
    mesh = mesh if mesh is not None else make_mesh(pspec, device)
    mp = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES.get(pspec.mp_param_dtype),
                              reduce_dtype=TORCH_DTYPES.get(pspec.mp_reduce_dtype))
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if pspec.cpu_offload else OffloadPolicy()
    kw = dict(mesh=mesh, mp_policy=mp, offload_policy=offload)
    for block in blocks:
        fully_shard(block, reshard_after_forward=pspec.reshard_after_forward, **kw)
    # The root: torchtitan keeps it unsharded after forward only when the last block is too (the
    # output head's all-gather would be redone at once by the backward); FSDP2's default for the root
    # is the same: its parameters stay unsharded between forward and backward.
    fully_shard(model, reshard_after_forward=pspec.reshard_after_forward, **kw)
    return model


class SimulatedReducer:
    """DDP's gradient buckets on fake tensors, where the C++ Reducer cannot run (it needs real storage).

    The buckets are those the Reducer rebuilds after the first step: parameters in the order their
    gradients become ready (the reverse of registration, as DDP assumes), grouped by the same C++
    dist._compute_bucket_assignment_by_size with the default caps (1 MiB first, then 25 MiB), one flat
    tensor each, alive as long as the model. As the Reducer's autograd hook does (reducer.cpp
    mark_variable_ready_dense), each gradient is copied into its bucket view when it is ready; with
    gradient_as_bucket_view the .grad becomes that view. The all-reduce works in place on the bucket,
    so it adds nothing here; under the fake process group it would do nothing anyway."""

    def __init__(self, model: torch.nn.Module, as_view: bool):
        import torch.distributed as dist

        self.as_view = as_view
        order = [p for p in model.parameters() if p.requires_grad][::-1]
        meta = [torch.empty(p.shape, dtype=p.dtype, device="meta") for p in order]
        indices, _ = dist._compute_bucket_assignment_by_size(
            meta, [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20], [False] * len(meta))
        self.buckets: list[torch.Tensor] = []
        for idx in indices:
            params = [order[i] for i in idx]
            flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
            offset = 0
            for p in params:
                view = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(lambda param, v=view: self._ready(param, v))
            self.buckets.append(flat)

    def _ready(self, param: torch.Tensor, view: torch.Tensor) -> None:
        view.copy_(param.grad)
        if self.as_view:
            param.grad = view


def mesh_tensors(mesh) -> list[torch.Tensor]:
    """What a DeviceMesh holds in tensors: its rank map, `torch.arange(world, dtype=torch.int)` built on the
    CPU whatever the device (torch/distributed/device_mesh.py init_device_mesh), 4 bytes per rank, alive
    as long as the mesh (the sharded parameters' DTensor specs hold it)."""
    if mesh is None:
        return []
    rank_map = getattr(mesh, "_rank_map", None)
    return [rank_map] if isinstance(rank_map, torch.Tensor) else []


def build_step(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec, device: torch.device,
               mesh=None, simulated: bool = False) -> TrainingStep:
    step = TrainingStep(cfg, spec)
    step.mesh = None
    if simulated and pspec.parallel == "ddp":  # the C++ Reducer cannot run on fake tensors
        step.reducer = SimulatedReducer(step.model, pspec.gradient_as_bucket_view)
        return step
    if pspec.parallel in ("tp", "fsdp+tp"):
        from .tensor_parallel import make_tp_mesh, with_loss_parallel, wrap_tp

        step.mesh = mesh if mesh is not None else make_tp_mesh(pspec, device)
        step.model = wrap_tp(step.model, pspec, step.mesh, transformer_blocks(step.model))
        step.optimizer = make_optimizer(step.model.parameters(), spec)
        if pspec.loss_parallel:
            with_loss_parallel(step)
        return step
    if pspec.parallel == "fsdp" and mesh is None:
        mesh = make_mesh(pspec, device)
    step.mesh = mesh
    step.model = wrap_model(step.model, pspec, device, mesh)
    # FSDP replaces the parameters by sharded DTensors: the optimizer must hold those (its first
    # instance has no state yet, so nothing is lost).
    step.optimizer = make_optimizer(step.model.parameters(), spec)
    return step


# How many times a tracked step whose buffers were released late by gloo's thread is run again.
LATE_RELEASE_RETRIES = 3


def _any_rank(flag: bool, step: TrainingStep) -> bool:
    """True when `flag` holds on any rank (every rank must run the same steps: their collectives pair up).
    A simulation has no gloo thread, hence no late release."""
    import torch.distributed as dist

    if fake(step) or not dist.is_initialized():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t)
    return bool(t.item())


def fake(step: TrainingStep) -> bool:
    """A simulated step: its parameters are fake tensors, or DTensors whose local shards are (FSDP2, TP). Seeing
    only plain FakeTensors, as planner.routines.fake_mode_of does, took every FSDP2 / TP simulation for a real run:
    _any_rank then all-reduced the late-release flag on the fake process group and read it back with `.item()`,
    whose stand-in (_fake_scalar) is 1, so each simulated rank ran 1 + LATE_RELEASE_RETRIES tracked steps where
    one gives the same bytes (measured: 7 steps a rank, 5 of them tracked, on the 70B FSDP 128 x TP 8 layout)."""
    from torch._subclasses.fake_tensor import FakeTensor

    p = next(step.model.parameters(), None)
    return p is not None and any(isinstance(t, FakeTensor) for t in _leaf_tensors(p))


def fsdp_mem_tracker_peak(step: TrainingStep) -> dict:
    """A third opinion: one more step under torch's own FSDPMemTracker
    (torch/distributed/_tools/fsdp2_mem_tracker.py), its peak and the categories at its peak. Only for
    FSDP2 models; its own bookkeeping (module snapshots) is not part of the figure."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(step.model, FSDPModule):
        return {}
    gc.collect()
    fmt = FSDPMemTracker(step.model, step.optimizer)
    fmt.track_inputs((step.inputs, step.targets))
    with fmt:
        step.run()
    snap = next(iter(fmt.get_tracker_snapshot("peak").values()))
    cats = {str(getattr(k, "value", k)): v for k, v in snap.items()}
    return {"fsdp_mem_tracker_peak_bytes": cats.pop("Total"), "fsdp_mem_tracker_categories": cats}


def steady_attempt(attempts: list[tuple]):
    """Of the tracked steps (peak, recorder, samples, persistent, late_frees), the one that shows the wrapper's own
    schedule: a step in which this rank saw no late release (gloo's worker thread dropping a collective's buffers
    after the step had: planner.measure.distributed.DistLiveBytesTracker._forget), else the one with the lowest
    peak, then the lowest phase peaks (a late release only adds to a step). The whole peak alone does not decide:
    measured on 2 real TP ranks with --sequence-parallel (1 run in 24 under load), the lm_head's logits all-gather
    (its Work holding the 20,480 B local input and the 40,960 B gathered output) was released late and raised the
    loss and backward phases by 61,440 B while the step's peak, the optimizer's, was the same in both attempts, so
    the first, late one was kept. Shared by every layout measured here (DDP, FSDP2, TP, FSDP2 + TP)."""
    return min(attempts, key=lambda a: (a[4] > 0, a[0], sum(a[1].phase_peak.values())))


def _steady_after_one_step(step: TrainingStep) -> bool:
    """A simulated FSDP2 / TP / FSDP2 + TP rank is in its steady state after one step: the first creates the
    optimizer's state and runs FSDP2's lazy init, and on fake tensors nothing else changes from step to step (no
    DDP Reducer rebuilding its buckets, no gloo thread, no allocator). So its second warm-up step is skipped (a
    70B layer stack costs ~10 s of CPU a step). Real ranks and DDP's simulation keep both warm-up steps."""
    return fake(step) and getattr(step, "mesh", None) is not None and not hasattr(step, "reducer")


def _tracked_step(step: TrainingStep, tracker: DistLiveBytesTracker, device: torch.device) -> tuple:
    """One step under the tracker with its phases recorded: (peak, recorder, samples, bytes at its start, late frees)."""
    tracker.reset_peak()
    tracker.late_frees = tracker.late_free_bytes = 0
    tracker.samples = []
    persistent = tracker.current
    recorder = _PhaseRecorder(tracker, device)
    tracker.recording = True
    tracker.t0 = time.perf_counter()
    with tracker:
        step.run(on_phase=recorder)
    tracker.recording = False
    gc.collect()
    return max(recorder.phase_peak.values()), recorder, tracker.samples, persistent, tracker.late_frees


def _run_steps(step: TrainingStep, tracker_factory: Callable[[], DistLiveBytesTracker], emit, rank: int,
               timed: bool, device: torch.device, max_timeline_points: int, third_opinion: bool = False) -> dict:
    result: dict = {"rank": rank, "device": str(device)}
    say = emit if rank == 0 else (lambda e: None)
    say({"event": "progress", "stage": "warm-up steps", "fraction": 0.2})
    short = _steady_after_one_step(step)
    step.run()
    if not short:
        step.run()  # DDP rebuilds its buckets in this step's forward (both sets alive for a moment)
    gc.collect()
    if timed:
        say({"event": "progress", "stage": "timed step", "fraction": 0.4})
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        rss_before = procmem.read_status()
        procmem.reset_peak_rss()
        t0 = time.perf_counter()
        step.run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        result["step_time_s"] = time.perf_counter() - t0
        rss_after = procmem.read_status()
        result.update({"rss_before_bytes": rss_before.get("VmRSS", 0), "peak_rss_bytes": rss_after.get("VmHWM", 0)})
        if device.type == "cuda":
            result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    gc.collect()

    say({"event": "progress", "stage": "tracked steps", "fraction": 0.6})
    extra = mesh_tensors(getattr(step, "mesh", None))
    tracker = tracker_factory()
    tracker.track(step.persistent_tensors(), extra)
    start = tracker.current
    if short:  # recorded as a tracked step is: it is one when nothing outlives it (below)
        first = _tracked_step(step, tracker, device)
    else:
        with tracker:  # finds what outlives a step (DDP's buckets)
            step.run()
        gc.collect()
    discovered = tracker.current - _bytes_of(step.persistent_tensors() + extra)
    attempts = []
    if short and discovered == 0 and tracker.current == start:
        # The step started from what lives across steps and left exactly that: the next step would start from the
        # same tensors and run the same ops on the same shapes (fake tensors, no gloo thread), so it is the
        # tracked step (simulate_rank: 2 steps instead of 4; the records' bytes unchanged, tested).
        attempts.append(first)
    for attempt in range(0 if attempts else 1 + LATE_RELEASE_RETRIES):
        attempts.append(_tracked_step(step, tracker, device))
        if not _any_rank(tracker.late_frees > 0, step):
            break
        # A buffer outlived FSDP2's release on gloo's thread, maybe while the step peaked: a timing of the CPU
        # backend, not the schedule. The step is measured again, up to LATE_RELEASE_RETRIES times, and
        # steady_attempt picks the step that shows the schedule.
    _, recorder, samples, persistent, late = steady_attempt(attempts)
    tracker.samples = samples
    peak_phase = max(recorder.phase_peak, key=recorder.phase_peak.get)
    opt = [v for st in step.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    result.update({
        "tracked_peak_bytes": max(recorder.phase_peak.values()),
        "peak_phase": peak_phase,
        "phase_peak_bytes": {p: recorder.phase_peak.get(p, 0) for p in PHASES},
        "persistent_bytes": persistent,
        "params_bytes": _bytes_of(list(step.model.parameters())),
        "optimizer_bytes": _bytes_of(opt),
        "comm_buffers_bytes": discovered,
        "mesh_bytes": _bytes_of(extra),
        "timeline": downsample(tracker.samples, max_timeline_points),
    })
    if len(attempts) > 1:
        result.update({"tracked_steps": len(attempts), "late_release_peak_bytes": max(a[0] for a in attempts)})
    if third_opinion and device.type == "cpu" and not fake(step):
        result.update(fsdp_mem_tracker_peak(step))
    result["peak_bytes"] = result["peak_allocated_bytes"] if device.type == "cuda" and timed else result["tracked_peak_bytes"]
    return result


def _bytes_of(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        for leaf in _leaf_tensors(t):
            st = leaf.untyped_storage()
            seen[id(st)] = st.nbytes()
    return sum(seen.values())


def measure_rank(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec, rank: int,
                 emit: Callable[[dict], None] = lambda e: None, max_timeline_points: int = 600,
                 third_opinion: bool = False) -> dict:
    """One real rank; the process group is initialised by the caller."""
    device = torch.device(f"cuda:{rank % max(1, torch.cuda.device_count())}") if spec.device_type == "cuda" \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    spec = _on_device(spec, device)
    emit({"event": "progress", "stage": "build", "fraction": 0.05}) if rank == 0 else None
    step = build_step(cfg, spec, pspec, device)
    return _run_steps(step, DistLiveBytesTracker, emit, rank, True, device, max_timeline_points, third_opinion)


def _on_device(spec: TrainSpec, device: torch.device) -> TrainSpec:
    from dataclasses import replace

    return replace(spec, device=str(device))


@contextmanager
def fake_world(rank: int, world_size: int):
    """A fake process group of `world_size` ranks seen from `rank` (collectives do nothing)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()



def simulate_rank(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec | None, rank: int = 0,
                  max_timeline_points: int = 600) -> dict:
    """Rank `rank` of `pspec.world_size` on fake tensors: the same steps and tracker as measure_rank.
    pspec None simulates the run on one device (no process group, no wrapper)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .simulate import real_run_branches

    if spec.device_type != "cpu":
        raise ValueError("simulation runs on the CPU (fake CUDA kernels need a CUDA build)")
    device = torch.device("cpu")
    world = fake_world(rank, pspec.world_size) if pspec is not None else nullcontext()
    with world, _steps_never_skipped(), _mesh_ops_real(), _fsdp_chunks_lazy():
        mesh = None
        if pspec is not None and pspec.parallel == "fsdp":
            mesh = make_mesh(pspec, device)
        elif pspec is not None and pspec.parallel in ("tp", "fsdp+tp"):
            from .tensor_parallel import make_tp_mesh

            mesh = make_tp_mesh(pspec, device)
        with FakeTensorMode(allow_non_fake_inputs=True), _FakeScalars():
            step = build_step(cfg, spec, pspec, device, mesh, simulated=True) if pspec else TrainingStep(cfg, spec)
            with real_run_branches():  # transformers takes its real-tensor branches (planner.measure.simulate)
                result = _run_steps(step, lambda: DistLiveBytesTracker(fake_scalars=True), lambda e: None, rank, False,
                                    device, max_timeline_points)
    result["simulated"] = True
    return result


@contextmanager
def _mesh_ops_real():
    """FSDP2 over TP DTensors concatenates the dp and tp meshes inside fully_shard (_fsdp_param.py
    _init_sharding_spec_tp -> DeviceMesh._concatenate), which computes the rank's coordinates with
    `(mesh == rank).nonzero()`, an op fake tensors cannot run (its output shape depends on the data). A mesh is
    bookkeeping of a few ints on the CPU, made on real tensors as outside the simulation."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    orig = DeviceMesh.__dict__["_concatenate"]

    def concatenate(device_mesh_list):
        with unset_fake_temporarily():
            return orig.__func__(device_mesh_list)

    DeviceMesh._concatenate = staticmethod(concatenate)
    try:
        yield
    finally:
        DeviceMesh._concatenate = orig


class _LazyChunks:
    """FSDP2's `_chunk_with_empty(tensor, num_chunks, dim)` (torch/distributed/fsdp/_fully_shard/_fsdp_common.py:
    `torch.chunk`, padded with empty tensors to num_chunks) made one chunk at a time, when indexed: FSDP2 reads only
    chunks[0] (the padded size) and chunks[its rank] (_fsdp_param.py _init_sharded_param,
    _init_sharded_post_forward_param_metadata). On fake tensors every one of torch.chunk's views is a FakeTensor to
    build: measured on the 70B shape at dp 128 (16 layers, cProfile), 294 calls took 10.9 s of a rank's 110 s, all
    but 2 of the 128 views of each thrown away. Chunk i is torch.chunk's: `narrow(dim, i * c, min(c, size - i * c))`
    with c = ceil(size / num_chunks) (ATen's chunk -> split -> narrow), an empty tensor past the last one."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int):
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim
        self.size = tensor.size(dim)
        self.step = -(-self.size // num_chunks)

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, i: int) -> torch.Tensor:
        if not isinstance(i, int) or not -self.num_chunks <= i < self.num_chunks:
            raise IndexError(i)
        i %= self.num_chunks
        start = i * self.step
        if start >= self.size:
            return self.tensor.new_empty(0)
        return self.tensor.narrow(self.dim, start, min(self.step, self.size - start))

    def __iter__(self):
        return (self[i] for i in range(self.num_chunks))


@contextmanager
def _fsdp_chunks_lazy():
    """_LazyChunks in place of FSDP2's _chunk_with_empty while a simulation builds its model (fake tensors only; a
    tensor of size 0 on the dim keeps torch.chunk's own answer)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    orig = _fsdp_param._chunk_with_empty

    def chunk(tensor, num_chunks, dim):
        return _LazyChunks(tensor, num_chunks, dim) if tensor.size(dim) > 0 else orig(tensor, num_chunks, dim)

    _fsdp_param._chunk_with_empty = chunk
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = orig


@contextmanager
def _steps_never_skipped():
    """GradScaler skips optimizer.step() when its inf check (a `.item()`, a stand-in value on fake
    tensors) says so; a steady-state step has finite gradients, so the simulation always steps."""
    from torch.amp.grad_scaler import GradScaler

    orig = GradScaler._maybe_opt_step
    GradScaler._maybe_opt_step = lambda self, optimizer, optimizer_state, *a, **kw: optimizer.step(*a, **kw)
    try:
        yield
    finally:
        GradScaler._maybe_opt_step = orig


def simulate(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec | None,
             emit: Callable[[dict], None] = lambda e: None) -> dict:
    """Every distinct rank of the run, simulated: ranks whose shards have the same shapes hold the same
    bytes (planner.estimate.distributed rank runs; DDP ranks are all alike), so one of each run is
    simulated and stands for the run (its "ranks_like_this"). The record has measure's keys."""
    from ..distributed import combine_ranks
    from ..estimate.distributed import param_order, rank_runs

    if pspec is None:
        runs = [(0, 0, 0)]
    elif pspec.parallel == "ddp":
        runs = [(0, pspec.world_size - 1, 0)]
    elif pspec.parallel in ("tp", "fsdp+tp"):
        from ..estimate.tensor_parallel import tp_rank_runs

        runs = tp_rank_runs(cfg, pspec)
    else:
        runs = [(a, b, a) for a, b in rank_runs(list(param_order(cfg)), pspec.world_size)]
    records = []
    done: dict[int, dict] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    fresh_cpu, fresh_rss, fresh_cpus = 0.0, 0, []
    reps = list(dict.fromkeys(rep for _, _, rep in runs))
    fresh = reps[1:] if pspec is not None and pspec.parallel in ("tp", "fsdp+tp") else []
    with _FreshRanks(cfg, spec, pspec, fresh) as pending:
        for i, (first, last, rep) in enumerate(runs):
            emit({"event": "progress", "stage": f"simulating rank {rep}", "fraction": 0.1 + 0.9 * i / len(runs)})
            if rep not in done:  # a rank stands for every rank with the same shards (2-D meshes repeat them)
                if rep in fresh:
                    done[rep], cpu, rss = pending.result(rep)
                    fresh_cpu, fresh_rss = fresh_cpu + cpu, max(fresh_rss, rss)
                    fresh_cpus.append(cpu)
                else:
                    done[rep] = simulate_rank(cfg, spec, pspec, rep)
            rec = {**done[rep], "rank": first}
            rec["ranks_like_this"] = [first, last]
            records.append(rec)
    out = combine_ranks(records)
    out["world_size"] = pspec.world_size if pspec else 1
    out["simulated"] = True
    # The simulation's own cost: wall time of the simulated ranks (build + steps), and this process's RSS
    # high-water mark (procmem: VmHWM), for `bench distributed`'s timing of a large world.
    out["simulation_wall_s"] = time.perf_counter() - t0
    # CPU time of this process and of the fresh ones (what a loaded machine does not inflate); the largest RSS
    out["simulation_cpu_s"] = time.process_time() - c0 + fresh_cpu
    # each process's own: this one's first, then the fresh ones' (run beside it where there are cores: _FreshRanks);
    # on an idle machine with a core each, the wall time is about the largest of them
    out["simulation_process_cpu_s"] = [time.process_time() - c0] + fresh_cpus
    out["simulation_concurrent_processes"] = 1 + min(len(fresh), max(0, len(os.sched_getaffinity(0)) - 1))
    out["simulation_load_avg_1min"] = os.getloadavg()[0]
    out["simulation_peak_rss_bytes"] = max(procmem.read_status().get("VmHWM", 0), fresh_rss)
    out["simulated_ranks"] = len(done)
    return out


def _simulate_rank_in_child(cfg_dict: dict, spec_dict: dict, pspec_dict: dict, rank: int) -> tuple[dict, float, int]:
    """The rank's record, the child's CPU time since it started (its imports of torch and transformers included:
    the cost of a fresh process, paid beside the first rank) and its RSS high-water mark."""
    rec = simulate_rank(config_from_dict(cfg_dict), TrainSpec(**spec_dict), ParallelSpec(**pspec_dict), rank)
    return rec, time.process_time(), procmem.read_status().get("VmHWM", 0)


class _FreshRanks:
    """The further distinct ranks of a TP layout, each in a fresh process (see _simulate_rank_fresh), started before
    this process simulates its own rank so that they run beside it, as many at once as this process has cores
    beside its own (os.sched_getaffinity, minus one); on one core they run one after the other, after it, as before.
    A 70B FSDP 128 x TP 8 layout has two (ranks 0 and 1,000: FSDP2's last dp shards are shorter), each ~40 s of
    CPU: side by side on 2 idle cores the wall time is one rank's, not two. CPU time and RSS are each process's own."""

    def __init__(self, cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec | None, ranks: list[int]):
        self.args = (cfg, spec, pspec)
        self.ranks = ranks
        self.pool = None
        self.jobs: dict = {}

    def __enter__(self):
        import multiprocessing as mp
        from dataclasses import asdict

        from ..config import config_to_dict

        beside = len(os.sched_getaffinity(0)) - 1
        if self.ranks and beside > 0:
            cfg, spec, pspec = self.args
            self.pool = mp.get_context("spawn").Pool(min(len(self.ranks), beside))
            payload = (config_to_dict(cfg), asdict(spec), asdict(pspec))
            self.jobs = {r: self.pool.apply_async(_simulate_rank_in_child, (*payload, r)) for r in self.ranks}
        return self

    def result(self, rank: int) -> tuple[dict, float, int]:
        if rank in self.jobs:
            return self.jobs[rank].get()
        return _simulate_rank_fresh(*self.args, rank)

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate() if exc[0] is not None else self.pool.close()
            self.pool.join()
        return False


def _simulate_rank_fresh(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec, rank: int) -> tuple[dict, float, int]:
    """Another rank of a TP layout, simulated in a fresh process (multiprocessing spawn): after a first fake world is
    destroyed, DTensor's redistribution over a new 2-D mesh still names the first world's process groups (measured:
    "Could not resolve the process group registered under the name 3" in the second rank's forward, with the sharding
    and redistribution caches cleared), so every further distinct rank starts from a new interpreter."""
    import multiprocessing as mp
    from dataclasses import asdict

    from ..config import config_to_dict

    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_simulate_rank_in_child, (config_to_dict(cfg), asdict(spec), asdict(pspec), rank))


def _simulate_main(payload: dict) -> int:
    cfg = config_from_dict(payload["config"])
    spec = TrainSpec(**payload["spec"])
    pspec = ParallelSpec(**payload["parallel"]) if payload.get("parallel") else None

    def emit(event: dict) -> None:
        print(json.dumps(event), flush=True)

    try:
        result = simulate(cfg, spec, pspec, emit)
    except WrapError as exc:
        emit({"event": "error", "error": str(exc), "phase": "setup"})
        return EXIT_INVALID
    emit({"event": "result", **result})
    return 0


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    if argv and argv[0] == "--simulate":
        return _simulate_main(json.loads(argv[1]))
    payload = json.loads(argv[0])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cfg = config_from_dict(payload["config"])
    spec = TrainSpec(**payload["spec"])
    pspec = ParallelSpec(**payload["parallel"])

    def emit(event: dict) -> None:
        print(json.dumps({**event, "rank": rank}), flush=True)

    if spec.device_type == "cuda" and torch.cuda.device_count() < world:
        emit({"event": "error", "error": f"{world} ranks need {world} CUDA devices; this machine has "
                                          f"{torch.cuda.device_count()}", "phase": "setup"})
        return EXIT_INVALID
    # N ranks share this machine's cores: more intra-op threads than cores makes every rank crawl.
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    backend = "nccl" if spec.device_type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=float(payload.get("pg_timeout_s", 300))))
    try:
        result = measure_rank(cfg, spec, pspec, rank, emit, third_opinion=bool(payload.get("third_opinion")))
    except WrapError as exc:
        emit({"event": "error", "error": str(exc), "phase": "setup"})
        return EXIT_INVALID
    except BaseException as exc:  # noqa: BLE001 - one JSON line, then exit 3
        from .worker import _is_oom

        emit({"event": "error", "error": f"{'out of memory: ' if _is_oom(exc) else ''}{type(exc).__name__}: "
                                         f"{str(exc).splitlines()[0][:300] if str(exc) else ''}",
              "phase": "train", "oom": _is_oom(exc)})
        return EXIT_FAILED
    dist.barrier()
    dist.destroy_process_group()
    emit({"event": "result", **result})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
