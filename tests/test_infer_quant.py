"""Inference with bitsandbytes-quantized weights (issue #21): the load users run (from_pretrained with
BitsAndBytesConfig), measured, simulated (4-bit) and estimated on a tiny Llama whose widths bitsandbytes' CPU
4-bit kernel accepts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.arch import families
from planner.config import ConfigError, preset
from planner.estimate.inference import estimate_inference
from planner.infer_quant import BLOCKSIZE_4BIT, quantized_linears, quantized_weight_bytes
from planner.infer_spec import InferSpec, check_infer

ROOT = Path(__file__).resolve().parent.parent
# widths multiples of 64 (bitsandbytes' AVX512-BF16 CPU kernel repacks absmax as (out, in/64))
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


def _llama(**kw):
    return families()["llama"].config_cls(**{**TINY, **kw})


def test_quantized_weight_bytes_follow_bitsandbytes_storage():
    cfg = preset("llama-3-8b")
    bf16 = estimate_inference(cfg, InferSpec(1, 1024, 16, precision="bf16", device="cuda"))
    nf4 = estimate_inference(cfg, InferSpec(1, 1024, 16, precision="bf16", quantize_weights="nf4", device="cuda"))
    int8 = estimate_inference(cfg, InferSpec(1, 1024, 16, precision="bf16", quantize_weights="int8", device="cuda"))
    lin = quantized_linears(cfg)
    assert len(lin) == 32 * 7  # q, k, v, o, gate, up, down per block; the head is kept (get_keys_to_not_convert)
    n = sum(x.n_out * x.n_in for x in lin)
    rest = 8_030_261_248 - n
    # int8: one byte per weight and an fp32 scale per output row (Int8Params.SCB)
    assert int8["components"]["weights"] == rest * 2 + n + 4 * sum(x.n_out for x in lin)
    # 4-bit: half a byte per weight, an fp32 absmax per 64 and the 16-entry fp32 code per linear
    assert nf4["components"]["weights"] == rest * 2 + n // 2 + 4 * n // BLOCKSIZE_4BIT + 64 * len(lin)
    assert nf4["components"]["weights"] < int8["components"]["weights"] < bf16["components"]["weights"]
    assert nf4["components"]["kv_cache"] == bf16["components"]["kv_cache"]  # the cache stays in bf16
    # double quantization: absmax in uint8 (one byte per 64) plus state2 per 256 blocks
    dq = quantized_weight_bytes(4096, 4096, InferSpec(1, 8, 2, quantize_weights="nf4", double_quant=True,
                                                      device="cuda"))
    assert dq < quantized_weight_bytes(4096, 4096, InferSpec(1, 8, 2, quantize_weights="nf4", device="cuda"))


def test_quantized_runs_refused_in_one_line():
    with pytest.raises(ConfigError, match="double-quant"):
        InferSpec(1, 8, 2, quantize_weights="int8", double_quant=True)
    with pytest.raises(ConfigError, match="unknown --quantize-weights"):
        InferSpec(1, 8, 2, quantize_weights="int4")
    with pytest.raises(ConfigError, match="not a transformers model"):
        check_infer(preset("gpt2-small"), InferSpec(1, 8, 2, cache="none", quantize_weights="nf4"))


def test_nf4_and_int8_measured_simulated_estimated():
    from planner.infer_quant import cpu_repacks_4bit
    from planner.measure.inference import measure_inference
    from planner.measure.simulate_infer import simulate_inference

    cfg = _llama(attention="sdpa")
    ispec = InferSpec(2, 16, 3, precision="bf16", quantize_weights="nf4", double_quant=True)
    m = measure_inference(cfg, ispec)
    s = simulate_inference(cfg, ispec)
    est = estimate_inference(cfg, ispec)
    # the weights as bitsandbytes holds them after the first generate() (repacked on an AVX512-BF16 CPU)
    assert m["persistent_bytes"] == s["persistent_bytes"] == est["persistent_bytes"]
    assert s["phase_peak_bytes"]["prefill"] == m["phase_peak_bytes"]["prefill"]
    assert abs(est["peak_bytes"] - m["peak_bytes"]) / m["peak_bytes"] < 0.01
    plain = estimate_inference(cfg, InferSpec(2, 16, 3, precision="bf16"))
    assert est["components"]["weights"] < plain["components"]["weights"]
    if cpu_repacks_4bit():  # absmax repacked to bf16 and double quantization undone: 2 B per 64 weights,
        lin = quantized_linears(cfg)  # the 16-entry code and the 0-d offset kept
        n = sum(x.n_out * x.n_in for x in lin)
        rest = sum(t.numel for t in families()["llama"].inventory(cfg) if t.kind == "param") - n
        assert est["components"]["weights"] == 2 * rest + n // 2 + 2 * n // BLOCKSIZE_4BIT + (64 + 4) * len(lin)
    i8 = InferSpec(2, 16, 3, precision="fp32", quantize_weights="int8")
    m8 = measure_inference(cfg, i8)
    e8 = estimate_inference(cfg, i8)
    assert m8["persistent_bytes"] == e8["persistent_bytes"]
    assert abs(e8["peak_bytes"] - m8["peak_bytes"]) / m8["peak_bytes"] < 0.01


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_cli_quantized_flags_and_refusals(tmp_path):
    ok = _cli("estimate", "infer", "llama-3-8b", "--batch-size", "1", "--prompt-len", "1024", "--new-tokens", "16",
              "--precision", "bf16", "--quantize-weights", "nf4", "--double-quant", "--json")
    assert ok.returncode == 0, ok.stderr
    rec = json.loads(ok.stdout)
    assert rec["run"]["quantize_weights"] == "nf4" and rec["run"]["double_quant"] is True
    assert rec["components"]["weights"] < 8_030_261_248  # under one byte per parameter
    bad = _cli("estimate", "infer", "llama-3-8b", "--batch-size", "1", "--prompt-len", "8", "--new-tokens", "2",
               "--quantize-weights", "int8", "--double-quant")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "double-quant" in bad.stderr
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"arch": "llama", **TINY}))
    bad = _cli("simulate", "infer", "--config", str(path), "--batch-size", "1", "--prompt-len", "8",
               "--new-tokens", "2", "--quantize-weights", "int8")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Int8Params" in bad.stderr
