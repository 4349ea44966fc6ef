"""Simulate one training step on fake tensors: its exact live-tensor peak at any size, without the memory.

Child side (imports torch): `python -m planner simulate train ...` runs this in planner.measure.worker
(payload kind "simulate"); tests call `simulate_training` in-process.

The step is the one `measure` runs (planner.routines.training.TrainingStep, or ModuleTrainingStep for a
user's `--module`), built and run inside `torch._subclasses.fake_tensor.FakeTensorMode`: the model's
parameters, the batch, every activation, gradient and optimizer state are FakeTensors, which carry real
shapes, dtypes, devices and lifetimes but no data (their storages are on the meta device: nothing is
allocated). As in planner.measure.training, step 1 warms up (creates the optimizer state) and step 2 runs
under planner.measure.tracker.LiveBytesTracker, which keys live storages by the storage object (id +
weakref), so it works on fakes. Fake-tensor kernels choose the same decompositions as the real ones, so
the live bytes op by op are those of the real step: on the accuracy grid simulated == measured, to the byte.

Data-dependent calls. A fake tensor has no value, so `Tensor.item()` / `bool(t)` (the aten op
`_local_scalar_dense`) cannot be answered by FakeTensorMode. _Answers, a dispatch mode stacked above
FakeTensorMode during the steps, answers exactly the reads a training step makes, and nothing else:

- the optimizer's `step` count (Adam/AdamW's for-loop and foreach paths read it through
  `torch.optim.optimizer._get_value` for the bias corrections): recognised by identity (it is
  `optimizer.state[p]["step"]`), answered with the number of `optimizer.step()` calls so far (counted by a
  step pre-hook), i.e. its real value. It only feeds Python-float bias corrections.
- GradScaler's inf/NaN check (`GradScaler._maybe_opt_step` sums `found_inf.item()` over devices):
  recognised by identity (the tensors in the scaler's `found_inf_per_device`), answered 0.0, "no overflow",
  so `optimizer.step()` runs as in every steady-state step of a measurement (an overflow step skips it and
  holds less).
- transformers' packed-sequence check (masking_utils.find_packed_sequence_indices, recognised by its
  caller): answered True, "no packed sequences", as the model's own arange position ids give in the real step.
- `loss.item()` in TrainingStep.run (recognised by its caller, planner/routines/training.py): answered 0.0;
  it only feeds the step's returned loss total.

Tracing checks. transformers asks `is_tracing(t)` (transformers/utils/import_utils.py), which is True for a
FakeTensor, and then takes the branch a `torch.export` needs: masking_utils.sdpa_mask builds the (b,1,s,s)
causal mask instead of leaving it to SDPA's is_causal, which the real step never does (measured: +512 B in
the forward and +10,752 B in the backward of a 2-layer Llama under SDPA + checkpointing, b2 s16). While the
steps run, `real_run_branches` has transformers' is_tracing answer as it does for a real tensor (dynamo, jit,
fx proxies and stream capture still count); it is put back afterwards.

`_local_scalar_dense` produces a Python number, not a tensor, so answering it allocates nothing, and none of
the answers changes which ops run. Any other data-dependent read (a model that branches on a tensor's value)
and any op that fake tensors cannot run (nonzero, masked_select, an op with no fake kernel) stops the
simulation with SimulationError naming the op and the line that called it: the planner does not guess.
No torch function or class is patched, with one exception (below).

Grouped GEMM on the CPU (Mixture-of-Experts). transformers 5.23 runs MoE experts through
`integrations/moe.py::grouped_mm_experts_forward` ("grouped_mm", the default `_experts_implementation`), which on
a CPU with torch > 2.10 calls `torch.nn.functional.grouped_mm` = `aten._grouped_mm` in the parameters' dtype (it
casts the input with `input.to(weight.dtype)`, so fp32 under fp32 and bf16-AMP training, whose weights are
fp32). The real CPU kernel runs fp32, fp16 and bf16 (measured: the output has mat_a's dtype and shape, contiguous;
mixed dtypes and another out_dtype are refused). The fake kernel, `torch/_meta_registrations.py::
_meta_grouped_mm_common`, transcribes the CUDA kernel's checks and refuses anything but bf16, so the fake step
stopped where the real one runs. `cpu_grouped_mm_meta` (while the steps run, device cpu only) lets the meta
function run its checks on bf16 stand-ins of the same shapes and strides, then returns
`_create_grouped_mm_output_tensor` in mat_a's own dtype (same shape and contiguous strides as the CPU kernel's
output): what is allocated is the CPU kernel's, the only thing dropped is the bf16-only dtype check when both
operands share a floating dtype. Routing experts another way (transformers' "eager" per-expert loop, or its
`grouped_mm_fallback`) would simulate a different step from the one measured.

Normalisation statistics on the CPU. Under autocast a bf16 activation meets fp32 BatchNorm / GroupNorm /
LayerNorm parameters; the CPU kernels then keep their statistics in float32 where the fake kernels keep the
input's dtype. `CpuKernelDtypes` (planner/measure/cpu_kernels.py, stacked under the tracker) returns the CPU
kernels' dtypes (measured: a CNN's BatchNorm statistics were 2 * 2 * C bytes short per layer before).

Deep copies. `copy.deepcopy` of a module built on fake tensors (nn.TransformerEncoder clones its layer so, as
do many users' models) copies each FakeTensor's `__dict__`, its `fake_mode` included: the copies belong to a
new FakeTensorMode, which the simulation's mode then treats as foreign inputs and converts op by op, so every
view of a copied weight (the `t()` a Linear takes) got a storage of its own and the tracker counted each as new
memory (measured: a 2-layer ViT's fp32 step simulated 393,216 B high, 65,536 B per Linear). After the model is
built, `adopt_fake_tensors` gives those parameters and buffers the simulation's own mode back; nothing is
allocated or changed otherwise.

The record has measure_training's keys where they exist in a simulation (peak_bytes, tracked_peak_bytes,
peak_phase, phase_peak_bytes, persistent_bytes, optimizer_bytes, timeline, device), plus "kind":
"simulate", the simulator's own cost (sim_time_s, sim_peak_rss_bytes: the process's VmHWM, torch
included) and the answered reads (data_dependent_reads). The timeline's x is "op" (the op's index in the
step), not time: a fake step's timing says nothing about the real one. There is no step time and no RSS of
the step. On CUDA (a CUDA build of torch with a GPU) the figure is live tensor bytes as on the CPU, not the
caching allocator's rounded counter.
"""
from __future__ import annotations

