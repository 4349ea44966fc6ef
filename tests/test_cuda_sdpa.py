"""The decoder families' SDPA on CUDA, held against the H200 run's records (no CUDA device needed).

tests/data/cuda/2026-11-27-h200 holds every recorded CPU grid measured again with its device set to cuda
(cuda-rows.jsonl.gz; bench/gpu_grids.py). On CUDA transformers' SDPA call runs one of two kernels in
fp32 (planner/arch/parts.py): with enable_gqa (grouped heads, no mask) the MATH kernel, a composite that keeps
eager attention's fp32 s x s softmax output (sdpa_math), without it the memory-efficient kernel, whose
logsumexp is padded to a multiple of 32 and whose output is laid out as o_proj's input (sdpa_efficient). Each
recorded decoder row that runs either kernel is held here to 1% of the GPU's live tensor bytes
(bench.gpu_grids.live_error), and the CPU estimate of the same shapes to its own recorded CPU peak.
"""
from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from planner.arch import family_of, parts
from planner.arch.decoder import RMSDecoder
from planner.arch.terms import Widths
from bench.gpu_grids import RECORDS_DIR, live_error, read_records
from planner.config import config_from_dict
from planner.estimate.training import estimate_training
from planner.spec import TrainSpec

GRIDS = ("families", "accuracy", "finetune", "qlora", "8bit", "policies", "losses")
BAR_PCT = 1.0


def _spec(rec) -> TrainSpec:
    return TrainSpec(**rec["spec"])


def _kernel(rec) -> str | None:
    """'math' / 'efficient' when the row's decoder attention is SDPA in fp32 on CUDA, else None. QLoRA's
    attention runs on its fp32 twin (planner/estimate/quantized.py: the residual stream and attention are fp32)."""
    cfg = config_from_dict(rec["config"])
    family = family_of(cfg)
    if not isinstance(family, RMSDecoder):
        return None
    spec = _spec(rec)
    if spec.quantize_base != "none":
        spec = dataclasses.replace(spec, precision="fp32", quantize_base="none", double_quant=False)
    x, w, masked = family.shape(cfg), Widths.of(spec), family.masked(cfg, spec)
    if parts.sdpa_math(x, masked, spec, w):
        return "math"
    return "efficient" if parts.sdpa_efficient(x, masked, spec, w) else None


def _rows() -> list[dict]:
    out = []
    for rec in read_records(RECORDS_DIR / "cuda-rows.jsonl"):
        if rec.get("kind") != "train" or "error" in rec or rec["grid"] not in GRIDS:
            continue
        # peft's lora_dropout on CUDA saves native_dropout's 1-byte bool mask where the CPU keeps an fp32 noise
        # tensor: a fine-tuning dropout term, not the attention's (its rows are held where that is modelled)
        if rec["spec"].get("lora_dropout", 0) > 0:
            continue
        if _kernel(rec) is not None:
            out.append(rec)
    return out


ROWS = _rows()


