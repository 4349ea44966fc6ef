"""One record across the tiers (issue #19 item 3, issue #34 item 4): estimate, simulate and measure each carry
`categories`, per phase the bytes by MemTracker's category names (parameter, buffer, inputs, optimizer state,
gradient, activation, temporary). The measured and simulated blocks come from the live-bytes tracker's tensor tags
(planner/measure/events.py, planner/measure/export.py phase_categories); the estimate's from its own figures
(planner/estimate/categories.py), which fill every category in every phase and say how in the row's `split`:
"exact" where the phase's winning candidate is one the estimator splits from its terms, "approximate" elsewhere.

The bar (owned here): a persistent category equals the measurement byte for byte; in an "exact" row the gradient,
activation and temporary are each within BAR_PCT of the measured one, plus the phase total's own error (the
total's error lands in some category: the 0-d loss, 4 B, is not in the estimate), wherever the phase's total is
within BAR_PCT (always at the peak: the issue's bar); a phase whose total is further off has its high point at
another moment than the measurement's (e.g. Mixtral bf16's forward, 2% under: the estimate's end of the forward
against the measured in-block point), so its split describes another moment. Every row's categories are at
least 0 and sum to the phase's peak. An "approximate" row is held to that sum (its worst errors on the grid
below are in the closing report of issue #34 item 4) and to its `bounds`: the measured activation lies within
them (with the same slack) wherever the phase's total is within BAR_PCT."""
import json
from pathlib import Path

import pytest

from planner.config import config_from_dict
from planner.estimate.training import estimate_training
from planner.measure.simulate import simulate_training
from planner.measure.training import measure_training
from planner.spec import TrainSpec, prepare

