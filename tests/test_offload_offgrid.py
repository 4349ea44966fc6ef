"""Issue #24: --offload-activations off the measured grids. The off-grid sweep (planner/bench/offload_act.py
offgrid_runs: every RMS decoder family, f = 2h..8h, grouped and plain K/V, b 1..4, s 64..512, fp32 / bf16 / bf16-AMP,
checkpointing off and on, AdamW / SGD / --offload-optimizer) is estimated and simulated (simulate = measure to the
byte for this mechanism: tests/test_offload_activations.py); a sample of it is held here to 1% on every phase and to
the byte on the host copies. Gemma 2's shape classes that still miss state their measured bound in a note
(planner/arch/gemma2.py offload_bound_note) and are held to it."""
import pytest

from planner.bench.offload_act import OFFGRID_FAMILIES, offgrid_config, offgrid_row, offgrid_runs
from planner.estimate.training import estimate_training
from planner.spec import TrainSpec


def bounded(cfg, spec) -> bool:
    """The class with a stated bound (offload_bound_note): Gemma 2 checkpointed."""
    return cfg.arch == "gemma2" and spec.checkpointing


# every 7th run of the sweep past the bounded classes (a stride prime to the 6 runs of a shape: families, shapes,
# precisions and checkpointing meet)
SAMPLE = [run for run in offgrid_runs() if not bounded(run[1], run[2])][::7]


def test_the_sample_covers_every_family():
    assert {label.split()[0] for label, _, _ in SAMPLE} == set(OFFGRID_FAMILIES)


@pytest.mark.parametrize("label,cfg,spec", SAMPLE, ids=[f"{lab.split()[0]}-{i}" for i, (lab, _, _) in
                                                         enumerate(SAMPLE)])
def test_off_grid_every_phase_within_1pct_of_the_simulation(label, cfg, spec):
    row = offgrid_row(label, cfg, spec)
    if row is None:  # refused in one line (the MoE families with --offload-optimizer)
        assert label.split()[0].endswith("_moe") and spec.offload_optimizer
        return
    assert row["est_host"] == row["sim_host"]
    bad = {k: v for k, v in row["phase_err"].items() if abs(v) > 0.01}
    assert not bad, (label, row["run"], bad)
    assert abs(row["est_peak"] / row["sim_peak"] - 1) < 0.01


@pytest.mark.parametrize("prec,ckpt,phase,lo,hi", [("bf16", True, "backward", -0.0385, 0.0)])
def test_gemma2_states_its_bound_and_holds_it(prec, ckpt, phase, lo, hi):
    """h32 f128 a4 kv4 b4 s64, a Gemma 2 run of each bounded class (the sweep's worst checkpointed one): the note is
    there and the phase's error is inside it (low, as it says)."""
    cfg = offgrid_config("gemma2", 32, 128, 4, 4)
    spec = TrainSpec(4, 64, prec, "adamw", checkpointing=ckpt, offload_activations=True)
    assert any("--offload-activations" in n and "low by up to" in n for n in estimate_training(cfg, spec).notes)
    row = offgrid_row("gemma2", cfg, spec)
    assert lo - 0.0005 <= row["phase_err"][phase] <= hi


def test_gemma2_eager_bf16_amp_without_checkpointing_needs_no_bound():
    """h32 f128 a4 kv4 b4 s64 bf16-AMP, no checkpointing (eager attention's softmax backward with v's grad cast back to
    the cache's fp32 v; -1.43% and a stated bound before): no note, every phase to 8 B of the simulation."""
    cfg = offgrid_config("gemma2", 32, 128, 4, 4)
    spec = TrainSpec(4, 64, "bf16-amp", "adamw", offload_activations=True)
    assert not any("low by up to" in n for n in estimate_training(cfg, spec).notes)
    row = offgrid_row("gemma2", cfg, spec)
    assert all(abs(v) < 1e-4 for v in row["phase_err"].values()), row["phase_err"]
