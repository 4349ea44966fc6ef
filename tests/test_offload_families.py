"""Issue #24: --offload-activations for every RMSNorm decoder (Qwen 3, Phi-3, Gemma, Gemma 2, eager attention), and
every:K checkpointing's Phi-3 fused-qkv view. The host copies are counted saved variable by saved variable
(planner/arch/<family>.py offload_copies) and must equal what save_on_cpu's pack hook copies, to the byte; the device
figure is held to 1% of the measured (or simulated: simulate = measure to the byte, tests/test_offload_activations.py)
peak."""
import dataclasses
import importlib

import pytest
import torch

from planner.estimate.offload_act import host_terms
from planner.estimate.training import estimate_training
from planner.measure.simulate import simulate_training
from planner.measure.training import measure_training
from planner.spec import TrainSpec


def family_shape(arch: str, i: int = 0, **kw):
    label, cfg, b, s = importlib.import_module(f"planner.arch.{arch}").FAMILY.grid_configs()[i]
    return dataclasses.replace(cfg, **kw) if kw else cfg, b, s


def pack_hook_bytes(cfg, b, s, prec, ckpt) -> int:
    """What a pack hook sees in one forward and loss (the saved variables' own numel x element size)."""
    from planner.arch import family_of

    fam = family_of(cfg)
    torch.manual_seed(0)
    model = fam.build(cfg, "cpu", "bfloat16" if prec == "bf16" else "float32")
    model.train()
    if ckpt:
        fam.enable_checkpointing(model)
    x = torch.randint(0, cfg.vocab_size, (b, s))
    total = []
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=prec == "bf16-amp")
    with torch.autograd.graph.saved_tensors_hooks(lambda t: total.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t), amp:
        fam.loss(model, x, x, getattr(fam, "default_loss", "labels"), lambda p: None)
    return sum(total)


@pytest.mark.parametrize("arch,prec,ckpt,kw", [("qwen3", "bf16-amp", False, {}), ("phi3", "bf16", False, {}),
                                               ("gemma", "fp32", True, {}), ("gemma2", "bf16-amp", False, {}),
                                               ("llama", "fp32", False, {"attention": "eager"})])
def test_host_copies_equal_the_pack_hook_to_the_byte(arch, prec, ckpt, kw):
    cfg, b, s = family_shape(arch, **kw)
    spec = TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_activations=True)
    assert sum(t.bytes for t in host_terms(cfg, spec)) == pack_hook_bytes(cfg, b, s, prec, ckpt)


@pytest.mark.parametrize("arch,prec,ckpt", [("qwen3", "bf16-amp", True), ("phi3", "bf16-amp", False),
                                            ("gemma2", "bf16-amp", True)])
def test_device_and_host_against_the_real_step(arch, prec, ckpt):
    cfg, b, s = family_shape(arch)
    spec = TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_activations=True)
    meas, est = measure_training(cfg, spec), estimate_training(cfg, spec)
    assert est.transients["host_activation_offload"] == meas["host_activation_offload_bytes"]
    assert abs(est.peak_bytes / meas["peak_bytes"] - 1) < 0.01


@pytest.mark.parametrize("arch,prec", [("gemma2", "fp32"), ("llama", "bf16")])
def test_eager_attention_forward_point_at_a_long_sequence(arch, prec):
    """At s256 with h32 the eager s x s scores make the forward the peak: the family's forward point holds it."""
    cfg, b, s = family_shape(arch, 3, attention="eager")
    spec = TrainSpec(b, s, prec, "adamw", offload_activations=True)
    sim, est = simulate_training(cfg, spec), estimate_training(cfg, spec)
    assert sim["peak_phase"] == est.peak_phase == "forward"
    assert abs(est.peak_bytes / sim["peak_bytes"] - 1) < 0.01


@pytest.mark.parametrize("i,window,b,s", [(1, None, 1, 48), (0, None, 2, 64), (0, 32, 2, 64)])
def test_phi3_every_k_keeps_the_fused_qkv_output(i, window, b, s):
    """every:K: an uncheckpointed Phi-3 block keeps qkv_proj's whole output (v is a view of it) unless repeat_kv
    copies v; the estimate follows, and without the term it would be short by b*s*(a + kv)*d*e_m a block."""
    from planner.arch.phi3 import FAMILY
    from planner.arch.terms import Widths

    cfg, _, _ = family_shape("phi3", i, sliding_window=window)
    cfg = FAMILY.with_layers(cfg, 4)
    spec = TrainSpec(b, s, "bf16-amp", "adamw", checkpointing=True, checkpoint_policy="every:4")
    sim, est = simulate_training(cfg, spec), estimate_training(cfg, spec)
    assert abs(est.peak_bytes - sim["peak_bytes"]) <= 8
    extra = FAMILY.uncheckpointed_block_extra(cfg, spec, Widths.of(spec))
    repeated = window is not None and cfg.num_key_value_heads < cfg.num_attention_heads
    assert extra == (0 if repeated else b * s * (cfg.num_attention_heads + cfg.num_key_value_heads) * cfg.head_dim * 2)


def test_gpt2_hf_host_copies_exact_and_the_estimate_refused_in_one_line():
    """transformers' GPT-2 (LayerNorm, Conv1D addmm, dropout noise, SDPA's math kernel under dropout): the host
    copies are exact, with and without checkpointing; the device's backward is not modelled, so the estimate refuses."""
    from planner.config import ConfigError
    from planner.estimate.offload_act import check_offload_activations

    cfg, b, s = family_shape("gpt2")
    for prec, ckpt in (("bf16-amp", False), ("fp32", True)):
        spec = TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_activations=True)
        assert sum(t.bytes for t in host_terms(cfg, spec)) == pack_hook_bytes(cfg, b, s, prec, ckpt)
        with pytest.raises(ConfigError, match="device's backward"):
            check_offload_activations(cfg, spec)
