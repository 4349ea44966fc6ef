"""Issue #24's techniques on CUDA, against the H200 run's records (tests/data/cuda/2026-11-27-h200; no GPU needed):
selective checkpointing's kept outputs follow the SDPA kernel CUDA dispatches (planner/arch/decoder.py
attention_op / cuda_sdpa_kernel), every recorded selective row within 1% of the GPU's tracked live bytes."""
from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from planner.arch.decoder import attention_op, cuda_sdpa_kernel
from bench.gpu_grids import RECORDS_DIR, live_error, read_records
from planner.checkpointing import saved_ops
from planner.config import config_from_dict
from planner.estimate.activations import Widths
from planner.arch import family_of
from planner.spec import TrainSpec

AMP = ("bf16-amp", "fp16-amp")


def _selective_rows() -> list[dict]:
    """The policies grid's selective rows, less GPT-2 under autocast (CUDA autocast's fp32 ops: another change)."""
    rows = [r for r in read_records(RECORDS_DIR / "cuda-rows.jsonl")
            if r["grid"] == "policies" and "error" not in r and r["spec"].get("checkpointing")
            and r["spec"].get("checkpoint_policy") == "selective"]
    return [r for r in rows if not (r["config"]["arch"] in ("gpt2", "gpt2-hf") and r["spec"]["precision"] in AMP)]


SELECTIVE = _selective_rows()


def test_the_records_hold_the_selective_rows():
    # every decoder family, fp32, bf16, bf16-AMP, LoRA, last:N, QLoRA and gradient accumulation
    assert len(SELECTIVE) >= 60
    archs = {r["config"]["arch"] for r in SELECTIVE}
    assert {"llama", "qwen3", "gemma", "gemma2", "mixtral", "qwen2_moe", "qwen3_moe", "phi3", "gpt2"} <= archs
    assert {r["spec"]["precision"] for r in SELECTIVE} >= {"fp32", "bf16", "bf16-amp"}
    assert any(r["spec"].get("quantize_base") == "nf4" for r in SELECTIVE)


@pytest.mark.parametrize("rec", SELECTIVE, ids=[f"{r['label']}|{r['spec']['precision']}" for r in SELECTIVE])
def test_selective_row_within_one_percent_of_the_gpu_live_bytes(rec):
    est, tracked, err = live_error(rec)
    assert abs(err) <= 1.0, (rec["label"], est, tracked)


def _kernels():
    return json.loads(gzip.open(RECORDS_DIR / "sdpa-kernels.json.gz", "rt").read())


def test_cuda_kernel_rule_is_the_measured_dispatch():
    """cuda_sdpa_kernel against the grad_fn SDPA left on the H200 for every dtype / GQA / mask / dropout case."""
    names = {"cuDNN": "ScaledDotProductCudnnAttentionBackward0", "efficient": "ScaledDotProductEfficientAttentionBackward0",
             "math": "UnsafeViewBackward0"}  # the math kernel is a composite: its last op's node
    rows = _kernels()
    assert len(rows) >= 48
    for row in rows:
        e_m = {"torch.float32": 4, "torch.bfloat16": 2, "torch.float16": 2}[row["dtype"]]
        w = dataclasses.replace(Widths.of(TrainSpec(1, 8, "fp32")), e_m=e_m)
        assert names[cuda_sdpa_kernel(w, row["gqa"])] == row["fn"], row


def test_kept_kernels_are_the_routines_list():
    """The estimate keeps a kernel's output under selective exactly when the routine's torchtitan list names its aten
    op (planner/routines/checkpointing.py _SAVE): the CPU's flash kernel and CUDA's memory-efficient one, not cuDNN's
    and not the math kernel's composite ops."""
    import torch

    from planner.routines.checkpointing import _SAVE

    aten = {"cuDNN": torch.ops.aten._scaled_dot_product_cudnn_attention.default,
            "efficient": torch.ops.aten._scaled_dot_product_efficient_attention.default}
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in _SAVE
    for e_m in (2, 4):  # (the math kernel, fp32 with enable_gqa, is a composite its callers pass as "eager")
        w = dataclasses.replace(Widths.of(TrainSpec(1, 8, "fp32")), e_m=e_m)
        kernel = cuda_sdpa_kernel(w, False)
        op = attention_op("sdpa", 2, 16, 4, 8, w, spec=TrainSpec(2, 16, device="cuda"))
        kept = bool(saved_ops([op]))
        assert kept == (aten[kernel] in _SAVE), (e_m, kernel)
        cpu = attention_op("sdpa", 2, 16, 4, 8, w, spec=TrainSpec(2, 16, device="cpu"))
        assert saved_ops([cpu]) == [cpu] and cpu[2] == op[2]  # the CPU keeps its kernel's output, same bytes
    assert not saved_ops([attention_op("eager", 2, 16, 4, 8, w, spec=TrainSpec(2, 16, device="cuda"))])


def test_cpu_selective_estimate_keeps_the_attention_output():
    """A recorded CUDA row run as --device cpu: the kept outputs are the CUDA ones plus the SDPA output and logsumexp
    of every block (the CPU kernel is in the list), so the CPU estimate is the one measured before on the CPU."""
    rec = next(r for r in SELECTIVE if r["config"]["arch"] == "llama" and r["spec"]["precision"] == "bf16"
               and r["spec"].get("train_layers", "all") == "all" and not r["spec"].get("lora_r"))
    cfg = config_from_dict(rec["config"])
    cuda = TrainSpec(**rec["spec"])
    cpu = dataclasses.replace(cuda, device="cpu")
    fam = family_of(cfg)
    w = Widths.of(cuda)
    k_cuda = sum(op[2] for op in saved_ops(fam.selective_ops(cfg, cuda, w)))
    k_cpu = sum(op[2] for op in saved_ops(fam.selective_ops(cfg, cpu, w)))
    b, s, x = cuda.batch_size, cuda.seq_len, fam.shape(cfg)
    assert k_cpu - k_cuda == b * s * x.a * x.d * w.e_m + 4 * b * x.a * s


