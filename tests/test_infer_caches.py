"""The cache types of issue #21 beyond dynamic and static: sliding window, quantized (fp8), offloaded; tiny configs."""
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


def _cfg(arch="mistral", **kw):
    return families()[arch].config_cls(**{**TINY, **kw})


def _three(cfg, ispec):
    from planner.measure.inference import measure_inference
    from planner.measure.simulate_infer import simulate_inference

    return measure_inference(cfg, ispec), simulate_inference(cfg, ispec), estimate_inference(cfg, ispec)


def test_sliding_refusals():
    with pytest.raises(ConfigError, match="cannot use cache 'sliding'"):
        check_infer(preset("llama-3-8b"), InferSpec(1, 64, 4, cache="sliding"))
    check_infer(_cfg(sliding_window=32), InferSpec(1, 64, 4, cache="sliding"))
    # a StaticCache keeps window-sized buffers on sliding layers (issue #39): modelled, not refused
    check_infer(_cfg(sliding_window=32), InferSpec(1, 64, 4, cache="static"))


@pytest.mark.parametrize("arch,kw,b,p,n,precision", [
    # issue #39's Gemma 2 (a full and a sliding layer, the prompt beyond the window of 64)
    ("gemma2", dict(vocab_size=1000, hidden_size=32, intermediate_size=64, num_attention_heads=4, head_dim=8,
                    sliding_window=64, attention="eager", pad_token_id=0), 2, 222, 9, "bf16"),
    # every layer sliding, SDPA with its bool mask; the decode rolls the full windows
    ("mistral", dict(vocab_size=500, hidden_size=64, intermediate_size=96, head_dim=16, sliding_window=40,
                     attention="sdpa"), 2, 100, 8, "fp32")])
def test_static_cache_with_sliding_layers(arch, kw, b, p, n, precision):
    """cache_implementation="static" on a windowed model: StaticSlidingWindowLayers keep min(w, p + n - 1) tokens
    (planner/arch/infer_windows.py static_window_options); exact in both phases, simulate = measure."""
    cfg = _cfg(arch, **kw)
    ispec = InferSpec(b, p, n, precision=precision, cache="static")
    check_infer(cfg, ispec)
    m, s, est = _three(cfg, ispec)
    assert s["phase_peak_bytes"] == m["phase_peak_bytes"]
    assert est["phase_peak_bytes"] == m["phase_peak_bytes"]
    assert est["peak_phase"] == m["peak_phase"]
    # the sliding layers' buffers hold the window, the full ones p + n - 1
    x = families()[arch].shape(cfg)
    per_token = 2 * b * x.kv * x.d * (2 if precision == "bf16" else 4)
    lens = [min(w, p + n - 1) if w is not None else p + n - 1 for w in families()[arch].infer_layer_windows(cfg)]
    kv = next(t["bytes"] for t in est["terms"] if t["name"].startswith("KV cache at the prefill high point (StaticCache: full layers"))
    assert kv == per_token * sum(lens) and kv < per_token * len(lens) * (p + n - 1)


def test_sliding_window_shrinks_the_decode_cache():
    """Mistral-7B at 32K: the window (4,096) caps the decode cache; the prefill still holds the prompt's K/V."""
    cfg = preset("mistral-7b-v0.1")
    slide = estimate_inference(cfg, InferSpec(1, 16000, 64, precision="bf16", cache="sliding"))
    per_token = slide["kv_cache_bytes_per_token"]
    assert slide["phase_peak_bytes"]["decode"] < slide["phase_peak_bytes"]["prefill"]
    kv_decode = next(t["bytes"] for t in slide["terms"] if t["name"] == "KV cache at the last decode step")
    assert kv_decode == per_token * 4096  # every layer keeps min(p + n - 1, w) tokens of storage
    assert slide["components"]["kv_cache"] == per_token * 16000  # the prompt's cat, in every layer


@pytest.mark.parametrize("attention,precision,prompt,new", [("sdpa", "fp32", 48, 3), ("eager", "bf16", 20, 16)])
def test_sliding_measured_simulated_estimated(attention, precision, prompt, new):
    """A window of 32 shorter than the run: the prompt beyond it (SDPA gets a mask, the first decode step frees
    the prompt's storage) and a prompt inside it whose decode crosses it."""
    cfg = _cfg(sliding_window=32, attention=attention)
    ispec = InferSpec(2, prompt, new, precision=precision, cache="sliding")
    m, s, est = _three(cfg, ispec)
    assert s["phase_peak_bytes"] == m["phase_peak_bytes"]  # to the byte, both phases
    assert est["phase_peak_bytes"] == m["phase_peak_bytes"]
    assert est["peak_phase"] == m["peak_phase"]