import contextlib
import gc
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from torch._subclasses import fake_tensor as _fake
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..config import ModelConfig
from ..routines import training as _training_routine
from ..spec import TrainSpec
from . import procmem
from .cpu_kernels import CpuKernelDtypes  # the CPU normalisation kernels' stats dtypes (issue #20)
from .tracker import LiveBytesTracker
from .training import PHASES, _PhaseRecorder, downsample, finish_log, host_figures, start_log, stop_log

_TRAINING_FILE = str(Path(_training_routine.__file__).resolve())
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_aten = torch.ops.aten


class SimulationError(ValueError):
    """The step cannot be simulated on fake tensors (or the user's module is unusable); one line."""


def cuda_problem(device: str) -> str | None:
    """Why `device` cannot be simulated here, or None. A CPU build of torch aborts the whole process when it
    dispatches some fake CUDA kernels (SDPA: "PyTorch is not linked with support for cuda devices"), so this
    is checked before any fake CUDA tensor exists."""
    if not device.startswith("cuda"):
        return None
    if not torch.backends.cuda.is_built():
        return (f"simulate --device cuda needs a CUDA build of torch; this one ({torch.__version__}) is CPU-only "
                "and aborts on fake CUDA kernels (PyTorch is not linked with support for cuda devices)")
    if not torch.cuda.is_available():
        return "simulate --device cuda needs a CUDA device, and none is available on this machine"
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        return f"no CUDA device {index}: this machine has {torch.cuda.device_count()}"
    return None


