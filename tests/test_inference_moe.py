"""The MoE families' generate() (planner/arch/moe.py infer_forward_points; mixtral.py, qwen2_moe.py, qwen3_moe.py):
the sparse block under inference_mode (router, dispatch, the grouped experts, the combine; Qwen2-MoE's shared
expert and the sliding-window mask its model builds unused; Qwen3-MoE's q norm), estimated against the live-bytes
measurement of the real generate() within the project's 1% bar and, on these shapes, to the byte in both phases.
Each case is chosen so that a different point of the block is the prompt's high point (named in the case): the
router's with many experts and narrow widths."""
from __future__ import annotations

import dataclasses

import pytest

from planner.arch import families
from planner.estimate.inference import estimate_inference
from planner.infer_spec import InferSpec

BAR_PCT = 1.0  # the project's bar for an estimate against its measurement (README: "within 1% unless told")
# small shapes (the experts' widths in 16-byte strides: MoEDecoder.check_run); the vocabulary small enough that the
# block, not the logits, is each prompt's high point
TINY = dict(vocab_size=500, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

CASES = [  # family, config keys, (batch, prompt, new tokens, precision, cache), the prompt's expected high point
    ("mixtral", dict(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                     attention="sdpa"), (2, 32, 4, "fp32", "dynamic"), "mlp experts gate"),
    ("mixtral", dict(hidden_size=128, intermediate_size=16, num_local_experts=3, num_experts_per_tok=1,
                     attention="eager"), (2, 48, 3, "bf16", "static"), "mlp experts sum"),
    ("mixtral", dict(hidden_size=128, intermediate_size=32, num_local_experts=4, num_experts_per_tok=3,
                     attention="sdpa"), (3, 40, 3, "bf16", "dynamic"), "mlp experts un-permute"),
    ("mixtral", dict(hidden_size=16, intermediate_size=16, num_local_experts=64, num_experts_per_tok=1,
                     num_attention_heads=2, num_key_value_heads=1, attention="sdpa"), (2, 64, 3, "bf16", "dynamic"),
     "mlp router"),
    ("qwen2_moe", dict(hidden_size=16, moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=64,
                       num_experts_per_tok=1, num_attention_heads=2, num_key_value_heads=1, attention="sdpa"),
     (2, 64, 3, "bf16", "dynamic"), "mlp router"),
    ("qwen2_moe", dict(hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=256, num_experts=4,
                       num_experts_per_tok=2, attention="sdpa"), (2, 64, 4, "bf16", "dynamic"), "mlp shared expert"),
    ("qwen2_moe", dict(hidden_size=96, moe_intermediate_size=40, shared_expert_intermediate_size=72, num_experts=4,
                       num_experts_per_tok=2, attention="eager"), (2, 64, 4, "fp32", "dynamic"), "mlp experts un-permute"),
    ("qwen2_moe", dict(hidden_size=96, moe_intermediate_size=40, shared_expert_intermediate_size=72, num_experts=4,
                       num_experts_per_tok=2, norm_topk_prob=True, attention="sdpa"), (2, 64, 4, "fp16", "static"),
     "mlp experts un-permute"),
    ("qwen3_moe", dict(hidden_size=32, head_dim=32, num_attention_heads=8, num_key_value_heads=1,
                       moe_intermediate_size=16, num_experts=4, num_experts_per_tok=1, norm_topk_prob=True,
                       attention="sdpa"), (2, 64, 4, "fp16", "static"), "q norm's fp32 temporaries (before the cache update)"),
    ("qwen3_moe", dict(hidden_size=64, head_dim=24, moe_intermediate_size=128, num_experts=6, num_experts_per_tok=3,
                       norm_topk_prob=False, attention="eager"), (2, 64, 4, "bf16", "dynamic"), "mlp experts gate"),
]


def _case(name, keys, run):
    base = families()[name].grid_configs()[0][1]
    cfg = dataclasses.replace(base, **{**TINY, **keys})
    b, p, n, precision, cache = run
    return cfg, InferSpec(b, p, n, precision=precision, cache=cache)


@pytest.mark.parametrize("name,keys,run,point", CASES, ids=[f"{c[0]}-{c[3]}-{c[2][3]}-{c[2][4]}" for c in CASES])
def test_estimate_equals_measurement_in_both_phases(name, keys, run, point):
    from planner.measure.inference import measure_inference

    cfg, ispec = _case(name, keys, run)
    est, m = estimate_inference(cfg, ispec), measure_inference(cfg, ispec)
    assert est["prefill_high_point"] == point
    assert est["notes"] and not any("not modelled" in n for n in est["notes"])
    err = 100.0 * (est["peak_bytes"] - m["peak_bytes"]) / m["peak_bytes"]
    assert abs(err) <= BAR_PCT, f"{err:+.3f}%"
    assert est["phase_peak_bytes"] == m["phase_peak_bytes"]  # prefill and decode, to the byte


def test_every_routed_size_is_a_function_of_tokens_times_top_k():
    """No measurement: the block's points grow with N*k and not with the experts' count beyond the router and
    histc's counts (4*E each, the router's logits N*E*e): the routing never changes a size (moe.py docstring)."""
    fam = families()["mixtral"]
    cfg, ispec = _case("mixtral", CASES[0][1], CASES[0][2])
    more = dataclasses.replace(cfg, num_local_experts=8)
    p4, p8 = fam.infer_prefill_points(cfg, ispec, 4), fam.infer_prefill_points(more, ispec, 4)
    N = ispec.batch_size * ispec.prompt_len
    assert p8["mlp experts gate"] - p4["mlp experts gate"] == 4 * (N * 4 + 8)  # logits N*E*e, histc's counts and offsets
