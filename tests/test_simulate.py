"""Simulation on fake tensors (planner.measure.simulate): equal to measurement to the byte, any module, one-line errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from planner.cli import main as cli
from bench.main import accuracy_grid, run_accuracy
from planner.config import GPT2Config, LlamaConfig
from planner.measure.tracker import LiveBytesTracker
from planner.measure.training import _PhaseRecorder, measure_training
from planner.measure.simulate import SimulationError, simulate_training
from planner.spec import TrainSpec

ROOT = Path(__file__).resolve().parent.parent
ACCURACY_BAR_PCT = 2.0  # issue #3: the estimate within 2% of the measured training step on the CPU
SIM_BAR = 1e-4  # 0.01%: the bar; on the CPU every row so far is equal to the byte

TINY_LM = '''
import torch
from torch import nn

class TinyLM(nn.Module):
    def __init__(self, vocab=101, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        h = self.emb(x)
        return self.head(h + self.mlp(h))

def make_model():
    return TinyLM()

def returns_int():
    return 42

def raises():
    raise RuntimeError("boom in make_model")

class Branchy(TinyLM):
    def forward(self, x):
        h = self.emb(x)
        if h.sum() > 0:
            h = h * 2
        return self.head(h)

def branchy():
    return Branchy()

class Nonzero(TinyLM):
    def forward(self, x):
        keep = torch.nonzero(x)
        return self.head(self.emb(x))

def nonzero():
    return Nonzero()

def no_embedding():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))
'''

CLASSIFIER = '''
import torch
from torch import nn

def make_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))

def make_batch(batch_size, seq_len):
    return torch.randn(batch_size, 16), torch.randint(0, 10, (batch_size,))

def loss_fn(output, targets):
    return nn.functional.cross_entropy(output, targets, label_smoothing=0.1)
'''


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user_modules")
    (folder / "tiny_lm.py").write_text(TINY_LM)
    (folder / "classifier.py").write_text(CLASSIFIER)
    (folder / "broken.py").write_text("import torch\nraise ImportError('no such thing')\n")
    return folder


def _measure_module(path: Path, func: str, spec: TrainSpec) -> dict:
    """measure_training's three steps, for a user's module (the real tensors)."""
    from planner.routines.user_module import ModuleTrainingStep

    step = ModuleTrainingStep(path, func, spec)
    step.run()
    tracker = LiveBytesTracker()
    tracker.track(step.persistent_tensors())
    tracker.reset_peak()
    persistent = tracker.current
    recorder = _PhaseRecorder(tracker, step.device)
    with tracker:
        step.run(on_phase=recorder)
    return {"peak_bytes": max(recorder.phase_peak.values()), "persistent_bytes": persistent,
            "phase_peak_bytes": recorder.phase_peak}


def test_simulate_equals_measure_on_quick_grid():
    """The quick accuracy grid, measured and simulated in this process: the estimate meets its bar, and the
    simulation equals the measurement (peak and every phase's peak)."""
    results = run_accuracy(accuracy_grid(quick=True), in_process=True, simulate=True, progress=lambda *_: None)
    assert len(results) >= 7
    assert max(abs(r["error_pct"]) for r in results) <= ACCURACY_BAR_PCT
    for r in results:
        assert abs(r["simulated_bytes"] - r["measured_bytes"]) <= SIM_BAR * r["measured_bytes"], r["config"]
        assert r["simulated_phase"] == r["measured_phase"], r["config"]
        for phase, m in r["measured_phase_peak_bytes"].items():
            assert abs(r["simulated_phase_peak_bytes"][phase] - m) <= SIM_BAR * m, (r["config"], phase)


@pytest.mark.parametrize("cfg, spec", [
    (GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3, n_layers=2, drop_rate=0.1),
     TrainSpec(2, 32, "fp16-amp", "adamw", checkpointing=True, optimizer_impl="fused")),
    (GPT2Config(vocab_size=97, context_length=64, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.1, attention="sdpa"),
     TrainSpec(3, 17, "bf16-amp", "adamw", grad_accum=2, optimizer_impl="foreach")),
    (LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                 num_key_value_heads=2, max_position_embeddings=64),
     TrainSpec(2, 32, "bf16-amp", "adam", checkpointing=True)),
], ids=["gpt2-dropout-ckpt-fp16amp-fused", "gpt2-sdpa-dropout-accum2-foreach", "llama-ckpt-bf16amp"])
def test_simulate_equals_measure_with_dropout_checkpointing_and_optimizer_paths(cfg, spec):
    """What the quick grid lacks: dropout, checkpointing (recompute), GradScaler, foreach and fused optimizers."""
    sim, meas = simulate_training(cfg, spec), measure_training(cfg, spec)
    assert sim["peak_bytes"] == meas["peak_bytes"]
    assert sim["phase_peak_bytes"] == meas["phase_peak_bytes"]
    assert sim["persistent_bytes"] == meas["persistent_bytes"]
    assert sim["optimizer_bytes"] == meas["optimizer_bytes"]
    assert sim["peak_phase"] == meas["peak_phase"]


