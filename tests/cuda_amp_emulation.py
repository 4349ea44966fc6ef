"""A CUDA-autocast training step emulated on the CPU, for points the H200 records do not reach.

CPU autocast (torch.autocast("cpu")) casts the matmuls as CUDA's does; where the two lists differ for GPT-2's ops
(aten/src/ATen/autocast_mode.cpp; measured on the H200, tests/data/cuda/2026-11-27-h200/autocast-dtypes.json) the
CUDA behaviour is applied by hand for the step's duration:
- pow and softmax without a dtype run in fp32 (CUDA's fp32 list; the CPU's has neither);
- F.cross_entropy runs its composite: log_softmax in the logits' dtype, nll_loss on an fp32 copy (cross_entropy_loss
  is on the CPU's fp32 list, not on CUDA's; nll_loss is on CUDA's);
- dropout is native_dropout's: one output and a saved bool mask (the CPU's multiplies by a saved noise tensor).
The live tensor bytes are planner.measure.tracker's, op by op. tests/test_cuda_gpt2_amp.py checks the emulation
against recorded H200 rows (to the byte) before it trusts it elsewhere."""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F


class _NativeDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        mask = torch.empty(x.shape, dtype=torch.bool).bernoulli_(1 - p)
        ctx.save_for_backward(mask)
        ctx.scale = 1 / (1 - p)
        return x.mul(mask).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g.mul(mask).mul_(ctx.scale), None


@contextlib.contextmanager
def cuda_autocast_lists():
    import transformers.activations as hf_act

    pow_, softmax_, fsoftmax_, ce_, dropout_ = torch.pow, torch.softmax, F.softmax, F.cross_entropy, F.dropout
    gelu_new_ = hf_act.NewGELUActivation.forward

    def on(x):
        return torch.is_autocast_enabled("cpu") and isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16,
                                                                                                 torch.float16)

    def pow_cuda(x, e, *a, **k):
        return pow_(x.float() if on(x) else x, e, *a, **k)

    def softmax_cuda(x, dim=None, *a, **k):
        if on(x) and not a and k.get("dtype") is None:
            x = x.float()
        return softmax_(x, dim, *a, **{kk: v for kk, v in k.items() if kk != "_stacklevel"})

    def ce_cuda(x, t, *a, **k):
        if on(x):
            with torch.autocast("cpu", enabled=False):
                return F.nll_loss(torch.log_softmax(x, -1, dtype=x.dtype).float(), t, *a, **k)
        return ce_(x, t, *a, **k)

    def dropout_cuda(x, p=0.5, training=True, inplace=False):
        return _NativeDropout.apply(x, p) if training and 0 < p < 1 else x

    def gelu_new(self, input):  # transformers' NewGELUActivation, calling the patched torch.pow
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))

    torch.pow, torch.softmax, F.softmax, F.cross_entropy, F.dropout = (pow_cuda, softmax_cuda, softmax_cuda, ce_cuda,
                                                                      dropout_cuda)
    hf_act.NewGELUActivation.forward = gelu_new
    try:
        yield
    finally:
        torch.pow, torch.softmax, F.softmax, F.cross_entropy, F.dropout = pow_, softmax_, fsoftmax_, ce_, dropout_
        hf_act.NewGELUActivation.forward = gelu_new_


def emulated_phase_peaks(cfg, spec) -> dict[str, int]:
    """Live tensor bytes per phase (forward, loss, backward) of one SGD step's forward and backward under the
    emulated CUDA autocast (spec: precision bf16-amp / fp16-amp, batch, sequence, checkpointing, grad_accum)."""
    from planner.arch import family_of
    from planner.arch.base import resolved_loss
    from planner.measure.tracker import LiveBytesTracker

    torch.manual_seed(0)
    fam = family_of(cfg)
    model = fam.build(cfg, "cpu", "float32")
    model.train()
    if spec.checkpointing:
        from planner.routines.checkpointing import enable_policy

        enable_policy(fam, model, spec.checkpoint_policy)
    b, s = spec.batch_size, spec.seq_len
    x, y = torch.randint(0, cfg.vocab_size, (b, s)), torch.randint(0, cfg.vocab_size, (b, s))
    tr = LiveBytesTracker()
    tr.track_module(model)
    tr.track(x, y)
    scale = None
    if spec.precision == "fp16-amp":  # GradScaler's 0-d fp32 scale and int32 growth tracker; backward of loss * scale
        scale, growth = torch.full((), 2.0 ** 16), torch.zeros((), dtype=torch.int32)
        tr.track(scale, growth)
    peaks: dict[str, int] = {}

    def phase(name):
        if tr.phase != "setup":
            peaks[tr.phase] = max(peaks.get(tr.phase, 0), tr.peak)
        tr.set_phase(name)
        tr.reset_peak()

    dtype = torch.bfloat16 if spec.precision == "bf16-amp" else torch.float16
    with cuda_autocast_lists(), tr:
        for _ in range(spec.grad_accum):
            phase("forward")
            with torch.autocast("cpu", dtype=dtype):
                loss = fam.loss(model, x, y, resolved_loss(fam, spec), phase)
            phase("backward")
            (loss if scale is None else loss * scale).backward()
            del loss
        phase("end")
    return peaks


def emulated_saved_bytes(cfg, spec) -> int:
    """The bytes save_on_cpu would copy to the host: every saved tensor the pack hook sees, one copy each (as
    torch/autograd/graph.py save_on_cpu packs them), over one forward and loss under the emulated CUDA autocast."""
    from planner.arch import family_of
    from planner.arch.base import resolved_loss

    torch.manual_seed(0)
    fam = family_of(cfg)
    model = fam.build(cfg, "cpu", "float32")
    model.train()
    b, s = spec.batch_size, spec.seq_len
    x, y = torch.randint(0, cfg.vocab_size, (b, s)), torch.randint(0, cfg.vocab_size, (b, s))
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    dtype = torch.bfloat16 if spec.precision == "bf16-amp" else torch.float16
    with cuda_autocast_lists(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=dtype):
            fam.loss(model, x, y, resolved_loss(fam, spec), lambda _: None)
    return total
