"""Issue #24: --offload-activations for every RMSNorm decoder (Qwen 3, Phi-3, Gemma, Gemma 2, eager attention),
transformers' GPT-2, the book's GPT-2 and the MoE families (Mixtral, Qwen2-MoE, Qwen3-MoE), and every:K checkpointing's
Phi-3 fused-qkv view. The host copies are counted saved variable by saved variable
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


def book_shape(**kw):
    """The book's GPT-2 (planner/arch/gpt2_book.py; no grid shapes): the training chapters' drop_rate 0.1."""
    from planner.arch.gpt2_book import GPT2Config

    return GPT2Config(vocab_size=1000, context_length=128, emb_dim=64, n_heads=4, n_layers=2,
                      **{"drop_rate": 0.1, **kw}), 2, 64


@pytest.mark.parametrize("arch,i,prec,ckpt,kw", [
    ("gpt2", 0, "bf16-amp", False, {}), ("gpt2", 1, "fp32", True, {}), ("gpt2", 3, "bf16", False, {}),
    ("book", 0, "fp32", False, {}), ("book", 0, "bf16-amp", True, {}), ("book", 0, "bf16", False, {"drop_rate": 0.0}),
    ("book", 0, "bf16-amp", False, {"attention": "sdpa"}), ("book", 0, "fp32", False, {"attention": "sdpa", "drop_rate": 0.0}),
    ("mixtral", 0, "bf16-amp", False, {}), ("mixtral", 1, "bf16", False, {}), ("qwen2_moe", 0, "bf16-amp", False, {}),
    ("qwen2_moe", 1, "fp32", True, {}), ("qwen3_moe", 0, "fp32", False, {})])
def test_gpt2_book_and_moe_host_copies_equal_the_pack_hook_to_the_byte(arch, i, prec, ckpt, kw):
    """transformers' GPT-2 (LayerNorm, Conv1D addmm, dropout noise, SDPA's flash or math kernel), the book's GPT-2
    (its written-out LayerNorm and GELU, three q/k/v Linears, eager attention's bool mask) and the MoE families
    (router, dispatch, grouped GEMMs, combine; Qwen2-MoE's shared expert): one host copy per saved variable."""
    cfg, b, s = book_shape(**kw) if arch == "book" else family_shape(arch, i, **kw)
    spec = TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_activations=True)
    assert sum(t.bytes for t in host_terms(cfg, spec)) == pack_hook_bytes(cfg, b, s, prec, ckpt)


@pytest.mark.parametrize("arch,prec,ckpt", [("gpt2", "bf16-amp", False), ("gpt2", "fp32", True),
                                            ("book", "fp32", False), ("mixtral", "bf16-amp", False),
                                            ("qwen2_moe", "fp32", False)])
def test_gpt2_book_and_moe_against_the_real_step(arch, prec, ckpt):
    """A measured child per family: the host bytes to the byte, the device peak within 1% (the backward's own
    points without checkpointing: every saved tensor a host copy)."""
    cfg, b, s = book_shape() if arch == "book" else family_shape(arch)
    spec = TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_activations=True)
    meas, est = measure_training(cfg, spec), estimate_training(cfg, spec)
    assert est.transients["host_activation_offload"] == meas["host_activation_offload_bytes"]
    assert abs(est.peak_bytes / meas["peak_bytes"] - 1) < 0.01


@pytest.mark.parametrize("arch,i,prec,ckpt", [("gpt2", 0, "fp32", False), ("gpt2", 3, "bf16-amp", False),
                                              ("book", 0, "bf16-amp", False), ("book", 0, "fp32", True),
                                              ("mixtral", 0, "fp32", False), ("mixtral", 1, "bf16-amp", True)])
def test_gpt2_book_and_moe_every_phase_against_the_simulation(arch, i, prec, ckpt):
    """Forward, loss, backward and optimizer phases each within 1% of the simulation (= the measurement to the byte):
    the backward peaks at gelu_new's backward (GPT-2 V1000 h64 fp32, -4.1% before it was modelled), the forward at
    the MLP (GPT-2 V97 h32 s256 bf16-AMP), the experts' gate_up backward (Mixtral V1000 h64 fp32, -2.6% before) or
    the tied head's accumulation (Mixtral V2000 h48, -8.9% before)."""
    cfg, b, s = book_shape() if arch == "book" else family_shape(arch, i)
    spec = TrainSpec(b, s, prec, "sgd", checkpointing=ckpt, offload_activations=True)
    sim, est = simulate_training(cfg, spec), estimate_training(cfg, spec)
    for phase, got in sim["phase_peak_bytes"].items():
        assert abs(est.phase_peak_bytes[phase] / got - 1) < 0.01, (phase, est.phase_peak_bytes[phase], got)