def test_simulated_record_matches_measure_record():
    cfg = GPT2Config(vocab_size=97, context_length=32, emb_dim=32, n_heads=2, n_layers=1)
    spec = TrainSpec(2, 16, "fp16-amp", "adamw")
    sim, meas = simulate_training(cfg, spec), measure_training(cfg, spec)
    assert sim["kind"] == "simulate" and meas["kind"] == "measure"
    missing = set(meas) - set(sim)
    # Only what a simulation cannot have: the real step's time and RSS (and the tracker's overhead).
    assert missing == {"step_time_s", "tracked_step_time_s", "tracker_overhead", "rss_before_bytes",
                       "peak_rss_bytes", "rss_anon_bytes", "rss_file_bytes"}
    assert max(p["bytes"] for p in sim["timeline"]) == sim["peak_bytes"]
    assert [p["op"] for p in sim["timeline"]] == sorted(p["op"] for p in sim["timeline"])
    # The step's data-dependent reads, answered: Adam's step count per parameter, GradScaler's inf check, loss.item().
    n_params = sum(1 for _ in __import__("planner.routines", fromlist=["build_model"]).build_model(cfg, "meta").parameters())
    assert sim["data_dependent_reads"] == {"optimizer_step_count": n_params, "gradscaler_found_inf": 1, "loss_item": 1,
                                           "packed_sequence_check": 0}


def test_simulation_allocates_nothing_at_full_size():
    """A step of ~40 GiB of tensors (a GPT 8192 wide, 2 blocks: 2 billion parameters, AdamW) simulated here
    creates none of them: this process's RSS grows by well under 1 GiB. Two blocks keep the op count small."""
    from planner.estimate.training import estimate_training
    from planner.measure import procmem

    cfg = GPT2Config(vocab_size=50257, context_length=1024, emb_dim=8192, n_heads=64, n_layers=2)
    spec = TrainSpec(1, 1024, "bf16-amp", "adamw")
    before = procmem.read_status()["VmRSS"]
    procmem.reset_peak_rss()
    sim = simulate_training(cfg, spec)
    assert sim["peak_bytes"] > 30 * 2**30
    assert procmem.read_status()["VmHWM"] - before < 2**30
    est = estimate_training(cfg, spec)
    assert abs(est.peak_bytes - sim["peak_bytes"]) <= 0.01 * sim["peak_bytes"]


def test_user_module_simulated_equals_measured(modules):
    spec = TrainSpec(2, 16, "fp32", "adamw")
    sim = simulate_training(None, spec, module=(str(modules / "tiny_lm.py"), "make_model"))
    meas = _measure_module(modules / "tiny_lm.py", "make_model", spec)
    assert sim["peak_bytes"] == meas["peak_bytes"]
    assert sim["persistent_bytes"] == meas["persistent_bytes"]
    assert sim["phase_peak_bytes"] == {p: meas["phase_peak_bytes"].get(p, 0) for p in sim["phase_peak_bytes"]}


