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


# ---------------------------------------------------------------- the check's grids (docs/plan.md, tests/test_flops.py)

def tiny_config(arch: str):
    """(config, batch, seq) of a family's first grid shape (planner/arch/<family>.py grid_configs), or a tiny book
    GPT-2 (it has no grid shapes)."""
    from ..arch import families
    from ..arch.gpt2_book import GPT2Config

    grid = families()[arch].grid_configs()
    if not grid:
        return GPT2Config(vocab_size=1000, context_length=128, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.0), 2, 64
    _, cfg, b, s = grid[0]
    return cfg, b, s


def lora_settings(arch: str) -> dict:
    """LoRA r=4 on peft's default targets for the model type, or all-linear where peft has none ({}: no LoRA)."""
    from ..arch import families

    fam = families()[arch]
    if not fam.lora_supported:
        return {}
    return {"lora_r": 4} if fam.lora_default_targets else {"lora_r": 4, "lora_targets": "all-linear"}


def train_grid(quick: bool = False) -> list[tuple[str, dict]]:
    """(family, TrainSpec fields plus an optional "attention") rows. quick: the test's subset (every family under
    full checkpointing with cce, selective, LoRA under checkpointing; Llama's own rows: eager LoRA, LoRA on k/o only,
    LoRA selective, frozen layers, every:2, chunked-ce with AMP and accumulation)."""
    from ..arch import families

    rows: list[tuple[str, dict]] = []
    for arch, fam in families().items():
        lora = lora_settings(arch)
        if quick:
            rows += [(arch, {"checkpointing": True, "loss": "cce"}),
                     (arch, {"checkpointing": True, "checkpoint_policy": "selective"})]
            rows += [(arch, {**lora, "checkpointing": True})] if lora else []
            continue
        rows += [(arch, {}), (arch, {"checkpointing": True}), (arch, {"checkpointing": True,
                                                                      "checkpoint_policy": "every:2"}),
                 (arch, {"checkpointing": True, "checkpoint_policy": "selective"}), (arch, {"loss": "cce"}),
                 (arch, {"loss": "chunked-ce"}), (arch, {"precision": "bf16-amp", "grad_accum": 2})]
        if lora:
            rows += [(arch, lora), (arch, {**lora, "checkpointing": True})]
        if fam.subset_supported:
            rows.append((arch, {"train_layers": "last:1"}))
    rows += [("llama", {}), ("llama", {"lora_r": 4, "attention": "eager"}),
             ("llama", {"lora_r": 4, "lora_targets": "k_proj,o_proj", "attention": "eager"}),
             ("llama", {"lora_r": 4, "checkpointing": True, "checkpoint_policy": "selective"}),
             ("llama", {"train_layers": "last:1"}), ("llama", {"checkpointing": True, "checkpoint_policy": "every:2"}),
             ("llama", {"loss": "chunked-ce", "precision": "bf16-amp", "grad_accum": 2})]
    unique = dict.fromkeys((a, tuple(sorted(k.items()))) for a, k in rows)
    return [(a, dict(k)) for a, k in unique]


def row_check(arch: str, fields: dict, fake: bool = False, cfg=None, batch=None, seq=None) -> dict:
    """Estimate and FlopCounterMode's count of one row."""
    from ..estimate.compute import train_flops
    from ..spec import TrainSpec, prepare

    fields = dict(fields)
    attention = fields.pop("attention", None)
    if cfg is None:
        cfg, batch, seq = tiny_config(arch)
    spec = TrainSpec(batch_size=batch, seq_len=seq, **fields)
    cfg = prepare(cfg, spec, attention)
    est = train_flops(cfg, spec)
    got = count_train_flops(cfg, spec, fake=fake)
    return {"estimate": est["flops_per_step"], "counted": got["flops_per_step"], "parts": est,
            "error_pct": 100.0 * (est["flops_per_step"] - got["flops_per_step"]) / got["flops_per_step"]}


# Full size on fake tensors (FlopCounterMode counts shapes): six presets, one realistic run each (CPU device: the
# attention kernel counts as CUDA's fused ones do)
FULL_SIZE = (
    ("llama-3-8b", dict(batch_size=1, seq_len=2048, precision="bf16", lora_r=16, lora_targets="all-linear",
                        checkpointing=True)),
    ("gpt2-small", dict(batch_size=4, seq_len=1024)),
    ("llama-3.2-1b", dict(batch_size=2, seq_len=2048, precision="bf16-amp", checkpointing=True,
                          checkpoint_policy="selective")),
    ("qwen3-0.6b", dict(batch_size=2, seq_len=1024, precision="bf16", loss="cce")),
    ("gemma-2-2b", dict(batch_size=1, seq_len=1024, precision="bf16", lora_r=8, checkpointing=True)),
    ("qwen1.5-moe-a2.7b", dict(batch_size=1, seq_len=512, precision="bf16", train_layers="last:2")),
)


def _label(fields: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in fields.items()) or "fp32, AdamW"


def markdown(full_size: bool = True) -> str:
    """The tables docs/plan.md shows: the tiny grid (real tensors) and the full-size presets (fake tensors)."""
    from ..config import preset

    lines = ["| family | run | estimate (FLOPs) | FlopCounterMode | error |", "|---|---|---:|---:|---:|"]
    worst = 0.0
    for arch, fields in train_grid():
        r = row_check(arch, fields)
        worst = max(worst, abs(r["error_pct"]))
        lines.append(f"| {arch} | {_label(fields)} | {r['estimate']:,} | {r['counted']:,} | {r['error_pct']:+.3f}% |")
    lines.append(f"\n{len(train_grid())} rows, worst |error| {worst:.3f}%.\n")
    if full_size:
        lines += ["| preset | run | estimate (FLOPs) | FlopCounterMode (fake tensors) | error |",
                  "|---|---|---:|---:|---:|"]
        for name, fields in FULL_SIZE:
            f = dict(fields)
            b, s = f.pop("batch_size"), f.pop("seq_len")
            r = row_check(name, f, fake=True, cfg=preset(name), batch=b, seq=s)
            lines.append(f"| {name} | b{b} s{s} {_label(f)} | {r['estimate']:,} | {r['counted']:,} | "
                         f"{r['error_pct']:+.4f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(markdown(full_size="--no-full-size" not in sys.argv))