TINY = {"arch": "llama", "vocab_size": 97, "num_hidden_layers": 2, "max_position_embeddings": 512, "hidden_size": 32,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
NAMES = {"parameter", "buffer", "inputs", "optimizer state", "gradient", "activation", "temporary", "total"}
PERSISTENT = ("parameter", "buffer", "inputs", "optimizer state")
SPLIT = ("gradient", "activation", "temporary")
BAR_PCT = 1.0
DATA = Path(__file__).parent / "data" / "measured"


def check_categories(est, meas) -> list[str]:
    """The bar (module doc) on every phase; returns the approximate rows' errors, for the message."""
    notes = []
    assert set(meas["categories"]) == set(est.categories) == set(meas["phase_peak_bytes"])
    for phase, m in meas["categories"].items():
        assert set(m) == NAMES
        assert sum(v for k, v in m.items() if k != "total") == m["total"] == meas["phase_peak_bytes"][phase]
        e = est.categories[phase]
        assert set(e) - {"bounds"} == NAMES | {"split"} and e["split"] in ("exact", "approximate"), e
        assert ("bounds" in e) == (e["split"] == "approximate"), e
        assert all(e[k] is not None and e[k] >= 0 for k in NAMES), e
        assert sum(e[k] for k in NAMES - {"total"}) == e["total"] == est.phase_peak_bytes[phase]
        assert {k: e[k] for k in PERSISTENT} == {k: m[k] for k in PERSISTENT}, (phase, e, m)
        slack = abs(e["total"] - m["total"])
        for k in SPLIT:
            ok = abs(e[k] - m[k]) <= BAR_PCT / 100 * m[k] + slack
            if e["split"] == "exact" and slack <= BAR_PCT / 100 * m["total"]:
                assert ok, (phase, k, e, m)
            elif not ok:
                notes.append(f"{phase} {k}: {e[k]} vs {m[k]}")
        if e["split"] == "approximate" and slack <= BAR_PCT / 100 * m["total"]:
            lo, hi = e["bounds"]["activation"]
            assert lo <= e["activation"] <= hi, e
            assert lo - slack - BAR_PCT / 100 * m["activation"] <= m["activation"] <= hi + slack, (phase, e, m)
    return notes


@pytest.mark.parametrize("kw", [
    dict(precision="fp32", optimizer="adamw"),                                  # full training
    dict(precision="bf16-amp", optimizer="adamw", lora_r=4, grad_accum=2),      # LoRA under autocast, accum
    dict(precision="bf16", optimizer="sgd-momentum", train_layers="last:1", checkpointing=True),
])
def test_estimate_and_measure_agree_category_by_category(kw):
    cfg = config_from_dict(TINY)
    spec = TrainSpec(2, 16, **kw)
    est = estimate_training(prepare(cfg, spec), spec)
    meas = measure_training(cfg, spec)
    check_categories(est, meas)
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= BAR_PCT / 100 * meas["peak_bytes"]  # the bar: the peak
    for phase in ("optimizer", "zero_grad", "loss"):  # split from the estimate's terms in every one of these modes
        assert est.categories[phase]["split"] == "exact"


def _grid() -> list[dict]:
    """A tiny recorded run per family (tests/data/measured/families.jsonl, b4 s8: every family's own terms; the
    k-th family checkpointed when k is odd, in fp32, bf16-AMP or bf16 by k mod 3), and fine-tuning's (LoRA, a
    trainable subset, QLoRA)."""
    precisions = ("fp32", "bf16-amp", "bf16")
    rows, archs = [], []
    for line in (DATA / "families.jsonl").read_text().splitlines()[1:]:
        r = json.loads(line)
        arch = r["config"]["arch"]
        if arch not in archs:
            archs.append(arch)
        k = archs.index(arch)
        sp = r["spec"]
        if (k < len(rows) + 1 and len(rows) == k and " b4 s8 " in r["label"] + " " and sp["grad_accum"] == 1
                and sp["checkpointing"] == (k % 2 == 1) and sp["precision"] == precisions[k % 3]):
            rows.append(r)
    for name, needle in (("finetune", "lora"), ("finetune", "last:1"), ("qlora", "qlora")):
        for line in (DATA / f"{name}.jsonl").read_text().splitlines()[1:]:
            r = json.loads(line)
            if " b4 s8 " in r["label"] + " " and needle in r["label"]:
                rows.append(r)
                break
    return rows


GRID = _grid()


@pytest.mark.parametrize("row", GRID, ids=[r["label"] for r in GRID])
def test_categories_on_the_family_grid(row):
    cfg, spec = config_from_dict(row["config"]), TrainSpec(**row["spec"])
    est = estimate_training(prepare(cfg, spec), spec)
    meas = measure_training(cfg, spec)
    check_categories(est, meas)


def test_the_grid_covers_every_family_and_the_json_carries_the_split():
    assert {r["config"]["arch"] for r in GRID} >= {"llama", "gemma", "gemma2", "gpt2-hf", "mistral", "phi3", "qwen2",
                                                   "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"}
    cfg = config_from_dict(TINY)
    spec = TrainSpec(2, 16, precision="fp32", optimizer="adamw")
    d = estimate_training(prepare(cfg, spec), spec).to_dict()
    for phase, row in d["categories"].items():
        assert all(isinstance(row[k], int) for k in NAMES) and row["split"] in ("exact", "approximate")


def test_simulate_carries_measures_categories_and_the_page_rows_compare_them():
    """simulate's `categories` equal measure's; planner.api.category_rows (what the Training step page renders):
    per phase, every category of the estimate beside the record's."""
    from planner.api import category_rows

    cfg = config_from_dict(TINY)
    spec = TrainSpec(2, 16, precision="bf16-amp", optimizer="adamw", lora_r=4)
    sim = simulate_training(cfg, spec)
    assert sim["categories"] == measure_training(cfg, spec)["categories"]
    est = estimate_training(prepare(cfg, spec), spec).to_dict()
    rows = category_rows(est, sim, "simulated")
    assert {r["phase"] for r in rows} == set(sim["phase_peak_bytes"])
    for r in rows:
        if r["category"] in PERSISTENT or r["phase"] == "zero_grad":
            assert r["difference"] == 0, r
    cats = sim["categories"]["backward"]
    (bwd,) = [r for r in rows if r["phase"] == "backward" and r["category"] == "activation"]
    assert bwd["simulated"] == cats["activation"] and bwd["split"] == est["categories"]["backward"]["split"]
    assert category_rows(est, {"phase_peak_bytes": {}}, "measured") == []  # an old record: nothing to compare
