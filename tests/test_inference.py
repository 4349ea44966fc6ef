"""Inference (issue #21): generate()'s peak estimated, simulated on fake tensors and measured, on tiny configs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.arch import families
from planner.config import ConfigError, preset
from planner.estimate.inference import estimate_inference
from planner.infer_spec import InferSpec, check_infer

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)


def _llama(**kw):
    return families()["llama"].config_cls(**{**TINY, **kw})


def test_spec_refuses_bad_input():
    with pytest.raises(ConfigError, match="new_tokens must be positive"):
        InferSpec(1, 8, 0)
    with pytest.raises(ConfigError, match="unknown inference precision"):
        InferSpec(1, 8, 2, precision="bf16-amp")
    with pytest.raises(ConfigError, match="longer than the model's context"):
        check_infer(_llama(), InferSpec(1, 500, 20))
    with pytest.raises(ConfigError, match="cannot use cache 'static'"):
        check_infer(preset("gpt2-small"), InferSpec(1, 8, 2, cache="static"))


def test_estimate_grows_with_the_cache_and_names_its_parts():
    cfg = preset("llama-3-8b")
    small = estimate_inference(cfg, InferSpec(1, 1024, 16, precision="bf16"))
    big = estimate_inference(cfg, InferSpec(8, 4096, 16, precision="bf16"))
    # Llama-3-8B: 32 layers x 8 KV heads x 128 dims x K and V x 2 bytes = 131,072 B per token
    assert small["kv_cache_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert small["components"]["weights"] == 8_030_261_248 * 2
    assert big["peak_bytes"] > small["peak_bytes"]
    assert set(big["phase_peak_bytes"]) == {"prefill", "decode"}
    assert big["peak_bytes"] == max(big["phase_peak_bytes"].values())
    assert all("formula" in t for t in big["terms"])


@pytest.mark.parametrize("attention,precision,cache", [("sdpa", "fp32", "dynamic"), ("eager", "bf16", "static")])
def test_measure_simulate_and_estimate_agree(attention, precision, cache):
    from planner.measure.inference import measure_inference
    from planner.measure.simulate_infer import simulate_inference

    cfg = _llama(attention=attention)
    ispec = InferSpec(2, 48, 3, precision=precision, cache=cache)
    m = measure_inference(cfg, ispec)
    s = simulate_inference(cfg, ispec)
    est = estimate_inference(cfg, ispec)
    assert m["persistent_bytes"] == s["persistent_bytes"] == est["persistent_bytes"]
    assert s["phase_peak_bytes"]["prefill"] == m["phase_peak_bytes"]["prefill"]  # to the byte
    assert s["data_dependent_reads"]["stop_check"] == 3  # one per new token, answered as the real call
    assert m["peak_phase"] == est["peak_phase"] == "prefill"
    assert abs(est["peak_bytes"] - m["peak_bytes"]) / m["peak_bytes"] < 0.01


def test_book_gpt2_generate_text_simple_measured():
    from planner.measure.inference import measure_inference

    cfg = families()["gpt2"].config_cls(vocab_size=97, context_length=32, emb_dim=32, n_heads=2, n_layers=2)
    m = measure_inference(cfg, InferSpec(2, 8, 3, cache="none"))
    assert m["phase_peak_bytes"]["decode"] > m["persistent_bytes"]  # the whole context recomputed per token


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_estimate_infer_and_exit_codes(tmp_path):
    ok = _cli("estimate", "infer", "llama-3-8b", "--batch-size", "8", "--prompt-len", "4096", "--new-tokens", "256",
              "--precision", "bf16", "--json")
    assert ok.returncode == 0, ok.stderr
    rec = json.loads(ok.stdout)
    assert rec["peak_phase"] in ("prefill", "decode") and rec["components"]["kv_cache"] > 0
    bad = _cli("estimate", "infer", "llama-3-8b", "--batch-size", "1", "--prompt-len", "8000", "--new-tokens", "500")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "context" in bad.stderr
    bad = _cli("estimate", "infer", "gpt2-small", "--batch-size", "1", "--prompt-len", "8", "--new-tokens", "2",
               "--cache", "static")
    assert bad.returncode == 2 and "cannot use cache" in bad.stderr


def test_cli_simulate_infer(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"arch": "llama", **TINY}))
    out = _cli("simulate", "infer", "--config", str(path), "--batch-size", "2", "--prompt-len", "16",
               "--new-tokens", "2", "--json")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["kind"] == "simulate" and abs(rec["error_pct"]) < 2
