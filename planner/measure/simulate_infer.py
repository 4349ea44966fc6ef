"""Simulate one generate() call on fake tensors: its exact live-tensor peak at any size, without the memory.

The call is the one `measure infer` runs (planner.routines.inference.GenerationRun), built and run inside
FakeTensorMode, as planner/measure/simulate.py runs a training step: run 1 warms up, run 2 runs under the
live-bytes tracker. Weights, buffers and the prompt are counted.

Data-dependent reads. generate() reads tensor values (`aten._local_scalar_dense`) that fake tensors do not
have; _InferAnswers, a dispatch mode stacked above FakeTensorMode, answers exactly these, each recognised by
the function that makes it (transformers 5.23 generation/utils.py), and refuses any other:
- `StopCheck.__call__`: `bool(unfinished_sequences.max() == 0)` after each new token. Answered False for
  the first N-1 tokens and True after the N-th, as the real call answers it: min_new_tokens=N keeps EOS out
  (MinNewTokensLengthLogitsProcessor) and MaxLengthCriteria ends every sequence at prompt + N.
- generate's right-padding check `torch.any(attention_mask[:, -1] == 0).item()`: answered False (the mask is
  all ones: no padding); its all-ones check `(model_kwargs["attention_mask"] == 1).all()`, which drops the mask
  when it holds no padding: answered True.
- generate's special-token checks (`_prepare_special_tokens`; MinLength / MinNewTokensLength processors'
  `(eos_token_id < 0).any()`): they only decide whether to log a warning; answered with their real value,
  computed from the generation config's token ids (Python ints).
- _get_logits_processor's `(encoder_input_ids < 0).any()`: answered False (the prompt's ids are drawn from
  [0, vocab_size)); it only decides whether encoder-side penalties apply, and none is set.
- masking_utils._ignore_causal_mask_sdpa's checks whether SDPA's is_causal can replace a mask (`fast_all` of the
  padding mask, a StaticCache's tensor `q_offset == 0`): answered from what the real masks hold (generate's
  2-D mask is all ones over the tokens seen; a StaticCache pads it with zeros to its length; the tensor
  q_offset is the count already cached). See _InferAnswers._mask_read.
- transformers' packed-sequence check (masking_utils.find_packed_sequence_indices): answered True ("not
  packed"), as planner/measure/simulate.py does.
The argmax tokens themselves are never read on the host by greedy decoding: they stay fake tensors
(their values feed only the next embedding lookup, whose bytes do not depend on them). transformers'
is_tracing is answered as for a real tensor (simulate.real_run_branches), so masks are built as in the
real call. No torch function or class is patched, but for aten._grouped_mm's meta function on the CPU (the MoE
experts in fp32 / fp16), exactly as the training simulation runs it (planner/measure/simulate.py cpu_grouped_mm_meta).
"""
from __future__ import annotations

import gc
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..config import ModelConfig
from ..infer_spec import InferSpec
from ..routines.inference import GenerationRun
from . import procmem
from .inference import INFER_PHASES
from .simulate import (SimulationError, _internal, _is_packed_check, cpu_grouped_mm_meta, cuda_problem,
                       fake_error_message, real_run_branches)
from .tracker import LiveBytesTracker
from .training import _PhaseRecorder, downsample

_aten = torch.ops.aten
# Under torch.inference_mode, bool(t) / t.item() reach a dispatch mode as aten.is_nonzero / aten.item (composite
# ops that FakeTensorMode would decompose into _local_scalar_dense below this mode): all three are reads.
_READS = (_aten._local_scalar_dense.default, _aten.item.default, _aten.is_nonzero.default)

__all__ = ["SimulationError", "simulate_inference"]