def test_the_rows_cover_both_kernels_in_every_grid():
    kernels = {(r["grid"], _kernel(r)) for r in ROWS}
    for grid in ("families", "finetune", "qlora", "8bit", "policies", "accuracy"):
        assert (grid, "math") in kernels, grid
    assert ("families", "efficient") in kernels
    fams = {r["config"]["arch"] for r in ROWS if r["grid"] == "families" and _kernel(r) == "math"}
    # every decoder family with grouped heads and SDPA: the dense ones and the MoE ones (Gemma 2 is eager-only;
    # Phi-3's grid passes a sliding-window mask at s256, so its math rows are the short ones)
    assert {"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "mixtral", "qwen2_moe", "qwen3_moe"} <= fams
    assert len(ROWS) > 250


@pytest.mark.parametrize("rec", ROWS, ids=[f"{r['grid']}: {r['label']}" for r in ROWS])
def test_recorded_cuda_row_within_1pct_of_live_bytes(rec):
    est, tracked, err = live_error(rec)
    assert abs(err) <= BAR_PCT, f"{_kernel(rec)} kernel: estimate {est:,} vs the H200's {tracked:,} ({err:+.3f}%)"


def test_kernel_choice_is_the_h200_probe():
    """sdpa-kernels.json.gz: the grad_fn SDPA's output had on the H200 for each dtype, enable_gqa, mask, dropout and
    head dim. fp32 with enable_gqa: the math kernel's matmul (UnsafeViewBackward0); fp32 without it: the
    memory-efficient kernel; bf16 and fp16: cuDNN attention (neither predicate)."""
    probe = json.loads(gzip.open(RECORDS_DIR / "sdpa-kernels.json.gz", "rt").read())
    assert len(probe) > 100
    precision = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16-amp"}
    for e in probe:
        x = parts.Shape(h=4 * e["d"], a=4, kv=2 if e["gqa"] else 4, d=e["d"], f=64, attention="sdpa", act="silu")
        spec = TrainSpec(batch_size=2, seq_len=e["s"], precision=precision[e["dtype"]], device="cuda")
        w = Widths.of(spec)
        math, eff = parts.sdpa_math(x, False, spec, w), parts.sdpa_efficient(x, False, spec, w)
        expected = {"UnsafeViewBackward0": (True, False), "ScaledDotProductEfficientAttentionBackward0": (False, True),
                    "ScaledDotProductCudnnAttentionBackward0": (False, False)}[e["fn"]]
        assert (math, eff) == expected, e
        cpu = dataclasses.replace(spec, device="cpu")
        assert not parts.sdpa_math(x, False, cpu, w) and not parts.sdpa_efficient(x, False, cpu, w)


def _record(grid: str, label: str, arch: str) -> dict:
    return next(r for r in read_records(RECORDS_DIR / "cuda-rows.jsonl")
                if r["grid"] == grid and r["label"] == label and r["config"]["arch"] == arch)


def test_the_math_kernels_softmax_output_is_what_the_gpu_kept():
    """explain.jsonl.gz's llama V97 h32 a4 kv2 b2 s256 fp32 checkpointed row: at the backward peak the GPU holds
    _safe_softmax's (2, 4, 256, 256) fp32 output; the estimate saves that tensor per block and its peak is the
    attention's softmax backward."""
    label = "llama V97 h32 a4 kv2 tied b2 s256 sdpa fp32 ckpt adamw"
    explain = next(r for r in read_records(RECORDS_DIR / "explain.jsonl") if r["label"] == label)
    kept = [t for t in explain["measured"]["alive_at_peak"]["largest"] if t["op"] == "aten::_safe_softmax"]
    assert kept and kept[0]["shape"] == [2, 4, 256, 256] and kept[0]["dtype"] == "float32"
    rec = _record("families", label, "llama")
    est = estimate_training(config_from_dict(rec["config"]), _spec(rec))
    softmax = [t for t in est.terms if t["name"] == "softmax output (fp32)"]
    assert [t["bytes"] for t in softmax] == [kept[0]["bytes"]]
    assert max(est.backward_points, key=est.backward_points.get).endswith("attention")
    assert abs(live_error(rec)[2]) < 0.01


@pytest.mark.parametrize("grid,label,arch", [
    ("families", "llama V97 h32 a4 kv2 tied b2 s256 sdpa fp32 ckpt adamw", "llama"),
    ("families", "qwen3_moe V97 h32 a4 kv2 tied b2 s256 sdpa fp32 sgd", "qwen3_moe"),
    ("families", "phi3 V97 h32 a4 kv2 tied b2 s256 sdpa fp32 sgd", "phi3"),
    ("finetune", "qwen2 V97 h32 a4 kv2 tied b2 s256 lora r4 q,v sdpa fp32 ckpt adamw", "qwen2"),
])
def test_the_cpu_estimate_of_the_same_shape_is_its_recorded_cpu_peak(grid, label, arch):
    """The CUDA terms change nothing on the CPU: the same row with its device set to cpu is estimated within its
    grid's bar (1%) of the CPU peak recorded beside it (tests/data/measured), and keeps the CPU flash kernel's
    logsumexp (no s x s softmax output saved)."""
    rec = _record(grid, label, arch)
    cpu_spec = dataclasses.replace(_spec(rec), device="cpu")
    est = estimate_training(config_from_dict(rec["config"]), cpu_spec)
    measured = rec["cpu"]["peak_bytes"]
    assert abs(est.peak_bytes - measured) / measured * 100 <= BAR_PCT, (est.peak_bytes, measured)
    cfg, family = config_from_dict(rec["config"]), family_of(config_from_dict(rec["config"]))
    for spec, lse in ((cpu_spec, True), (_spec(rec), arch == "phi3")):  # (Phi-3's s256 row: a mask, memory-efficient)
        names = {t.name for t in family.block_terms(cfg, spec, Widths.of(spec))}
        assert ("SDPA logsumexp" in names) == lse and ("softmax output (fp32)" not in names) == lse, spec.device


def test_phi3_uncheckpointed_block_keeps_no_qkv_storage_under_the_math_kernel():
    """every:K's uncheckpointed Phi-3 block: on the CPU SDPA saves v as a view of qkv_proj's output, keeping its
    whole storage (planner/arch/phi3.py uncheckpointed_block_extra); CUDA's math kernel saves repeat_interleave's
    copy of v instead, so nothing holds that storage."""
    rec = next(r for r in ROWS if r["grid"] == "families" and r["config"]["arch"] == "phi3" and _kernel(r) == "math")
    cfg = config_from_dict(rec["config"])
    family = family_of(cfg)
    spec = dataclasses.replace(_spec(rec), checkpointing=True, checkpoint_policy="every:2", precision="fp32")
    cpu = dataclasses.replace(spec, device="cpu")
    assert family.uncheckpointed_block_extra(cfg, cpu, Widths.of(cpu)) > 0
    assert family.uncheckpointed_block_extra(cfg, spec, Widths.of(spec)) == 0
