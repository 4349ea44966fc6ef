"""One record across the tiers (issue #19 item 3): estimate, simulate and measure each carry `categories`, per phase
the bytes by MemTracker's category names (parameter, buffer, inputs, optimizer state, gradient, activation,
temporary). The measured and simulated blocks come from the live-bytes tracker's tensor tags
(planner/measure/events.py, planner/measure/export.py phase_categories); the estimate's from its own figures
(planner/estimate/categories.py), which split the persistent categories in every phase and every category at
the optimizer step and zero_grad: those must equal the measurement byte for byte, and the peak be within the
bar."""
import pytest

from planner.config import config_from_dict
from planner.estimate.training import estimate_training
from planner.measure.simulate import simulate_training
from planner.measure.training import measure_training
from planner.spec import TrainSpec, prepare

TINY = {"arch": "llama", "vocab_size": 97, "num_hidden_layers": 2, "max_position_embeddings": 512, "hidden_size": 32,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
NAMES = {"parameter", "buffer", "inputs", "optimizer state", "gradient", "activation", "temporary", "total"}


@pytest.mark.parametrize("kw, bar", [
    (dict(precision="fp32", optimizer="adamw"), 1.0),                                  # full training
    (dict(precision="bf16-amp", optimizer="adamw", lora_r=4, grad_accum=2), 1.0),      # LoRA under autocast, accum
    (dict(precision="bf16", optimizer="sgd-momentum", train_layers="last:1", checkpointing=True), 1.0),
])
def test_estimate_and_measure_agree_category_by_category(kw, bar):
    cfg = config_from_dict(TINY)
    spec = TrainSpec(2, 16, **kw)
    est = estimate_training(prepare(cfg, spec), spec)
    meas = measure_training(cfg, spec)
    assert set(meas["categories"]) == set(est.categories) == set(meas["phase_peak_bytes"])
    for phase, m in meas["categories"].items():
        assert set(m) == NAMES
        assert sum(v for k, v in m.items() if k != "total") == m["total"] == meas["phase_peak_bytes"][phase]
        e = est.categories[phase]
        split = {k: v for k, v in e.items() if k in NAMES and k != "total" and v is not None}
        assert {"parameter", "buffer", "inputs", "optimizer state"} <= set(split)
        assert split == {k: m[k] for k in split}, (phase, split, m)
        assert e["total"] == est.phase_peak_bytes[phase]
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= bar / 100 * meas["peak_bytes"]  # the bar: the peak
    for phase in ("optimizer", "zero_grad"):  # every category split there
        assert all(est.categories[phase][k] is not None for k in NAMES)


def test_simulate_carries_measures_categories_and_the_page_rows_compare_them():
    """simulate's `categories` equal measure's; planner.api.category_rows (what the Training step page renders):
    per phase, every category the estimate splits beside the record's, a sum the estimate does not split
    compared with the record's same sum."""
    from planner.api import category_rows

    cfg = config_from_dict(TINY)
    spec = TrainSpec(2, 16, precision="bf16-amp", optimizer="adamw", lora_r=4)
    sim = simulate_training(cfg, spec)
    assert sim["categories"] == measure_training(cfg, spec)["categories"]
    est = estimate_training(prepare(cfg, spec), spec).to_dict()
    rows = category_rows(est, sim, "simulated")
    assert {r["phase"] for r in rows} == set(sim["phase_peak_bytes"])
    for r in rows:
        if r["category"] in ("parameter", "buffer", "inputs", "optimizer state") or r["phase"] == "zero_grad":
            assert r["difference"] == 0, r
    (bwd,) = [r for r in rows if r["phase"] == "backward" and r["category"] == "gradient, activation and temporary"]
    cats = sim["categories"]["backward"]
    assert bwd["simulated"] == cats["gradient"] + cats["activation"] + cats["temporary"]
    assert category_rows(est, {"phase_peak_bytes": {}}, "measured") == []  # an old record: nothing to compare
