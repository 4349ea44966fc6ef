"""Phi-3's generate() (issue #21): the fused qkv output alive through the attention and, with int8 weights,
down_proj's input quantization beside the fused gate_up output (planner/arch/phi3.py). Estimated against the
live-bytes measurement to the byte, per phase, on the bench grids' tiny phi3 (bench/inference.py and
bench/infer_quant.py use these widths)."""
from __future__ import annotations

import pytest

from planner.arch import families
from planner.estimate.inference import estimate_inference
from planner.infer_spec import InferSpec

TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0)


def _phi3(**kw):
    return families()["phi3"].config_cls(**{**TINY, **kw})


@pytest.mark.parametrize("attention,precision,cache", [("eager", "bf16", "dynamic"), ("sdpa", "fp32", "static")])
def test_estimate_equals_measurement_in_both_phases(attention, precision, cache):
    from planner.measure.inference import measure_inference

    cfg = _phi3(attention=attention)
    ispec = InferSpec(2, 64, 4, precision=precision, cache=cache)
    m, est = measure_inference(cfg, ispec), estimate_inference(cfg, ispec)
    assert est["phase_peak_bytes"] == m["phase_peak_bytes"]  # prefill and decode, to the byte
    assert est["peak_phase"] == m["peak_phase"] == "prefill"
    if attention == "eager" and precision == "bf16":  # the attention is the prompt's high point here, and
        assert est["prefill_high_point"] == "attention"  # the fused (b, s, (a + 2 kv) * d) output is in it
        e, op = 2, (4 + 2 * 2) * 16
        llama_like = families()["llama"].infer_attention(cfg, ispec, e, 64, 64)
        assert families()["phi3"].infer_attention(cfg, ispec, e, 64, 64) - llama_like == 2 * 64 * op * e


def test_int8_down_proj_quantization_point():
    from planner.measure.inference import measure_inference

    cfg = _phi3(attention="sdpa", intermediate_size=128)  # bitsandbytes' widths (bench inference-quantized)
    ispec = InferSpec(2, 64, 4, precision="bf16", quantize_weights="int8")
    m, est = measure_inference(cfg, ispec), estimate_inference(cfg, ispec)
    assert est["persistent_bytes"] == m["persistent_bytes"]
    assert est["phase_peak_bytes"]["prefill"] == m["phase_peak_bytes"]["prefill"]
    assert est["prefill_high_point"] == "mlp: down_proj int8 input quantization"
    plain = estimate_inference(cfg, InferSpec(2, 64, 4, precision="bf16"))
    assert not any("int8 input quantization" in t["name"] for t in plain["terms"])


def test_sdpa_output_copy_in_the_prompt():
    """Issue #39: with a small MLP the prompt's attention is Phi-3's high point, where SDPA's output (in q's
    contiguous layout: RoPE ends in torch.cat) and its transpose(1, 2).contiguous() copy are both alive beside q
    (planner/arch/phi3.py infer_attention_at). Estimate = measure = simulate in both phases."""
    from planner.measure.inference import measure_inference
    from planner.measure.simulate_infer import simulate_inference

    cfg = families()["phi3"].config_cls(vocab_size=6913, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                                        num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False,
                                        pad_token_id=0, attention="sdpa")
    ispec = InferSpec(1, 253, 14, precision="bf16", cache="dynamic")
    m, s, est = measure_inference(cfg, ispec), simulate_inference(cfg, ispec), estimate_inference(cfg, ispec)
    assert s["phase_peak_bytes"] == m["phase_peak_bytes"]
    assert est["phase_peak_bytes"] == m["phase_peak_bytes"]
    assert est["prefill_high_point"] == "attention"
    # the copy is b*a*s*d*e over Llama's tensors; one query (decode) copies nothing: (b, a, 1, d) transposed is
    # contiguous already
    from planner.arch.decoder import RMSDecoder

    fam = families()["phi3"]
    llama_like = lambda s: RMSDecoder.infer_attention_at(fam, cfg, ispec, 2, s, s, False)
    assert fam.infer_attention_at(cfg, ispec, 2, 253, 253, False) - llama_like(253) == 1 * 8 * 253 * 32 * 2
    assert fam.infer_attention_at(cfg, ispec, 2, 1, 266, False) == RMSDecoder.infer_attention_at(fam, cfg, ispec, 2, 1,
                                                                                                 266, False)