def test_user_module_with_batch_and_loss(modules):
    spec = TrainSpec(4, 1, "bf16", "sgd-momentum")
    sim = simulate_training(None, spec, module=(str(modules / "classifier.py"), "make_model"))
    meas = _measure_module(modules / "classifier.py", "make_model", spec)
    assert sim["peak_bytes"] == meas["peak_bytes"]
    params = (16 * 64 + 64 + 64 * 10 + 10) * 2  # bf16 weights
    assert sim["optimizer_bytes"] == params  # one momentum buffer per parameter


@pytest.mark.parametrize("func, message", [
    ("nope", "tiny_lm.py defines no nope"),
    ("returns_int", "returns_int() returned int, not a torch.nn.Module"),
    ("raises", "raises() raised RuntimeError: boom in make_model (at tiny_lm.py:23 in raises)"),
    ("branchy", "aten._local_scalar_dense (Tensor.item() or bool(tensor)) at tiny_lm.py:28 in forward"),
    ("nonzero", "the op aten.nonzero.default cannot run on fake tensors (its output's shape depends on tensor "
                "values) at tiny_lm.py:37 in forward"),
    ("no_embedding", "the module has no nn.Embedding to draw token ids for; define make_batch"),
])
def test_user_module_errors_are_one_line(modules, func, message):
    with pytest.raises(SimulationError) as info:
        simulate_training(None, TrainSpec(2, 8), module=(str(modules / "tiny_lm.py"), func))
    text = str(info.value)
    assert message in text and "\n" not in text


def test_module_that_fails_to_import(modules):
    with pytest.raises(SimulationError, match=r"importing broken.py failed: ImportError: no such thing \(at broken.py:2"):
        simulate_training(None, TrainSpec(2, 8), module=(str(modules / "broken.py"), "make_model"))


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="checks the refusal on a CPU-only build of torch")
def test_cuda_refused_on_a_cpu_build():
    cfg = GPT2Config(vocab_size=97, context_length=32, emb_dim=32, n_heads=2, n_layers=1)
    with pytest.raises(SimulationError, match="needs a CUDA build of torch"):
        simulate_training(cfg, TrainSpec(2, 8, device="cuda"))