class _Answers(TorchDispatchMode):
    """Answers the data-dependent reads of a training step (see the module docstring); refuses the rest."""

    def __init__(self, step):
        super().__init__()
        self.step = step
        self.optimizer_steps = 0
        self.reads = {"optimizer_step_count": 0, "gradscaler_found_inf": 0, "loss_item": 0, "packed_sequence_check": 0}
        step.optimizer.register_step_pre_hook(self._count_step)

    def _count_step(self, *_):
        self.optimizer_steps += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _aten._local_scalar_dense.default:
            return self._answer(args[0])
        return func(*args, **(kwargs or {}))

    def _answer(self, t: torch.Tensor):
        opt = self.step.optimizer  # --offload-optimizer's host optimizers too (planner/routines/offload_optim.py)
        states = opt.all_states() if hasattr(opt, "all_states") else opt.state.values()
        if any(st.get("step") is t for st in states):
            self.reads["optimizer_step_count"] += 1
            return float(self.optimizer_steps)
        scaler = self.step.scaler
        if scaler is not None and any(v is t for st in scaler._per_optimizer_states.values()
                                      for v in st.get("found_inf_per_device", {}).values()):
            self.reads["gradscaler_found_inf"] += 1
            return 0.0
        frame = sys._getframe(2)
        while frame is not None and _internal(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None and str(Path(frame.f_code.co_filename).resolve()) == _TRAINING_FILE:
            self.reads["loss_item"] += 1
            return 0.0
        if frame is not None and _is_packed_check(frame):
            self.reads["packed_sequence_check"] += 1
            return True
        where = f" at {Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}" if frame else ""
        raise SimulationError(f"aten._local_scalar_dense (Tensor.item() or bool(tensor)){where} reads a tensor's "
                              "value, which fake tensors do not have: the step branches on data and cannot be "
                              "simulated")


def _is_packed_check(frame) -> bool:
    """transformers' masking_utils.find_packed_sequence_indices asks whether the position ids restart inside
    a row (packed sequences). The step passes no position ids, so the model makes them with arange: every row
    counts 0..s-1, nothing is packed, and the real step's read says True ("no packing": no packed mask)."""
    return (frame.f_code.co_name == "find_packed_sequence_indices"
            and Path(frame.f_code.co_filename).name == "masking_utils.py")


def _internal(filename: str) -> bool:
    """Frames of torch's own Python code and of the simulator/tracker (skipped to find the caller)."""
    return (filename.startswith(_TORCH_DIR) or filename == __file__ or filename.endswith("measure/tracker.py")
            or filename.endswith("measure/cpu_kernels.py") or filename.startswith("<"))


_FAKE_ERRORS = tuple(getattr(_fake, n) for n in ("DynamicOutputShapeException", "DataDependentOutputException",
                                                   "UnsupportedOperatorException", "UnsupportedFakeTensorException")
                     if hasattr(_fake, n))


def fake_error_message(exc: BaseException) -> str | None:
    """One line for an op fake tensors cannot run (naming the op and the calling line), else None."""
    if not isinstance(exc, _FAKE_ERRORS):
        return None
    from ..routines.user_module import user_frame

    op = getattr(exc, "func", None)
    name = str(op) if op is not None else (str(exc).splitlines() or [type(exc).__name__])[0]
    why = {"DynamicOutputShapeException": "its output's shape depends on tensor values",
           "DataDependentOutputException": "its result depends on tensor values",
           "UnsupportedOperatorException": "it has no fake-tensor (meta) kernel"}.get(type(exc).__name__,
                                                                                     "unsupported on fake tensors")
    where = user_frame(exc.__traceback__)
    return f"the op {name} cannot run on fake tensors ({why}){f' at {where}' if where else ''}"


def simulate_training(cfg: ModelConfig | None, spec: TrainSpec, emit: Callable[[dict], None] = lambda e: None,
                      module: tuple[str, str] | None = None, max_timeline_points: int = 600,
                      trace: bool = False, exports: dict | None = None, allocator_replay: bool | None = None) -> dict:
    """Simulate the step of `cfg` (or of the user's `module` = (path, function name)) under `spec`.

    With `trace`, the record also has "trace": {"ops": [aten op name], "phases": [...], "bytes": [live bytes
    after the op]} for every op of the tracked step (planner.whatif fits these).

    On cuda (or with `allocator_replay`), the build and the warm-up step are logged too and the whole run is
    replayed through the caching allocator (planner/allocator.py): the record gains reserved_peak_bytes,
    fragmentation_bytes and allocator_replay.

    Raises SimulationError (one line) for what cannot be simulated; its `train_phase` says where.
    """
    problem = cuda_problem(spec.device)
    if problem:
        raise SimulationError(problem)
    if spec.optimizer in ("paged-adamw-8bit", "paged-adamw"):
        raise SimulationError(f"{spec.optimizer} cannot be simulated: bitsandbytes allocates its paged states in real "
                              "CUDA unified memory (functional.get_paged, cudaMallocManaged), not as tensors fake "
                              "tensors could stand in for; use measure, or simulate adamw-8bit (the same device state "
                              "plus the paged part)")
    holder: dict = {}
    try:
        return _simulate(cfg, spec, emit, module, max_timeline_points, holder, trace, exports, allocator_replay)
    except SimulationError as exc:
        exc.train_phase = _phase(holder)
        raise
    except BaseException as exc:
        message = fake_error_message(exc)
        if message is None and module is not None and isinstance(exc, Exception):
            from ..routines.user_module import exception_line

            message = f"the module failed in {_phase(holder)}: {exception_line(exc)}"
        if message is None:
            exc.train_phase = _phase(holder)
            raise
        err = SimulationError(message)
        err.train_phase = _phase(holder)
        raise err from None


def _phase(holder: dict) -> str:
    step = holder.get("step")
    return step.current_phase if step is not None else "build"


@contextlib.contextmanager
def real_run_branches():
    """transformers' `is_tracing` without its FakeTensor clause, in every loaded transformers module that
    imported it (see the module docstring, "Tracing checks"); a no-op when transformers is not loaded."""
    utils = sys.modules.get("transformers.utils.import_utils")
    original = getattr(utils, "is_tracing", None)
    if original is None:
        yield
        return

    def is_tracing(tensor=None) -> bool:
        return original(None) or (tensor is not None and (utils.is_torch_fx_proxy(tensor)
                                                          or utils.is_jax_jitting(tensor)))

    holders = [m for name, m in list(sys.modules.items())
               if (name == "transformers" or name.startswith("transformers.")) and getattr(m, "is_tracing", None) is original]
    for m in holders:
        m.is_tracing = is_tracing
    try:
        yield
    finally:
        for m in holders:
            m.is_tracing = original


_GROUPED_MM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the CPU kernel's (measured, torch 2.13)


@contextlib.contextmanager
def cpu_grouped_mm_meta(device: str):
    """`aten._grouped_mm`'s fake kernel as the CPU kernel: any one floating dtype, not bf16 only (see the module
    docstring, "Grouped GEMM on the CPU"); a no-op off the CPU or without the meta function."""
    import torch._meta_registrations as meta

    original = getattr(meta, "_meta_grouped_mm_common", None)
    if torch.device(device).type != "cpu" or original is None or not hasattr(meta, "_create_grouped_mm_output_tensor"):
        yield
        return

    def grouped_mm_common(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                          out_dtype=None, use_fast_accum=False):
        if (scale_a is None and scale_b is None and mat_a.dtype == mat_b.dtype and mat_a.dtype in _GROUPED_MM_DTYPES
                and mat_a.dtype != torch.bfloat16 and out_dtype in (None, mat_a.dtype)):
            def stand_in(t):
                return torch.empty_strided(t.size(), t.stride(), dtype=torch.bfloat16, device="meta")
            original(stand_in(mat_a), stand_in(mat_b), None, None, offs=offs, bias=bias)  # the shape checks
            return meta._create_grouped_mm_output_tensor(mat_a, mat_b, offs, mat_a.dtype)
        return original(mat_a, mat_b, scale_a, scale_b, offs=offs, bias=bias, scale_result=scale_result,
                        out_dtype=out_dtype, use_fast_accum=use_fast_accum)

    meta._meta_grouped_mm_common = grouped_mm_common
    try:
        yield
    finally:
        meta._meta_grouped_mm_common = original


def _simulate(cfg, spec, emit, module, max_timeline_points, holder, trace=False, exports=None,
              allocator_replay=None) -> dict:
    t_start = time.perf_counter()
    emit({"event": "progress", "stage": "build", "fraction": 0.05})
    if allocator_replay is None:
        allocator_replay = spec.device.startswith("cuda")
    runlog = None
    if allocator_replay:  # the build and the warm-up step logged for the allocator replay (planner/allocator.py)
        from .alloc_events import RunLog

        runlog = RunLog()
    logged = runlog.tracking if runlog is not None else contextlib.nullcontext
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        with logged():
            if module is not None:
                from ..routines.user_module import ModuleError, ModuleTrainingStep

                try:
                    step = ModuleTrainingStep(Path(module[0]), module[1], spec, guard=_guard,
                                              input_shape=module[2] if len(module) > 2 else None)
                except ModuleError as exc:
                    raise SimulationError(str(exc)) from None
            else:
                step = _training_routine.TrainingStep(cfg, spec)
        holder["step"] = step
        adopt_fake_tensors(step.model, mode)
        answers = _Answers(step)
        emit({"event": "progress", "stage": "warm-up step", "fraction": 0.2})
        if runlog is not None:
            runlog.mark("step 1")
        with answers, CpuKernelDtypes(), logged() as logger, real_run_branches(), cpu_grouped_mm_meta(spec.device):
            step.run(**({"on_phase": logger.set_phase} if logger is not None else {}))
        gc.collect()
        if runlog is not None:
            runlog.end_warmup()

        emit({"event": "progress", "stage": "tracked step", "fraction": 0.6})
        answers.reads = dict.fromkeys(answers.reads, 0)  # report the tracked step's reads
        tracker = _OpTracker() if trace else LiveBytesTracker()
        # --offload-optimizer: the host's copies and states, counted apart
        tracker.register_host(step.host_tensors() if hasattr(step, "host_tensors") else [])
        tracker.track(step.persistent_tensors())
        tracker.reset_peak()
        persistent = tracker.current
        recorder = _PhaseRecorder(tracker, step.device)
        log = start_log(tracker, step)
        tracked_keys = dict(log.uid_of) if runlog is not None else None  # the initial storages' uids
        tracker.recording = True
        step.pack_scope = tracker.host_scope  # --offload-activations: the host copies counted apart
        try:
            with answers, CpuKernelDtypes(), tracker, real_run_branches(), cpu_grouped_mm_meta(spec.device):
                step.run(on_phase=recorder)
        finally:
            stop_log(tracker, log)  # the global module hooks go, whatever happened
            step.pack_scope = None
        tracker.recording = False
        optimizer_bytes = step.optimizer_state_bytes()
        param_count = sum(p.numel() for p in step.model.parameters())
    peak_phase = max(recorder.phase_peak, key=recorder.phase_peak.get)
    peak = max(recorder.phase_peak.values())
    timeline = downsample([(i, b, phase) for i, (_, b, phase) in enumerate(tracker.samples)], max_timeline_points)
    result = {
        "kind": "simulate",
        "device": str(step.device),
        "peak_bytes": peak,
        "tracked_peak_bytes": peak,
        "peak_phase": peak_phase,
        "phase_peak_bytes": {p: recorder.phase_peak.get(p, 0) for p in PHASES},
        "persistent_bytes": persistent,
        "optimizer_bytes": optimizer_bytes,
        "timeline": [{"op": int(p["t_s"]), "bytes": p["bytes"], "phase": p["phase"]} for p in timeline],
        "ops": len(tracker.samples),
        "param_count": param_count,  # the model's parameters (an "auto" family's inventory is not known otherwise)
        "data_dependent_reads": dict(answers.reads),
        "sim_time_s": time.perf_counter() - t_start,
        "sim_peak_rss_bytes": procmem.read_status().get("VmHWM", 0),
    }
    result.update(host_figures(tracker, spec))
    if runlog is not None:  # what nvidia-smi would show: the caching allocator replayed (planner/allocator.py)
        from .alloc_events import device_capacity, replay_figures

        capacity = device_capacity(step.device) if step.device.type == "cuda" else None
        result.update(replay_figures(log, capacity, runlog.join(log, tracked_keys)))
    if trace:
        result["trace"] = {"ops": tracker.op_names, "phases": tracker.op_phases, "bytes": tracker.op_bytes}
    result.update(finish_log(log, exports, emit))
    emit({"event": "progress", "stage": "done", "fraction": 1.0})
    return result


def adopt_fake_tensors(model: torch.nn.Module, mode: FakeTensorMode) -> int:
    """Give the simulation's fake mode back to parameters and buffers that a deep copy gave a copy of it (see the
    module docstring, "Deep copies"); returns how many were adopted."""
    n = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if isinstance(t, _fake.FakeTensor) and t.fake_mode is not mode:
            t.fake_mode = mode
            n += 1
    return n


class _OpTracker(LiveBytesTracker):
    """The live-bytes tracker that also keeps, for every op, its name and the live bytes after it."""

    def __init__(self):
        super().__init__()
        self.op_names: list[str] = []
        self.op_phases: list[str] = []
        self.op_bytes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.recording:
            self.op_names.append(func.__name__)
            self.op_phases.append(self.phase)
            self.op_bytes.append(self.current)
        return out


def _guard(call: Callable[[], object]) -> object:
    """Run user code; an op fake tensors cannot run becomes an error naming the op (not "make_model() raised")."""
    from ..routines.user_module import ModuleError

    try:
        return call()
    except _FAKE_ERRORS as exc:
        raise ModuleError(fake_error_message(exc)) from None
    except SimulationError as exc:
        raise ModuleError(str(exc)) from None


def worker_main(payload: dict, emit: Callable[[dict], None]) -> int:
    """planner.measure.worker's "simulate" payload: {"kind": "simulate", "spec": {...}, and "config": {...}
    or "module": [path, function], optionally "trace": true}. Exit 0 with a result event; 2 with an error event for what cannot be
    simulated (the CLI's invalid input); an unexpected failure is a traceback (the runner's exit 3)."""
    from ..config import config_from_dict

    spec = TrainSpec(**payload["spec"])
    cfg = config_from_dict(payload["config"]) if payload.get("config") else None
    module = tuple(payload["module"]) if payload.get("module") else None
    if payload.get("points"):
        return _points_main(cfg, spec, module, payload["points"], emit)
    try:
        result = simulate_training(cfg, spec, emit=emit, module=module, trace=bool(payload.get("trace")),
                                   exports=payload.get("exports"))
    except SimulationError as exc:
        emit({"event": "error", "error": str(exc), "phase": getattr(exc, "train_phase", "setup")})
        return 2
    emit({"event": "result", **result})
    return 0


def _points_main(cfg, spec: TrainSpec, module, points, emit: Callable[[dict], None]) -> int:
    """Several (b, s) points of one model and settings, traced, in this one process (planner.whatif's fit: torch
    and the model's code are imported once). Each simulation is independent (a fresh step, a fresh FakeTensorMode).
    Emits {"event": "point", "point": [b, s]} after each, then one result {"traces": [[[b, s], trace], ...]}."""
    import dataclasses

    traces, counts = [], []
    # gc.freeze (Python's gc module): the objects alive now (torch's, transformers', this process's modules) go to a
    # permanent generation that later collections skip, so the simulation's own gc.collect() calls scan only what
    # the points make: measured on a 2-layer OLMo 2 7B point, 0.97 s -> 0.54 s a point, the same trace. Frozen
    # objects are not freed by a collection: only survivors of one are frozen (after each point's collect).
    gc.collect()
    gc.freeze()
    for i, point in enumerate(points):
        b, s = point[0], point[1]
        layers = point[2] if len(point) > 2 else None  # planner.whatif_depth: the model cut to this many layers
        where = f"b={b} s={s}" + (f" with {layers} layers" if layers else "")
        emit({"event": "progress", "stage": f"simulating {where} ({i + 1}/{len(points)})",
              "fraction": i / len(points)})
        point_cfg = cfg
        if layers:
            from ..arch import family_of

            point_cfg = family_of(cfg).with_layers(cfg, int(layers))
        try:
            rec = simulate_training(point_cfg, dataclasses.replace(spec, batch_size=int(b), seq_len=int(s)),
                                    module=module, trace=True)
        except SimulationError as exc:
            emit({"event": "error", "error": str(exc), "phase": getattr(exc, "train_phase", "setup"), "point": point})
            return 2
        traces.append([list(point), rec["trace"]])
        counts.append([list(point), rec.get("param_count")])
        emit({"event": "point", "point": list(point), "peak_bytes": rec["peak_bytes"], "sim_time_s": rec["sim_time_s"],
              "param_count": rec.get("param_count")})
        gc.collect()
        gc.freeze()
    emit({"event": "result", "traces": traces, "param_counts": counts})
    return 0