def test_gpt2_hf_eager_refused_in_one_line():
    """GPT-2 (HF)'s host copies are measured with SDPA; eager attention is refused in one line."""
    from planner.config import ConfigError
    from planner.estimate.offload_act import check_offload_activations

    cfg, b, s = family_shape("gpt2", attention="eager")
    with pytest.raises(ConfigError, match="SDPA attention only"):
        check_offload_activations(cfg, TrainSpec(b, s, "fp32", "adamw", offload_activations=True))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("prec", ["fp32", "bf16-amp"])
def test_long_sequence_forward_against_the_simulation(arch, prec):
    """V97 h32 b2 s256 without checkpointing (SDPA): the forward is the peak, at the last block's MLP, RoPE on q or
    SDPA with the embedding output, the block's input, RoPE's cos/sin and position_ids alive (planner/arch/decoder.py
    offload_forward_held / offload_attention_points; -4% to -37% before). Every phase but backward within 1% of the
    simulation (= the measurement to the byte), the peak within 64 B."""
    cfg, b, s = family_shape(arch, 3)
    spec = TrainSpec(b, s, prec, "sgd", offload_activations=True)
    sim, est = simulate_training(cfg, spec), estimate_training(cfg, spec)
    assert abs(est.peak_bytes - sim["peak_bytes"]) <= 64, (est.peak_bytes, sim["peak_bytes"])
    assert abs(est.phase_peak_bytes["forward"] - sim["phase_peak_bytes"]["forward"]) <= 64


def test_long_sequence_forward_measured():
    """A measured child at the long shape (Qwen 3's q/k-norm RoPE point, bf16-AMP): device peak to 64 B, host to
    the byte."""
    cfg, b, s = family_shape("qwen3", 3)
    spec = TrainSpec(b, s, "bf16-amp", "adamw", offload_activations=True)
    meas, est = measure_training(cfg, spec), estimate_training(cfg, spec)
    assert est.transients["host_activation_offload"] == meas["host_activation_offload_bytes"]
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= 64, (est.peak_bytes, meas["peak_bytes"])


@pytest.mark.parametrize("drop", [0.0, 0.1])
@pytest.mark.parametrize("prec", ["fp32", "bf16-amp"])
def test_gpt2_book_checkpointed_recompute_softmax(drop, prec):
    """The book's GPT-2, checkpointed eager attention, s = ctx = 256 (plain step, no offloading): the backward
    peaks at the recompute's forward softmax (planner/arch/gpt2_book.py block_points "recompute attention";
    -1.2% to -2.5% before)."""
    from planner.arch.gpt2_book import GPT2Config

    cfg = GPT2Config(vocab_size=97, context_length=256, emb_dim=32, n_heads=4, n_layers=2, drop_rate=drop)
    spec = TrainSpec(2, 256, prec, "sgd", checkpointing=True)
    sim, est = simulate_training(cfg, spec), estimate_training(cfg, spec)
    assert sim["peak_phase"] == est.peak_phase == "backward"
    assert abs(est.peak_bytes / sim["peak_bytes"] - 1) < 0.001, (est.peak_bytes, sim["peak_bytes"])


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma"])
def test_wide_mlp_backward_against_the_simulation(arch):
    """A wide MLP (h64 f512 b2 s128, fp32, no checkpointing): the backward is the peak, at the gated product's
    backward with the down projection's input grad and MulBackward's two grads alive (planner/arch/decoder.py
    offload_backward_points; -9.8% / -6.4% / -4.7% before)."""
    cfg, b, _ = family_shape(arch, 3, hidden_size=64, intermediate_size=512)
    spec = TrainSpec(b, 128, "fp32", "sgd", offload_activations=True)
    sim, est = simulate_training(cfg, spec), estimate_training(cfg, spec)
    assert sim["peak_phase"] == est.peak_phase == "backward"
    assert abs(est.peak_bytes - sim["peak_bytes"]) <= 64, (est.peak_bytes, sim["peak_bytes"])
