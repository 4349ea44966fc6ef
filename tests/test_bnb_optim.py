"""8-bit optimizers (issue #12): bitsandbytes' AdamW8bit estimated against the real optimizer on the CPU; the
paged variants' refusals on the CPU and their CUDA formula; the CLI's one-line refusals."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner import bnb
from planner.cli import main as cli
from bench.bnb import bnb_grid, run_bnb
from planner.config import ConfigError, config_from_dict
from planner.estimate import bnb_optim
from planner.estimate.training import estimate_training
from planner.spec import TrainSpec, prepare

ROOT = Path(__file__).resolve().parent.parent
# these rows within 1% of the measured peak (issue #12's bar for quantized optimizers is 2%, aim 1%: the whole
# 8-bit grid is held to 2% by tests/test_recorded.py)
BAR_PCT = 1.0
# 2 blocks of a 64-wide Llama: norms (64) and k/v projections (64 x 32 = 2,048) are under bitsandbytes'
# min_8bit_size of 4,096 elements (fp32 states); q/o (4,096), MLP (10,240) and embeddings (64,000) are 8-bit.
TINY = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}


def _real_state_bytes(optimizer) -> tuple[int, int]:
    """(bytes of the distinct storages of the real optimizer's state, number of distinct qmap storages)."""
    import torch

    tensors = [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    tensors += list(optimizer.name2qmap.values())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    qmaps = {st[k].data_ptr() for st in optimizer.state.values() for k in ("qmap1", "qmap2") if k in st}
    return sum(storages.values()), len(qmaps)


@pytest.mark.parametrize("kw", [dict(), dict(train_layers="last:1"), dict(lora_r=64, lora_targets="all-linear")])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_optimizer_bytes_equal_the_real_adamw8bit_state(kw, precision):
    """The estimate's optimizer_bytes is the real AdamW8bit's state after a step, byte for byte: uint8 states and
    absmax for tensors >= 4096 elements, fp32 states (also on a bf16 model) below, the two qmaps once."""
    import bitsandbytes as bnb

    from planner.routines.training import TrainingStep

    cfg = config_from_dict(TINY)
    spec = TrainSpec(2, 8, precision, "adamw-8bit", **kw)
    step = TrainingStep(prepare(cfg, spec), spec)
    assert isinstance(step.optimizer, bnb.optim.AdamW8bit)
    step.run()
    states = list(step.optimizer.state.values())
    assert {st["state1"].dtype.itemsize for st in states} == {1, 4}  # both kinds of state are exercised
    real, qmaps = _real_state_bytes(step.optimizer)
    assert qmaps == 2  # every 8-bit parameter shares the optimizer's two maps
    est = estimate_training(cfg, spec)
    assert est.optimizer_bytes == real == step.optimizer_state_bytes()


def test_adamw8bit_rows_within_the_bar():
    """A few rows of `bench finetune-8bit` (full training, last:1, LoRA; fp32 / bf16; checkpointing), measured
    in this process with bitsandbytes' CPU kernel tracked op by op: within 1% (the quantized bar is 2%)."""
    rows = bnb_grid(quick=True)[:14:3]
    assert {spec.precision for _, _, spec in rows} == {"fp32", "bf16"}
    results = run_bnb(rows, progress=lambda *_: None)
    for r in results:
        assert abs(r["error_pct"]) <= BAR_PCT, r
        assert r["optimizer_bytes_equal"], r


def test_optimizer_step_temporaries_are_tracked_and_estimated():
    """A checkpointed bf16 step peaks in optimizer.step(): bitsandbytes' CPU kernel's fp32 copies (dequantized
    states, fp32 grad and weight, the update) decide it, and the estimate has them to the byte."""
    from planner.measure.training import measure_training

    cfg = config_from_dict({**TINY, "vocab_size": 97, "hidden_size": 96, "num_attention_heads": 3,
                            "num_key_value_heads": 1})
    spec = TrainSpec(4, 8, "bf16", "adamw-8bit", checkpointing=True)
    cfg = prepare(cfg, spec)
    est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
    assert meas["peak_phase"] == est.peak_phase == "optimizer"
    assert est.transients["optimizer_temporaries"] > 0
    assert est.peak_bytes == meas["peak_bytes"]


@pytest.mark.parametrize("kw", [dict(precision="bf16", checkpointing=True), dict(lora_r=64, lora_targets="all-linear")])
def test_simulate_equals_measure_for_adamw8bit(kw):
    """bitsandbytes' optimizer on fake tensors (its qmaps made real, then faked; its CPU kernel run under the
    tracker, its inner bitsandbytes ops on their registered fake kernels): the same bytes, phase by phase."""
    from planner.measure.training import measure_training
    from planner.measure.simulate import simulate_training

    cfg = config_from_dict({**TINY, "model_type": "qwen2"})
    spec = TrainSpec(2, 32, optimizer="adamw-8bit", **kw)
    cfg = prepare(cfg, spec)
    sim, meas = simulate_training(cfg, spec), measure_training(cfg, spec)
    assert sim["phase_peak_bytes"] == meas["phase_peak_bytes"]
    assert sim["optimizer_bytes"] == meas["optimizer_bytes"]


def test_paged_state_on_cuda_is_reported_apart():
    """PagedAdamW8bit on CUDA: state1/state2 of tensors >= 1e5 elements are in unified memory, not in the
    allocator's peak; every other state tensor counts as with AdamW8bit."""
    cfg = config_from_dict({**TINY, "vocab_size": 2000})  # 128,000-element embedding and head: paged
    plain = estimate_training(cfg, TrainSpec(2, 8, optimizer="adamw-8bit", device="cuda"))
    paged = estimate_training(cfg, TrainSpec(2, 8, optimizer="paged-adamw-8bit", device="cuda"))
    aside = paged.transients["paged_optimizer_state_not_counted"]
    assert aside == 2 * 2 * 128_000  # two uint8 states of each of the two 128,000-element tensors
    assert paged.optimizer_bytes + aside == plain.optimizer_bytes
    assert any("unified memory" in n for n in paged.notes)
    full32 = estimate_training(cfg, TrainSpec(2, 8, optimizer="paged-adamw", device="cuda"))
    assert full32.transients["paged_optimizer_state_not_counted"] == 2 * 4 * 2 * 128_000


@pytest.mark.parametrize("args, message", [
    (["--optimizer", "paged-adamw-8bit"], "paged-adamw-8bit needs a CUDA device"),
    (["--optimizer", "paged-adamw"], "CUDA unified memory"),
    (["--optimizer", "adamw-8bit", "--optimizer-impl", "foreach"], "bitsandbytes' own kernel"),
    (["--optimizer", "adamw-8bit", "--world-size", "2", "--parallel", "ddp"], "with --parallel is not modelled"),
])
def test_cli_refuses_with_one_line(capsys, tmp_path, args, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(TINY))
    code = cli.main(["estimate", "train", "--config", str(path), "--batch-size", "2", "--seq-len", "16", *args])
    _, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("command", [["measure", "train", "--device", "cpu"], ["simulate", "train", "--device", "cpu"],
                                     ["fit", "--measure-costs"]])
def test_without_bitsandbytes_measuring_exits_2_and_estimating_works(capsys, tmp_path, monkeypatch, command):
    """The measuring / simulating child imports bitsandbytes (refused up front, one line); the estimate does not."""
    monkeypatch.setattr(bnb, "bnb_available", lambda: False)  # the one check (planner/bnb.py)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(TINY))
    run = ["--config", str(path), "--batch-size", "2", "--seq-len", "16", "--optimizer", "adamw-8bit"]
    code = cli.main(command[:2] + run + command[2:] if command[1] == "train" else command[:1] + run + command[1:])
    _, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "bitsandbytes is not installed" in err, err
    code = cli.main(["estimate", "train", *run, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["optimizer_bytes"] > 0


def test_paged_refused_in_spec():
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        TrainSpec(2, 8, optimizer="paged-adamw-8bit")
    TrainSpec(2, 8, optimizer="paged-adamw-8bit", device="cuda")  # fine on CUDA


def test_estimate_imports_neither_torch_nor_bitsandbytes():
    code = ("import sys\n"
            "from planner.config import config_from_dict\n"
            "from planner.estimate.training import estimate_training\n"
            "from planner.spec import TrainSpec, prepare\n"
            f"cfg = config_from_dict({TINY!r})\n"
            "for kw in (dict(), dict(lora_r=4, lora_targets='all-linear'), dict(device='cuda', optimizer='paged-adamw')):\n"
            "    spec = TrainSpec(2, 64, 'bf16', **{'optimizer': 'adamw-8bit', **kw})\n"
            "    estimate_training(prepare(cfg, spec), spec)\n"
            "assert not {'torch', 'bitsandbytes'} & set(sys.modules), 'imported'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_fit_advises_without_torch_optimizer_kernels(capsys, tmp_path):
    """fit's single changes leave --optimizer-impl alone for bitsandbytes (its own kernel), on CUDA too."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(TINY))
    code = cli.main(["fit", "--config", str(path), "--seq-len", "64", "--batch-size", "8", "--optimizer", "adamw-8bit",
                     "--device", "cuda", "--budget", "12MB", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rec = json.loads(out)
    assert rec["advice"] and all(o["spec"]["optimizer_impl"] == "default" for o in rec["advice"])