def test_sliding_gemma2_alternating_layers():
    cfg = families()["gemma2"].config_cls(**{**TINY, "num_hidden_layers": 3, "head_dim": 16, "sliding_window": 16,
                                             "attention": "eager"})
    ispec = InferSpec(2, 24, 4, cache="sliding")
    m, s, est = _three(cfg, ispec)
    assert s["phase_peak_bytes"] == m["phase_peak_bytes"] == est["phase_peak_bytes"]


def test_offloaded_device_and_host_figures():
    """DynamicCache(offloading=True): two layers' K/V on the device (the updated one and the prefetched layer 0),
    the rest on the host; the device's peak falls by the other layers' K/V, nothing else changes."""
    cfg = preset("llama-3.1-8b")
    dyn = estimate_inference(cfg, InferSpec(8, 32000, 256, precision="bf16"))
    off = estimate_inference(cfg, InferSpec(8, 32000, 256, precision="bf16", cache="offloaded"))
    layer = dyn["kv_cache_bytes_per_token"] // 32  # one layer's K and V per token (32 layers)
    assert off["phase_peak_bytes"]["prefill"] == dyn["phase_peak_bytes"]["prefill"] - 8 * 32000 * layer * 31
    assert off["host_kv_cache_bytes"] == 8 * (32000 + 255) * layer * 31
    assert off["device_figure"].endswith("for the CUDA check")


def test_offloaded_measure_refused_on_cpu(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"arch": "llama", **TINY}))
    out = subprocess.run([sys.executable, "-m", "planner", "measure", "infer", "--config", str(path), "--batch-size",
                          "1", "--prompt-len", "8", "--new-tokens", "2", "--cache", "offloaded"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "CUDA" in out.stderr


@pytest.mark.parametrize("arch,attention,precision", [("gemma", "sdpa", "bf16"), ("llama", "eager", "fp32")])
def test_quantized_fp8_measured_simulated_estimated(arch, attention, precision):
    """QuantizedCache(backend="fp8"): 1-byte K/V and a scale per layer; the prompt's last layer keeps its own
    full-precision K/V through its attention, and each decode step dequantizes the whole cache."""
    cfg = _cfg(arch, attention=attention, **({"head_dim": 32} if arch == "gemma" else {}))
    ispec = InferSpec(2, 48, 3, precision=precision, cache="quantized")
    m, s, est = _three(cfg, ispec)
    assert s["phase_peak_bytes"] == m["phase_peak_bytes"]
    assert est["phase_peak_bytes"] == m["phase_peak_bytes"]
    dyn = estimate_inference(cfg, InferSpec(2, 48, 3, precision=precision))
    assert est["components"]["kv_cache"] < dyn["components"]["kv_cache"]


def test_quantized_refused_for_a_sliding_model_and_shown_in_bytes():
    with pytest.raises(ConfigError, match="cannot use cache 'quantized'"):
        check_infer(preset("mistral-7b-v0.1"), InferSpec(1, 64, 4, cache="quantized"))
    cfg = preset("llama-3.1-8b")
    dyn = estimate_inference(cfg, InferSpec(1, 32000, 64, precision="bf16"))
    q = estimate_inference(cfg, InferSpec(1, 32000, 64, precision="bf16", cache="quantized"))
    kv = next(t["bytes"] for t in q["terms"] if t["name"] == "KV cache at the last decode step")
    assert kv == (32000 + 63) * dyn["kv_cache_bytes_per_token"] // 2 + 8 * 32  # 1 byte per element, 2 scales a layer


def test_serving_advice_ranks_the_cache_options():
    from planner.serving import advice

    cfg = preset("llama-3.1-8b")
    gpu = {c.label: c for c in advice(cfg, InferSpec(8, 32000, 256, precision="bf16", device="cuda"), 80 * 2**30)}
    assert {"an offloaded KV cache (CUDA)", "an fp8 KV cache (QuantizedCache, fp8 backend)"} <= set(gpu)
    assert gpu["an offloaded KV cache (CUDA)"].peak_bytes < gpu["an fp8 KV cache (QuantizedCache, fp8 backend)"].peak_bytes
    assert all("docs" in gpu[k].cost for k in gpu if "KV cache" in k)  # each cost names its source
    cpu = {c.label for c in advice(cfg, InferSpec(8, 32000, 256, precision="bf16"), 80 * 2**30)}
    assert "an offloaded KV cache (CUDA)" not in cpu


def test_cli_sliding_without_a_window_is_refused_in_one_line():
    out = subprocess.run([sys.executable, "-m", "planner", "estimate", "infer", "llama-3-8b", "--batch-size", "1",
                          "--prompt-len", "64", "--new-tokens", "4", "--cache", "sliding"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no sliding window" in out.stderr
    ok = subprocess.run([sys.executable, "-m", "planner", "estimate", "infer", "mistral-7b-v0.1", "--batch-size", "1",
                         "--prompt-len", "8000", "--new-tokens", "64", "--precision", "bf16", "--cache", "sliding",
                         "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["run"]["cache"] == "sliding"
