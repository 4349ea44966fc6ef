"""FLOPs of the real training step, counted by torch.utils.flop_counter.FlopCounterMode (child side: imports torch).

What planner/estimate/compute.py is checked against (tests/test_flops.py, docs/plan.md): the step `measure` runs
(planner.routines.training.TrainingStep: transformers' models, peft's LoRA, the checkpointing policies, the fused
losses), on real tiny tensors or, at full size, on fake tensors (the step `simulate` runs, built inside
FakeTensorMode; FlopCounterMode counts from shapes, so fake tensors give the same count).

torch 2.13's FlopCounterMode has no formula for two kernels the CPU step runs, which would count 0:
  aten._scaled_dot_product_flash_attention_for_cpu (+ _backward): counted with torch's own SDPA formulas
      (sdpa_flop_count / sdpa_backward_flop_count), as the CUDA flash / efficient / cuDNN kernels are;
  aten._grouped_mm (MoE's experts, forward and both grads): 2 x rows x contraction x columns over its groups,
      as mm's formula is per group;
and bitsandbytes' custom op for QLoRA's 4-bit forward matmul, torch.ops.bitsandbytes.gemm_4bit (its input A
(..., K) times the dequantized (N, K) weight: 2 x numel(A) x N; bitsandbytes/autograd/_functions.py MatMul4Bit,
whose backward's input grad is a torch.matmul, counted as mm).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                            **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """mat_a x mat_b with groups (offsets) on the token axis: (M, K) x (G, K, N) -> (M, N); the weight grad
    (K, M) x (M, N) -> (G, K, N); batched (G, M, K) x (G, K, N); (G, M, K) x (K, N) -> (M, N)."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    if len(a_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]
    return 2 * a_shape[1] * a_shape[2] * b_shape[1]


_REGISTERED = False


def _gemm_4bit_flop(a_shape, b_shape, shape_b, *args, out_shape=None, **kwargs) -> int:
    numel = 1
    for size in a_shape:
        numel *= size
    return 2 * numel * shape_b[0]


def _register_bnb() -> None:
    """bitsandbytes' gemm_4bit formula (its ops exist once bitsandbytes is imported: a QLoRA step imports it)."""
    import bitsandbytes  # noqa: F401  (registers torch.ops.bitsandbytes)

    op = torch.ops.bitsandbytes.gemm_4bit
    if op not in torch.utils.flop_counter.flop_registry:
        register_flop_formula(op)(_gemm_4bit_flop)


def _register() -> None:
    """Adds the formulas to FlopCounterMode's registry (torch.utils.flop_counter.flop_registry), once."""
    global _REGISTERED
    if not _REGISTERED:
        for op, fn in ((aten._scaled_dot_product_flash_attention_for_cpu, _sdpa_cpu_flop),
                       (aten._scaled_dot_product_flash_attention_for_cpu_backward, _sdpa_cpu_backward_flop),
                       (aten._grouped_mm, _grouped_mm_flop)):
            if op not in torch.utils.flop_counter.flop_registry:
                register_flop_formula(op)(fn)
        _REGISTERED = True


def counter() -> FlopCounterMode:
    _register()
    return FlopCounterMode(display=False)


def count_train_flops(cfg, spec, fake: bool = False) -> dict:
    """{"flops_per_step": total, "by_op": {op: flops}} of one optimizer step of `spec` (TrainingStep.run: every
    micro-batch's forward, loss and backward, the optimizer step). fake: built and run on fake tensors, as simulate
    does (full size without the memory)."""
    from ..routines.training import TrainingStep

    if getattr(spec, "quantize_base", "none") != "none":
        _register_bnb()
    if not fake:
        step = TrainingStep(cfg, spec)
        with counter() as fc:
            step.run()
    else:
        from torch._subclasses.fake_tensor import FakeTensorMode

        from . import simulate as sim

        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            step = TrainingStep(cfg, spec)
            sim.adopt_fake_tensors(step.model, mode)
            answers = sim._Answers(step)
            with answers, sim.CpuKernelDtypes(), sim.real_run_branches(), sim.cpu_grouped_mm_meta(spec.device):
                with counter() as fc:
                    step.run()
    counts = fc.get_flop_counts().get("Global", {})
    return {"flops_per_step": int(sum(counts.values())), "by_op": {str(k): int(v) for k, v in counts.items()}}


def count_infer_flops(cfg, ispec) -> dict:
    """FlopCounterMode's count of one generate() call (planner.routines.inference.GenerationRun, real tensors)."""
    from ..routines.inference import GenerationRun

    if getattr(ispec, "quantize_weights", "none") != "none":
        _register_bnb()
    run = GenerationRun(cfg, ispec)
    with counter() as fc:
        run.run()
    counts = fc.get_flop_counts().get("Global", {})
    return {"flops_per_step": int(sum(counts.values())), "by_op": {str(k): int(v) for k, v in counts.items()}}
