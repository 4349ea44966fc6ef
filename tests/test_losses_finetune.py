"""Issue #24 with fine-tuning: the fused losses (chunked-ce, cce) on a frozen or trainable head under LoRA,
frozen layers and QLoRA, as peft users plug them in (the base model's last hidden state and the head weight):
the frozen head's gradients, the estimate against the measured step (the 1% bar) and simulate == measure."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from planner.config import GPT2Config, LlamaConfig
from planner.estimate.training import estimate_training
from planner.measure.simulate import simulate_training
from planner.measure.training import measure_training
from planner.models.losses import fused_loss
from planner.spec import TrainSpec

ROOT = Path(__file__).resolve().parent.parent
GPT = GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3, n_layers=2, drop_rate=0.0)
LLAMA = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
BAR_PCT = 1.0


@pytest.mark.parametrize("loss", ["chunked-ce:5", "cce"])
def test_frozen_head_grads_equal_cross_entropy(loss):
    torch.manual_seed(0)
    h = torch.randn(2, 9, 16, requires_grad=True)
    w = torch.randn(37, 16)  # frozen: no grad asked for, none made
    t = torch.randint(0, 37, (2, 9))
    ref = F.cross_entropy((h @ w.T).flatten(0, 1), t.flatten())
    (gh,) = torch.autograd.grad(ref, (h,))
    out = fused_loss(h, w, t, loss)
    (fh,) = torch.autograd.grad(out, (h,))
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(fh, gh, atol=1e-6) and w.grad is None


ROWS = [
    (LLAMA, TrainSpec(2, 32, "bf16-amp", "adamw", loss="chunked-ce:16", lora_r=4)),
    (LLAMA, TrainSpec(2, 32, "bf16", "sgd", loss="cce", train_layers="last:1", checkpointing=True)),
    (GPT, TrainSpec(2, 32, "fp32", "adamw", loss="cce", lora_r=4, lora_targets="all-linear")),
]


@pytest.mark.parametrize("cfg,spec", ROWS, ids=["llama-lora-amp-chunked", "llama-last1-bf16-ckpt-cce", "gpt2-lora-cce"])
def test_finetune_fused_loss_estimate_within_bar_and_simulate_exact(cfg, spec):
    est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
    assert est.peak_phase == meas["peak_phase"]
    for phase in ("loss", "backward"):
        m, e = meas["phase_peak_bytes"][phase], est.phase_peak_bytes[phase]
        assert abs(e - m) <= BAR_PCT / 100 * m, (phase, e, m)
    assert est.transients["logits"] == 0 and est.transients["cross_entropy_grads"] == 0
    assert simulate_training(cfg, spec)["peak_bytes"] == meas["peak_bytes"]


def test_qlora_fused_loss_within_bar():
    pytest.importorskip("bitsandbytes")
    spec = TrainSpec(2, 32, "bf16", "adamw", loss="cce", lora_r=4, lora_targets="all-linear", quantize_base="nf4")
    est, meas = estimate_training(LLAMA, spec), measure_training(LLAMA, spec)
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= BAR_PCT / 100 * meas["peak_bytes"]


def test_lora_loss_phase_drops_at_full_size():
    """llama-3-8b LoRA b1 s8192 bf16 with checkpointing: the b*s*V logits, their fp32 copy and the
    log-softmax output are the loss's; a fused loss holds one chunk, so the loss phase falls by GiBs."""
    from planner.config import resolve_model

    cfg = resolve_model("llama-3-8b", None)
    kw = dict(checkpointing=True, lora_r=16, lora_targets="all-linear")
    plain = estimate_training(cfg, TrainSpec(1, 8192, "bf16", "adamw", **kw))
    for loss in ("chunked-ce", "cce"):
        est = estimate_training(cfg, TrainSpec(1, 8192, "bf16", "adamw", loss=loss, **kw))
        assert est.phase_peak_bytes["loss"] < plain.phase_peak_bytes["loss"] - 8 * 2**30
        assert est.peak_bytes < plain.peak_bytes


