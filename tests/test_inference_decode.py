"""Inference (issue #21): the decode phase's figure, estimate against a real child's measurement, both phases.

Each row is one of `bench inference`'s full-grid rows whose decode high point is not the cache concatenation or
the token selection (the estimate's phase_peak_bytes["decode"] missed it before): the step's MLP (few tokens, a
small vocabulary), the last step's position_ids update beside the logits (a long prompt, a small vocabulary, a
StaticCache), the eager mask at the cache concatenation, a sliding-window layer's old keys there (Gemma 2) and
the step's RoPE before the last layer's update (Qwen 3). They are measured in one child process, through the
path the bench itself uses (bench/inference.py grid_records), and compared to the byte in both phases.
"""
from __future__ import annotations

import pytest

from bench.inference import grid_records, grid_rows
from planner.estimate.inference import estimate_inference

# (family, config label, attention, precision, cache): what decides the decode phase there (measured)
ROWS = [
    ("llama", "V97 h96 a3 kv1 untied b4 s8", "eager", "fp32", "dynamic"),    # act(gate) * up of the step
    ("llama", "V97 h32 a4 kv2 tied b2 s256", "sdpa", "fp32", "static"),      # position_ids' cat after the forward
    ("qwen3", "V2000 h48 a6 kv6 tied b2 s48", "eager", "fp32", "dynamic"),   # the eager mask at the values' cat
    ("qwen3", "V97 h32 a4 kv2 tied b2 s256", "sdpa", "bf16", "static"),      # the step's RoPE / q norm, before the update
    ("gemma2", "V2000 h48 a6 kv6 tied b2 s48", "eager", "fp32", "dynamic"),  # a sliding layer's old keys and values
    ("phi3", "V97 h32 a4 kv2 tied b2 s256", "sdpa", "fp32", "dynamic"),      # the fused qkv output at the cat
    ("gpt2-hf", "V97 h96 a3 p0.1 b4 s8", "eager", "bf16", "static"),         # gelu_new's products in the step
]


def _rows():
    want = set(ROWS)
    out = [r for fam in sorted({f for f, *_ in ROWS}) for r in grid_rows(False, fam)
           if (r[0], r[1], getattr(r[2], "attention", "eager"), r[3].precision, r[3].cache) in want]
    assert len(out) == len(ROWS)  # every row above is a row of the bench's full grid
    return out


@pytest.fixture(scope="module")
def measured():
    rows = _rows()
    return [(row, m, s) for row, (m, s) in zip(rows, grid_records(rows))]


def test_both_phases_equal_the_measurement_to_the_byte(measured):
    for (name, label, cfg, ispec), m, _ in measured:
        est = estimate_inference(cfg, ispec)
        assert "error" not in m, m
        assert est["phase_peak_bytes"] == m["phase_peak_bytes"], (name, label, cfg.attention, ispec)
        assert est["peak_phase"] == m["peak_phase"] == "prefill"  # the peak column alone does not show decode


def test_decode_high_points_are_named(measured):
    """The decode phase's figure is the highest of named options: the ones these rows exercise are there."""
    names = set()
    for (_, _, cfg, ispec), _, _ in measured:
        est = estimate_inference(cfg, ispec)
        names |= {t["name"] for t in est["terms"] if t["where"] == "decode"}
    assert {"decode high point: the step's mlp", "decode high point: the step's norm",
            "decode high point: cache concatenation (the last layer's old values)"} <= names
    assert any(n.startswith("decode high point: the step's RoPE") for n in names)


def test_simulation_sees_the_same_decode_phase(measured):
    for (name, label, cfg, ispec), m, s in measured:
        assert s["phase_peak_bytes"] == m["phase_peak_bytes"], (name, label, cfg.attention, ispec)
