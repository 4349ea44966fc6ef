"""A later micro-batch's ffn point under autocast (planner/arch/decoder.py RMSDecoder.block_points): the higher
of the activation's backward and down_proj's input-grad matmul, each config's estimate against the simulated step
(fake tensors, the same tracker as measure). Before: the matmul's alone, with autocast's MLP weight copies
freed and a b*s*f grad in place of dY's bf16 cast, 4,088 B over on both (the s256 fp16-amp accum2 rows of the
families grid +0.22..0.28%); the max(...) of the weight grad and the input grad before that, 16,392 B under on
the second (where the matmul is the top)."""
from __future__ import annotations

import dataclasses

import pytest

from planner.arch import families
from planner.estimate.training import estimate_training
from planner.measure.simulate import simulate_training
from planner.spec import TrainSpec


def _llama(**kw):
    return dataclasses.replace(families()["llama"].grid_configs()[0][1], vocab_size=97, **kw)


@pytest.mark.parametrize("cfg, s", [
    (_llama(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            tie_word_embeddings=True), 256),  # the activation's backward is the top (24,576 B above the matmul)
    (_llama(hidden_size=64, intermediate_size=160), 64),  # the matmul is (its 20,480 B bf16 weight grad)
])
def test_later_micro_batch_ffn_point_under_autocast(cfg, s):
    spec = TrainSpec(2, s, "bf16-amp", "adamw", checkpointing=True, grad_accum=2)
    est, sim = estimate_training(cfg, spec), simulate_training(cfg, spec)
    assert sim["peak_phase"] == est.peak_phase == "backward"
    # the loss's two 4-byte 0-d tensors the estimate leaves out
    assert 0 <= sim["phase_peak_bytes"]["backward"] - est.phase_peak_bytes["backward"] <= 8