def test_cli_estimate_lora_with_fused_loss():
    proc = subprocess.run([sys.executable, "-m", "planner", "estimate", "train", "--model", "llama-3.2-1b",
                           "--batch-size", "1", "--seq-len", "512", "--lora-r", "8", "--loss", "chunked-ce", "--json"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["transients"]["logits"] == 0 and any(t["name"].startswith("chunked-ce") for t in rec["terms"])


def test_gemma2_soft_cap_per_chunk_and_block():
    """Gemma 2's final-logit soft cap: chunked-ce caps each chunk, cce each block (cut-cross-entropy's softcap=),
    the loss and the grads equal transformers' capped cross-entropy; the step estimated within the bar."""
    from planner.arch import families

    torch.manual_seed(0)
    h = torch.randn(2, 9, 16, requires_grad=True)
    w = (3 * torch.randn(37, 16)).requires_grad_()
    t = torch.randint(0, 37, (2, 9))
    ref = F.cross_entropy((torch.tanh((h @ w.T) / 5.0) * 5.0).flatten(0, 1), t.flatten())
    g = torch.autograd.grad(ref, (h, w))
    for loss in ("chunked-ce:4", "cce"):
        out = fused_loss(h, w, t, loss, softcap=5.0)
        f = torch.autograd.grad(out, (h, w))
        assert torch.allclose(out, ref, atol=1e-5) and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(f, g))
    _, cfg, _, _ = families()["gemma2"].grid_configs()[0]
    for spec in (TrainSpec(2, 32, "bf16-amp", "sgd", loss="cce", lora_r=4),
                 TrainSpec(2, 32, "fp32", "sgd", loss="chunked-ce:16")):
        est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
        assert abs(est.peak_bytes - meas["peak_bytes"]) <= BAR_PCT / 100 * meas["peak_bytes"]


def test_longest_context_with_the_techniques_on():
    """Item 5: at 48 GiB, Llama-3.1-8B QLoRA r32 b1 with checkpointing: a fused loss fits a longer context than
    the plain loss, and the derived offloaded checkpointing (the block inputs on the host) a longer one still;
    the derived device peak is the estimate less all stashed block inputs but one."""
    import dataclasses

    from planner.config import PRESETS
    from planner.estimate.offload_ckpt import longest_offloaded, offloaded_checkpoint
    from planner.fit import max_seq_len, tensor_budget
    from planner.spec import prepare

    for device in ("cpu", "cuda"):
        spec = TrainSpec(1, 1, "bf16", "adamw", device=device, lora_r=32, lora_targets="all-linear",
                         quantize_base="nf4", double_quant=True, checkpointing=True)
        cfg = prepare(PRESETS["llama-3.1-8b"], spec, "sdpa")
        usable = tensor_budget(48 * 2**30, device)
        plain = max_seq_len(cfg, spec, usable)[0]
        cce = dataclasses.replace(spec, loss="cce")
        fused = max_seq_len(cfg, cce, usable)[0]
        offl = longest_offloaded(cfg, cce, usable)
        if device == "cpu":  # SDPA's flash kernel: the loss bounds the plain run, the stashed inputs the fused one
            assert 0 < plain < fused < offl < cfg.max_seq_len
        else:  # QLoRA's fp32 hidden states with grouped heads: CUDA's SDPA math kernel, whose b*a*s*s fp32 weights
            # bound the recomputed block's backward before the loss does (planner/arch/parts.py sdpa_math)
            assert 0 < plain <= fused < offl < cfg.max_seq_len
    est = estimate_training(cfg, dataclasses.replace(cce, seq_len=8192))
    dev, host = offloaded_checkpoint(est, cfg)
    stash = cfg.layers * 8192 * cfg.hidden * 4  # fp32 hidden states (peft's prepare_model_for_kbit_training)
    assert host == stash and dev == est.peak_bytes - stash + stash // cfg.layers


def test_grid_has_fine_tuning_rows_for_every_family_that_fine_tunes():
    from bench.techniques import finetune_losses_grid

    rows = finetune_losses_grid()
    fams = {label.split(":")[0].split(" V")[0] for label, _, _ in rows}
    assert {"gpt2 (book)", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"} <= fams
    assert any(spec.quantize_base == "nf4" for _, _, spec in rows)
    assert all(spec.finetuning and spec.loss != "default" for _, _, spec in rows)
