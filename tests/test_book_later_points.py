"""The book's GPT-2 in a later micro-batch of gradient accumulation (planner/arch/gpt2_book.py block_points): the
GELU's backward runs after ff.layers.2's grads were added in place and freed; ff.layers.2's weight-grad matmul (and
under autocast its fp32 cast) is a point of its own. Each shape's estimate against the simulated step (fake tensors,
the same tracker as measure), and the first shape against a measured child: full checkpointing accum2 was +1.14%
(V500 h48 L4 b2 s32 fp32), ff.layers.2's matmul -2.1% (V97 h96 b4 s8 fp32), its cast -1.06% (bf16-AMP)."""
from __future__ import annotations

import pytest

from planner.config import GPT2Config
from planner.estimate.training import estimate_training
from planner.measure.simulate import simulate_training
from planner.spec import TrainSpec

V500 = GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3, n_layers=4, drop_rate=0.0, qkv_bias=False)
V97 = GPT2Config(vocab_size=97, context_length=64, emb_dim=96, n_heads=3, n_layers=2, drop_rate=0.1, qkv_bias=False)


@pytest.mark.parametrize("cfg,b,s,precision,ckpt", [
    (V500, 2, 32, "fp32", True),       # the GELU point without ff.layers.2's grads
    (V500, 2, 32, "bf16", True),
    (V97, 4, 8, "fp32", True),         # ff.layers.2's weight-grad matmul is the top
    (V97, 4, 8, "bf16-amp", True),     # its fp32 cast under autocast is
    (V97, 4, 8, "fp32", False),        # without checkpointing: at the bias grad's sum, the saved input still held
    (V97, 4, 8, "bf16-amp", False)])
def test_later_micro_batch_points(cfg, b, s, precision, ckpt):
    spec = TrainSpec(b, s, precision, "adamw", checkpointing=ckpt, grad_accum=2)
    est, sim = estimate_training(cfg, spec), simulate_training(cfg, spec)
    assert sim["peak_phase"] == est.peak_phase == "backward"
    # the loss's 0-d tensors the estimate leaves out (4 B each)
    assert 0 <= sim["phase_peak_bytes"]["backward"] - est.phase_peak_bytes["backward"] <= 8


def test_later_micro_batch_measured():
    from planner.measure.training import measure_training

    spec = TrainSpec(2, 32, "fp32", "adamw", checkpointing=True, grad_accum=2)
    est, meas = estimate_training(V500, spec), measure_training(V500, spec)
    assert meas["peak_phase"] == est.peak_phase == "backward"
    assert 0 <= meas["peak_bytes"] - est.peak_bytes <= 8
