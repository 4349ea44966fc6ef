"""Issue #24: --offload-activations off the measured grids. The off-grid sweep (bench/offload_act.py
offgrid_runs: every RMS decoder family, f = 2h..8h, grouped and plain K/V, b 1..4, s 64..512, fp32 / bf16 / bf16-AMP,
checkpointing off and on, AdamW / SGD / --offload-optimizer) is estimated and simulated (simulate = measure to the
byte for this mechanism: tests/test_offload_activations.py); a sample of it is held here to 1% on every phase and to
the byte on the host copies. Gemma 2's shape classes that still miss state their measured bound in a note
(planner/arch/gemma2.py offload_bound_note) and are held to it."""
import pytest

from bench.offload_act import OFFGRID_FAMILIES, offgrid_config, offgrid_row, offgrid_runs
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


@pytest.mark.parametrize("prec", ["bf16", "bf16-amp"])
def test_gemma2_checkpointed_backward_is_exact_and_the_note_bounds_the_forward_only(prec):
    """h32 f128 a4 kv4 b4 s64 checkpointed (K/V heads = query heads, a narrow MLP below fp32): the recomputed block's
    top is the post-feedforward norm's backward (planner/arch/gemma2.py block_points post_ffn_norm; the backward was
    -3.84% and a stated bound before): the backward and the step's peak to 8 B of the simulation, and the note states
    only the forward's bound (high), which the forward holds."""
    cfg = offgrid_config("gemma2", 32, 128, 4, 4)
    spec = TrainSpec(4, 64, prec, "adamw", checkpointing=True, offload_activations=True)
    notes = [n for n in estimate_training(cfg, spec).notes if "--offload-activations" in n and "up to" in n]
    assert notes and all("high by up to 2.9%" in n and "low by up to" not in n for n in notes)
    row = offgrid_row("gemma2", cfg, spec)
    assert abs(row["est_peak"] - row["sim_peak"]) <= 8
    assert abs(row["phase_err"]["backward"]) < 1e-5
    assert 0 <= row["phase_err"]["forward"] <= 0.029


def test_gemma2_checkpointed_without_offloading_backward_to_8_bytes():
    """The same point without --offload-activations (the plain estimate missed it too: -3.87% bf16 SGD before)."""
    from planner.measure.simulate import simulate_training

    cfg = offgrid_config("gemma2", 32, 128, 4, 4)
    spec = TrainSpec(4, 64, "bf16", "sgd", checkpointing=True)
    est, sim = estimate_training(cfg, spec), simulate_training(cfg, spec)
    assert abs(est.phase_peak_bytes["backward"] - sim["phase_peak_bytes"]["backward"]) <= 8
    assert abs(est.peak_bytes - sim["peak_bytes"]) <= 8


def test_gemma2_eager_bf16_amp_without_checkpointing_needs_no_bound():
    """h32 f128 a4 kv4 b4 s64 bf16-AMP, no checkpointing (eager attention's softmax backward with v's grad cast back to
    the cache's fp32 v; -1.43% and a stated bound before): no note, every phase to 8 B of the simulation."""
    cfg = offgrid_config("gemma2", 32, 128, 4, 4)
    spec = TrainSpec(4, 64, "bf16-amp", "adamw", offload_activations=True)
    assert not any("low by up to" in n for n in estimate_training(cfg, spec).notes)
    row = offgrid_row("gemma2", cfg, spec)
    assert all(abs(v) < 1e-4 for v in row["phase_err"].values()), row["phase_err"]