class _InferAnswers(TorchDispatchMode):
    def __init__(self, ispec: InferSpec):
        super().__init__()
        self.ispec = ispec
        self.stop_checks = 0
        self.reads = {"stop_check": 0, "right_padding_check": 0, "all_ones_mask_check": 0, "packed_sequence_check": 0,
                      "special_token_warning_check": 0, "encoder_input_ids_check": 0,
                      "sdpa_mask_skip_check": 0}
        self._tail = None  # (frame, line) of the mask statement whose first fast_all has been answered

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _READS:
            return self._answer()
        return func(*args, **(kwargs or {}))

    def _answer(self):
        frame = sys._getframe(2)
        while frame is not None and (_internal(frame.f_code.co_filename)
                                     or frame.f_code.co_name == "__torch_dispatch__"):  # stacked modes
            frame = frame.f_back
        name = frame.f_code.co_name if frame is not None else ""
        file = Path(frame.f_code.co_filename).name if frame is not None else ""
        # (co_qualname, not f_locals: reading a running frame's f_locals snapshots its locals into a dict that
        # keeps them alive, which would change what the simulated call holds)
        if file == "utils.py" and frame.f_code.co_qualname.endswith("StopCheck.__call__"):
            self.reads["stop_check"] += 1
            self.stop_checks += 1
            return self.stop_checks >= self.ispec.new_tokens
        if file == "utils.py" and name == "_prepare_generation_config_and_inputs" or (
                file == "utils.py" and "has_right_padding" in frame.f_code.co_varnames):
            import linecache

            # (the statement spans lines: `if (` ... `and (model_kwargs["attention_mask"] == 1).all()` ... `):`)
            stmt = "".join(linecache.getline(frame.f_code.co_filename, frame.f_lineno + i) for i in range(6))
            if 'attention_mask"] == 1).all()' in stmt.split("):")[0]:
                # generate drops an all-ones attention mask (`(model_kwargs["attention_mask"] == 1).all()`):
                # the prompt has no padding, so the real call answers True
                self.reads["all_ones_mask_check"] += 1
                return True
            self.reads["right_padding_check"] += 1
            return False
        if file == "utils.py" and name == "_prepare_special_tokens" or (
                file == "logits_process.py" and name == "__init__" and "eos_token_id" in frame.f_locals):
            self.reads["special_token_warning_check"] += 1
            return _special_tokens_read(frame)
        if file == "utils.py" and name == "_get_logits_processor":
            self.reads["encoder_input_ids_check"] += 1
            return False
        mask_frame = _find(frame, "_ignore_causal_mask_sdpa")
        if mask_frame is not None:
            self.reads["sdpa_mask_skip_check"] += 1
            return self._mask_read(mask_frame)
        if frame is not None and _is_packed_check(frame):
            self.reads["packed_sequence_check"] += 1
            return True
        where = f" at {file}:{frame.f_lineno} in {name}" if frame is not None else ""
        raise SimulationError(f"aten._local_scalar_dense (Tensor.item() or bool(tensor)){where} reads a tensor's "
                              "value, which fake tensors do not have: generate() cannot be simulated here")


    def _mask_read(self, f) -> bool:
        """masking_utils._ignore_causal_mask_sdpa's reads, answered from what the real masks hold: the 2-D
        attention mask generate passes is all ones over the tokens seen so far (`valid`, its width, read in
        sdpa_mask's frame), and a StaticCache pads it with zeros up to the cache length; the static cache's
        tensor q_offset is the number of tokens already cached, valid - q_length."""
        import linecache

        from torch._subclasses.fake_tensor import unset_fake_temporarily

        loc = f.f_locals
        outer = _find(f.f_back, "sdpa_mask")
        # (a sliding window reaches these reads only when it is longer than kv_length: the full-attention case)
        if outer is None or not isinstance(outer.f_locals.get("attention_mask"), torch.Tensor):
            raise SimulationError("a mask read outside the cases modelled (sliding windows, no 2-D mask): "
                                  "generate() cannot be simulated here")
        valid = outer.f_locals["attention_mask"].shape[-1]
        pm, q = loc["padding_mask"], loc["q_length"]
        line = linecache.getline(f.f_code.co_filename, f.f_lineno)
        with unset_fake_temporarily():
            real = torch.arange(pm.shape[-1]) < valid
            if "q_length == 1" in line:
                return bool(real.all())
            if "q_offset == 0" in line:
                return valid - q == 0
            if "fast_all(padding_mask[:, :q_length])" in line:
                if self._tail is not None and self._tail[0] is f:
                    self._tail = None
                    return bool((~real[q:]).all())
                self._tail = (f, f.f_lineno)
                return bool(real[:q].all())
        raise SimulationError(f"an unknown read at masking_utils.py:{f.f_lineno}: generate() cannot be simulated here")


def _find(frame, name: str):
    while frame is not None and frame.f_code.co_name != name:
        frame = frame.f_back
    return frame