# --offload-activations on CUDA: the unpack hook's device copies (planner/estimate/offload_act.py module doc)

def _offload_rows() -> list[dict]:
    """The offload-activations rows, less GPT-2 under autocast (CUDA autocast's fp32 ops: another change)."""
    rows = [r for r in read_records(RECORDS_DIR / "cuda-rows.jsonl")
            if r["grid"] == "offload-activations" and "error" not in r]
    rows = [r for r in rows if not (r["config"]["arch"] in ("gpt2", "gpt2-hf") and r["spec"]["precision"] in AMP)]
    return [r for r in rows if live_error(r) is not None]


OFFLOAD = _offload_rows()
# the copies of a block's own saved tensors at its nodes without checkpointing are not modelled yet
# (planner/estimate/offload_act.py module doc): where a block node's backward is the backward phase's high point
# (Mixtral's experts; SDPA's math kernel, whose saved softmax output comes back at its node), that phase is low
NOT_MODELLED = {("mixtral V1000 h64 a4 kv2 untied b2 s64 bf16-amp", False),
                ("mixtral V1000 h64 a4 kv2 untied b2 s64 fp32", False),
                ("llama V200 h96 a6 kv2 f256 L2 b1 s64 fp32", False), ("llama V300 h48 a6 kv2 f96 L2 b2 s32 fp32", False)}


def _backward(rec) -> tuple[int, int]:
    from planner.estimate.training import estimate_training

    est = estimate_training(config_from_dict(rec["config"]), TrainSpec(**rec["spec"]))
    lines = est.transients.get("allocator_rounding", 0) + est.transients.get("cublas_workspace", 0)
    return est.phase_peak_bytes["backward"] - lines, rec["measured"]["phase_peak_bytes"]["backward"]


def test_offload_rows_cover_the_families():
    assert len(OFFLOAD) >= 45
    assert {r["config"]["arch"] for r in OFFLOAD} >= {"llama", "qwen2", "qwen3", "gemma", "gemma2", "mistral", "phi3",
                                                      "mixtral", "qwen2_moe", "qwen3_moe", "gpt2"}


@pytest.mark.parametrize("rec", OFFLOAD, ids=[r["label"] for r in OFFLOAD])
def test_offload_row_peak_and_backward_within_one_percent(rec):
    """The step's peak and, with the unpack hook's copies (the log-softmax output at the loss backward, the
    checkpointed block's input), its backward phase: within 1% of the GPU's tracked live bytes."""
    est, tracked, err = live_error(rec)
    assert abs(err) <= 1.0, (rec["label"], est, tracked)
    bwd_est, bwd = _backward(rec)
    key = (rec["label"], bool(rec["spec"]["checkpointing"]))
    if key in NOT_MODELLED:
        assert bwd_est < 0.99 * bwd  # still low: whoever models it moves the row to the held ones
        return
    assert abs(bwd_est - bwd) <= 0.01 * bwd, (rec["label"], bwd_est, bwd)


def test_offload_unpack_copies_are_cuda_only():
    """The same row on the CPU device: no unpack copies (`.to("cpu")` returns the host copy itself), so the CUDA
    backward is the CPU one's plus b*s*V*e_ce at the loss (here its high point)."""
    from planner.estimate.training import estimate_training

    rec = next(r for r in OFFLOAD if r["config"]["arch"] == "qwen3" and r["spec"]["precision"] == "bf16-amp"
               and not r["spec"]["checkpointing"])
    cfg, cuda = config_from_dict(rec["config"]), TrainSpec(**rec["spec"])
    cpu = dataclasses.replace(cuda, device="cpu")
    e_cuda, e_cpu = estimate_training(cfg, cuda), estimate_training(cfg, cpu)
    lines = e_cuda.transients.get("allocator_rounding", 0) + e_cuda.transients.get("cublas_workspace", 0)
    bsV = cuda.batch_size * cuda.seq_len * cfg.vocab_size
    assert e_cuda.phase_peak_bytes["backward"] - lines == e_cpu.phase_peak_bytes["backward"] + 4 * bsV
    # the host: cuDNN's philox seed and offset a block more than the CPU kernel saves
    assert (e_cuda.transients["host_activation_offload"]
            == e_cpu.transients["host_activation_offload"] + 16 * cfg.layers)


def test_offload_host_bytes_are_the_packed_copies():
    """The host figure against the pack hook's bytes the GPU run counted (measured.host_activation_offload_bytes), to
    the byte: CUDA's 1-byte dropout masks (the book's GPT-2), the fused kernels' saved philox seed and offset and
    the memory-efficient kernel's mask expanded to the heads included. Not held: the book's GPT-2 at fp32 with
    dropout and without checkpointing (196,608 B over, unexplained: no saved-tensor inventory of it on a GPU yet)."""
    from planner.estimate.training import estimate_training

    held = 0
    for rec in OFFLOAD:
        ckpt = bool(rec["spec"]["checkpointing"])
        if not ckpt and rec["config"]["arch"] == "gpt2":
            continue
        est = estimate_training(config_from_dict(rec["config"]), TrainSpec(**rec["spec"]))
        assert est.transients["host_activation_offload"] == rec["measured"]["host_activation_offload_bytes"], rec["label"]
        held += 1
    assert held >= 40