@pytest.mark.parametrize("args, message", [
    (["--module", "/nonexistent/model.py:make_model"], "module file not found: /nonexistent/model.py"),
    (["--module", "model.py"], "--module must be FILE.py:FUNCTION, got 'model.py'"),
    (["--module", "{tiny}:make_model", "--model", "gpt2-small"], "give either --module or --model/--config"),
    (["--module", "{tiny}:make_model", "--checkpointing"], "with --module, apply checkpointing inside your model"),
    ([], "give one of --model PRESET, --config FILE.json or --module FILE.py:FUNCTION"),
    (["--model", "gpt2-small", "--device", "tpu"], "device must be cpu, cuda or cuda:N"),
])
def test_cli_invalid_input_exits_2_with_one_line(modules, capsys, args, message):
    args = [a.replace("{tiny}", str(modules / "tiny_lm.py")) for a in args]
    code = cli.main(["simulate", "train", *args, "--batch-size", "1", "--seq-len", "8"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and message in err


def test_cli_json_record_through_the_child(capsys, tmp_path):
    """The child run as the app runs it (--json --progress): progress lines, then measure's record with
    "kind": "simulate", the estimate block and error_pct."""
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"arch": "gpt2", "vocab_size": 300, "context_length": 64, "emb_dim": 32,
                                  "n_heads": 2, "n_layers": 2, "drop_rate": 0.1}))
    code = cli.main(["simulate", "train", "--config", str(config), "--batch-size", "2", "--seq-len", "16",
                     "--precision", "bf16-amp", "--json", "--progress"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert [e["stage"] for e in lines[:-1]] == ["build", "warm-up step", "tracked step", "done"]
    rec = lines[-1]
    assert rec["kind"] == "simulate" and rec["peak_phase"] in rec["phase_peak_bytes"]
    assert set(rec["estimate"]) >= {"peak_bytes", "phase_peak_bytes", "params_bytes"}
    assert abs(rec["error_pct"]) < ACCURACY_BAR_PCT
    assert rec["persistent_bytes"] == (rec["estimate"]["params_bytes"] + rec["estimate"]["buffers_bytes"]
                                       + rec["estimate"]["inputs_bytes"] + rec["estimate"]["optimizer_bytes"])


def test_cli_module_error_through_the_child(modules):
    """A user-module failure found in the child reaches the CLI as exit 2 and one line on stderr."""
    r = subprocess.run([sys.executable, "-m", "planner", "simulate", "train", "--module",
                        f"{modules / 'tiny_lm.py'}:returns_int", "--batch-size", "1", "--seq-len", "8"],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 2
    assert r.stderr == "planner: error: returns_int() returned int, not a torch.nn.Module\n"


def test_timeline_chart_takes_a_simulated_timeline():
    import pandas as pd

    from planner.charts import timeline

    points = [{"op": 0, "bytes": 2**20, "phase": "forward"}, {"op": 7, "bytes": 3 * 2**20, "phase": "backward"}]
    spec = timeline(pd.DataFrame(points)).to_dict()
    encoding = spec["layer"][0]["encoding"]["x"]
    assert encoding["field"] == "op" and encoding["title"] == "Op in the step (simulated)"


def test_whatif_fit_predicts_unseen_points_to_0_1_pct():
    """Per-op polynomials in (b, s) fitted from simulated points give the simulated peak at unseen points
    (batch 1 included: the book's GPT-2 runs 6 more ops at batch 1, so it gets its own fit), in under 1 ms."""
    import time

    from planner.whatif import MisalignedError, WhatIf, fit_whatif

    cfg = GPT2Config(vocab_size=500, context_length=128, emb_dim=48, n_heads=3, n_layers=1, drop_rate=0.1)
    spec = TrainSpec(2, 16, "bf16-amp", "adamw")
    traces = {}

    def simulate(cfg, spec, module):
        traces[(spec.batch_size, spec.seq_len)] = simulate_training(cfg, spec, trace=True)["trace"]
        return traces[(spec.batch_size, spec.seq_len)]

    points = ((2, 16), (2, 40), (3, 24), (4, 16), (4, 48), (1, 16), (1, 32), (1, 48))
    what = fit_whatif(cfg, spec, points, simulate=simulate)
    assert [f.batch_one for f in what.fits] == [False, True]
    for b, s in [(5, 20), (2, 100), (3, 56), (6, 24), (1, 64)]:
        t0 = time.perf_counter()
        predicted = what.peak_bytes(b, s)
        assert time.perf_counter() - t0 < 1e-3
        sim = simulate_training(cfg, TrainSpec(b, s, "bf16-amp", "adamw"))
        assert abs(predicted - sim["peak_bytes"]) <= 1e-3 * sim["peak_bytes"], (b, s)
        assert what.peak(b, s)[1] == sim["peak_phase"]
    # Without batch-1 points, batch 1 is refused, not guessed; too few points are refused too.
    many = WhatIf.fit({p: t for p, t in traces.items() if p[0] >= 2})
    with pytest.raises(MisalignedError, match="batch 1 is not covered"):
        many.peak_bytes(1, 64)
    odd = {p: dict(t) for p, t in traces.items() if p[0] >= 2}
    odd[(4, 48)]["ops"] = odd[(4, 48)]["ops"][:10] + ["bmm"] + odd[(4, 48)]["ops"][11:]  # a kernel chosen by shape
    with pytest.raises(MisalignedError, match="the step at b=4 s=48 runs other ops than at b=2 s=16 \\(from op 10"):
        WhatIf.fit(odd)
    with pytest.raises(MisalignedError, match="need at least 5 points"):
        WhatIf.fit({p: t for p, t in traces.items() if p in ((2, 16), (2, 40), (3, 24))})