def _special_tokens_read(frame) -> bool:
    """generate's _prepare_special_tokens checks its EOS / pad token tensors (`isin(eos, pad).any()`,
    `(eos < 0).any()`) only to decide whether to log a warning: answered with the real value, computed from
    the generation config's token ids (Python ints) with fake tensors off."""
    import linecache

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # the statement may span lines (an `if ... and (` over two): read the call's line and the next
    line = "".join(linecache.getline(frame.f_code.co_filename, frame.f_lineno + i) for i in range(2))
    outer = frame
    while outer is not None and "generation_config" not in outer.f_locals:
        outer = outer.f_back
    if outer is None:
        raise SimulationError("a special-token read outside generate(): cannot be simulated here")
    gc_ = outer.f_locals["generation_config"]
    eos = gc_.eos_token_id if isinstance(gc_.eos_token_id, list) else [gc_.eos_token_id]
    pad = gc_.pad_token_id if gc_.pad_token_id is not None else eos[0]
    with unset_fake_temporarily():
        if "isin" in line:
            return bool(torch.isin(torch.tensor(eos), torch.tensor(pad)).any())
        if "< 0" in line:
            return any(e < 0 for e in eos)
    raise SimulationError(f"an unknown read at {Path(frame.f_code.co_filename).name}:{frame.f_lineno} in "
                          "_prepare_special_tokens: generate() cannot be simulated here")


def simulate_inference(cfg: ModelConfig, ispec: InferSpec, emit: Callable[[dict], None] = lambda e: None,
                       max_timeline_points: int = 600) -> dict:
    problem = cuda_problem(ispec.device)
    if problem:
        raise SimulationError(problem)
    holder: dict = {}
    try:
        return _simulate(cfg, ispec, emit, max_timeline_points, holder)
    except SimulationError as exc:
        exc.train_phase = _phase(holder)
        raise
    except BaseException as exc:
        message = fake_error_message(exc)
        if message is None:
            exc.train_phase = _phase(holder)
            raise
        err = SimulationError(message)
        err.train_phase = _phase(holder)
        raise err from None


def _phase(holder: dict) -> str:
    run = holder.get("run")
    return run.current_phase if run is not None else "build"


def _simulate(cfg, ispec, emit, max_timeline_points, holder) -> dict:
    t_start = time.perf_counter()
    emit({"event": "progress", "stage": "build", "fraction": 0.05})
    with FakeTensorMode(allow_non_fake_inputs=True):
        run = holder["run"] = GenerationRun(cfg, ispec)
        emit({"event": "progress", "stage": "warm-up generate", "fraction": 0.2})
        answers = _InferAnswers(ispec)
        # the MoE experts' aten._grouped_mm in fp32 / fp16 on the CPU: its fake kernel as the CPU kernel, as the
        # training simulation runs it (planner/measure/simulate.py "Grouped GEMM on the CPU"; issue #39's fuzz:
        # qwen3_moe fp32 stopped at the bf16-only meta function)
        with answers, real_run_branches(), cpu_grouped_mm_meta(ispec.device):
            run.run()
        gc.collect()
        emit({"event": "progress", "stage": "tracked generate", "fraction": 0.6})
        answers = _InferAnswers(ispec)
        tracker = LiveBytesTracker()
        tracker.track(run.persistent_tensors())
        tracker.reset_peak()
        persistent = tracker.current
        recorder = _PhaseRecorder(tracker, run.device)
        tracker.recording = True
        with answers, tracker, real_run_branches(), cpu_grouped_mm_meta(ispec.device):
            run.run(on_phase=recorder)
        tracker.recording = False
    peaks = {p: recorder.phase_peak.get(p, 0) for p in INFER_PHASES}
    peak_phase = max(peaks, key=peaks.get)
    timeline = downsample([(i, b, phase) for i, (_, b, phase) in enumerate(tracker.samples)], max_timeline_points)
    result = {"kind": "simulate", "device": str(run.device), "peak_bytes": peaks[peak_phase],
              "tracked_peak_bytes": peaks[peak_phase], "peak_phase": peak_phase, "phase_peak_bytes": peaks,
              "persistent_bytes": persistent,
              "timeline": [{"op": int(p["t_s"]), "bytes": p["bytes"], "phase": p["phase"]} for p in timeline],
              "ops": len(tracker.samples), "data_dependent_reads": dict(answers.reads),
              "sim_time_s": time.perf_counter() - t_start,
              "sim_peak_rss_bytes": procmem.read_status().get("VmHWM", 0)}
    emit({"event": "progress", "stage": "done", "fraction": 1.0})
    return result
