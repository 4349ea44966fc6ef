"""The prompt's RoPE point in generate() (issue #21; planner/arch/decoder.py RMSDecoder.infer_rope_at): where q is
wider than the hidden size and kv = a (Qwen 3's and Gemma's explicit head_dim), the last layer's rotation of k,
before its cache update, is the prompt's high point. Estimated against the live-bytes measurement to the byte, on
the bench grid's second shape (bench/inference.py grid_rows: V2000 h48 a6 kv6, head_dim 24 / 32)."""
from __future__ import annotations

from planner.arch import families
from planner.arch.decoder import ROPE_POINT
from planner.estimate.inference import estimate_inference
from planner.infer_spec import InferSpec


def _grid_cfg(family: str, attention: str, index: int = 1):
    import dataclasses

    fam = families()[family]
    label, cfg, b, s = fam.grid_configs()[index]
    assert label.startswith(("V2000 h48 a6 kv6", "V97 h32 a4 kv2")[index == 3])
    return dataclasses.replace(cfg, attention=attention), b, s


def test_rope_point_equals_measurement():
    """qwen3 V2000 h48 a6 kv6 d24 SDPA fp32: the prompt's peak at k's rotation (-9.40% before the point)."""
    from planner.measure.inference import measure_inference

    cfg, b, s = _grid_cfg("qwen3", "sdpa")
    ispec = InferSpec(b, s, 4, precision="fp32")
    m, est = measure_inference(cfg, ispec), estimate_inference(cfg, ispec)
    assert est["phase_peak_bytes"] == m["phase_peak_bytes"]  # prefill and decode, to the byte
    assert est["peak_phase"] == m["peak_phase"] == "prefill"
    assert est["prefill_high_point"] == ROPE_POINT
    # the point stands on every layer's K/V but the last one (not written yet)
    layer_kv = 2 * b * cfg.num_key_value_heads * cfg.head_dim * s * 4
    assert est["components"]["kv_cache"] == (cfg.num_hidden_layers - 1) * layer_kv


def test_qwen3_q_norm_point_with_the_fp8_cache():
    """qwen3 V97 h32 a4 kv2 d24 b2 s256 SDPA bf16, quantized cache: the q norm's fp32 temporaries are the prompt's
    peak (a = 2 kv), beside the other layers' fp8 K/V (-2.08% before the point)."""
    from planner.arch.qwen3 import Q_NORM_POINT
    from planner.measure.inference import measure_inference

    cfg, b, s = _grid_cfg("qwen3", "sdpa", 3)
    ispec = InferSpec(b, s, 4, precision="bf16", cache="quantized")
    m, est = measure_inference(cfg, ispec), estimate_inference(cfg, ispec)
    assert est["phase_peak_bytes"]["prefill"] == m["phase_peak_bytes"]["prefill"]
    assert est["peak_bytes"] == m["peak_bytes"] and m["peak_phase"] == "prefill"
    assert est["prefill_high_point"] == Q_NORM_POINT
    assert any(t["name"].endswith(f"the last layer's {Q_NORM_POINT})") for t in est["terms"])


def test_rope_point_is_q_or_k_rotation():
    """b*s*d*e*max(4a + 2kv, 2a + 5kv) beside the norm output and the context: q's rotation wins when a > 1.5 kv."""
    fam = families()["llama"]
    cfg, b, s = _grid_cfg("qwen3", "sdpa")
    ispec = InferSpec(b, s, 4)
    x = fam.shape(cfg)
    unit = b * s * x.d * 4
    assert fam.infer_rope_at(cfg, ispec, 4, s, s) == 7 * x.a * unit  # kv = a: k's rotation, 2a + 5kv
    import dataclasses

    gqa = dataclasses.replace(cfg, num_key_value_heads=2)  # a = 6, kv = 2: q's rotation, 4a + 2kv = 28 > 22
    assert fam.infer_rope_at(gqa, ispec, 4, s, s) == 28 * unit
