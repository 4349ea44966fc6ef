"""Estimate vs real measured training steps on tiny models: the 2% bar, per phase and per component."""
import subprocess
import sys
from pathlib import Path

import pytest

from planner.config import GPT2Config, LlamaConfig
from planner.estimate.training import estimate_training
from planner.measure.training import measure_training
from planner.spec import TrainSpec

ROOT = Path(__file__).resolve().parent.parent
ACCURACY_BAR_PCT = 2.0  # issue #3: the estimate within 2% of the measured training step on the CPU
TINY_GPT = GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3, n_layers=2, drop_rate=0.1)
TINY_LLAMA = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)


TINY_EAGER = [TINY_GPT, TINY_LLAMA, GPT2Config(vocab_size=97, context_length=128, emb_dim=32, n_heads=4, n_layers=2),
              LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, attention="eager")]


@pytest.mark.parametrize("cfg", TINY_EAGER, ids=["gpt2", "llama", "gpt2-V97-eager", "llama-V97-eager"])
@pytest.mark.parametrize("spec", [
    TrainSpec(2, 32, "fp32", "adamw"),
    TrainSpec(2, 32, "bf16-amp", "adam"),
    TrainSpec(2, 32, "bf16-amp", "adam", checkpointing=True),
    TrainSpec(2, 64, "fp32", "sgd", checkpointing=True),
    TrainSpec(3, 17, "fp16-amp", "sgd-momentum", grad_accum=2),
    TrainSpec(2, 64, "bf16", "sgd"),
    TrainSpec(1, 8, "fp32", "adamw", optimizer_impl="foreach"),
    TrainSpec(2, 16, "fp32", "adamw", optimizer_impl="fused", checkpointing=True),
], ids=lambda s: f"{s.precision}-{s.optimizer}-{s.optimizer_impl}{'-ckpt' if s.checkpointing else ''}")
def test_peak_within_bar(cfg, spec):
    est = estimate_training(cfg, spec)
    meas = measure_training(cfg, spec)
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= ACCURACY_BAR_PCT / 100 * meas["peak_bytes"]
    # The persistent part is exact: weights + buffers + batch + optimizer (+ GradScaler) state.
    assert meas["persistent_bytes"] == (est.params_bytes + est.buffers_bytes + est.inputs_bytes
                                        + est.optimizer_bytes + est.transients["gradscaler"])
    assert meas["optimizer_bytes"] == est.optimizer_bytes
    # Every phase the estimate models is within the bar too, except forward (its transients are not
    # modelled; it never holds the peak).
    for phase in ("loss", "backward", "optimizer", "zero_grad"):
        m, e = meas["phase_peak_bytes"][phase], est.phase_peak_bytes[phase]
        assert abs(e - m) <= 0.03 * m, (phase, e, m)


def test_measurement_reports_timeline_and_rss():
    meas = measure_training(TINY_GPT, TrainSpec(2, 32))
    phases = {p["phase"] for p in meas["timeline"]}
    assert {"forward", "backward", "optimizer"} <= phases
    assert max(p["bytes"] for p in meas["timeline"]) == meas["peak_bytes"]
    assert meas["peak_rss_bytes"] > meas["peak_bytes"]  # RSS includes torch itself
    assert meas["step_time_s"] > 0


PURE = """
import sys
from planner import config, fit
from planner.cli import main as cli
from planner.config import PRESETS
from planner.estimate.loading import estimate_loading
from planner.estimate.training import estimate_training
from planner.spec import TrainSpec

est = estimate_training(PRESETS["llama-3-8b"], TrainSpec(8, 8192, "bf16-amp", "adamw", checkpointing=True))
assert est.peak_bytes > est.params_bytes + est.grads_bytes + est.optimizer_bytes
assert all({"name", "formula", "bytes"} <= set(t) for t in est.terms)
assert estimate_loading(PRESETS["gpt2-xl"], "mmap", "cuda").peak_device_bytes > 0
assert fit.fit_report(PRESETS["gpt2-small"], TrainSpec(1, 512), 2**34, batch_given=False)["max_batch_size"] > 0
for args in (["estimate", "train", "--model", "llama-3.2-1b", "--batch-size", "2", "--seq-len", "64", "--json"],
             ["estimate", "load", "--model", "gpt2-small", "--method", "all", "--json"],
             ["fit", "--model", "gpt2-small", "--seq-len", "256", "--budget", "8GiB", "--json"]):
    assert cli.main(args) == 0
print(sorted(m for m in ("torch", "transformers", "streamlit") if m in sys.modules))
"""


def test_estimate_is_pure_arithmetic():
    """The estimate side (config, estimate, fit, the CLI's estimate and fit commands) never imports torch:
    checked in a fresh interpreter, where nothing else can have imported it first."""
    r = subprocess.run([sys.executable, "-c", PURE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]", r.stdout.splitlines()[-1]


def test_cuda_estimate_models_device_differences():
    """On CUDA: bool dropout masks (1 B), foreach Adam (+P copy), allocator rounding and a cuBLAS
    workspace in the peak, the CUDA context as a separate line. (Unverified on a GPU; see docs.)"""
    cpu = estimate_training(TINY_GPT, TrainSpec(2, 32, "fp32", "adamw"))
    cuda = estimate_training(TINY_GPT, TrainSpec(2, 32, "fp32", "adamw", device="cuda"))
    assert cuda.activations_bytes < cpu.activations_bytes  # 1-byte dropout masks instead of fp32 noise
    assert cuda.transients["optimizer_temporaries"] == cpu.params_bytes  # foreach: one copy of every param
    assert cuda.transients["allocator_rounding"] > 0 and cuda.transients["cublas_workspace"] > 0
    assert "cuda_context_not_counted" in cuda.transients and "CUDA" in cuda.notes[0]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_measurement_within_3pct():
    spec = TrainSpec(2, 32, "fp32", "adamw", device="cuda")
    est, meas = estimate_training(TINY_GPT, spec), measure_training(TINY_GPT, spec)
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= 0.03 * meas["peak_bytes"]
