"""Chart builders, checked through their Vega-Lite specs."""
import json

import altair as alt
import pandas as pd

from planner.charts import (BUDGET_COLOR, COMPONENT_COLORS, PHASE_COLORS, breakdown_spec, curve_spec,
                            estimate_vs_measured, grouped_bars, timeline)


def test_breakdown_stacks_components():
    spec = breakdown_spec([{"scenario": "a", "component": "params", "bytes": 2**30},
                           {"scenario": "a", "component": "grads", "bytes": 2**31}])
    alt.Chart.from_dict(spec)  # valid Vega-Lite (the schema check the page skips)
    assert spec["mark"]["type"] == "bar" and spec["encoding"]["x"]["title"] == "GiB"
    assert spec["encoding"]["x"]["aggregate"] == "sum" and spec["data"]["values"][1]["size"] == 2.0


def test_small_figures_use_mib_and_budget_rule_only_when_near():
    tl = pd.DataFrame({"t_s": [0, 1], "bytes": [2**20, 4 * 2**20], "phase": ["forward", "backward"]})
    far = timeline(tl, budget_bytes=20 * 2**30, estimate_bytes=4 * 2**20).to_dict()
    assert len(far["layer"]) == 2 and "MiB" in far["layer"][0]["encoding"]["y"]["title"]
    near = timeline(tl, budget_bytes=8 * 2**20).to_dict()
    assert len(near["layer"]) == 2 and near["layer"][1]["mark"]["type"] == "rule"


def test_curve_grouped_and_scatter():
    c = curve_spec([{"batch": 1, "peak_bytes": 2**30}, {"batch": 2, "peak_bytes": 2**31}], "batch", 3 * 2**30, "Batch")
    alt.LayerChart.from_dict(c)
    assert c["layer"][1]["mark"]["type"] == "rule" and c["layer"][1]["encoding"]["y"]["datum"] == 3
    g = grouped_bars(pd.DataFrame({"m": ["x", "x"], "source": ["estimate", "measured"], "bytes": [1, 2]}), "m",
                     order=["x"]).to_dict()
    assert g["encoding"]["xOffset"]["field"] == "source"
    s = estimate_vs_measured(pd.DataFrame({"label": ["a"], "estimate_bytes": [10], "measured_bytes": [11]})).to_dict()
    assert s["layer"][0]["mark"]["type"] == "line"  # the y = x diagonal


def test_batch_and_sequence_axes_have_integer_ticks():
    c = curve_spec([{"batch": b, "peak_bytes": b} for b in (1, 2, 3)], "batch", None, "Batch")
    axis = c["layer"][0]["encoding"]["x"]["axis"]
    assert axis["format"] == "d" and axis["tickMinStep"] == 1


def test_red_means_the_budget_only():
    """The timeline said "Red: the budget" while red was also the backward phase."""
    tl = pd.DataFrame({"t_s": [0, 1, 2], "bytes": [1, 2, 3], "phase": ["forward", "backward", "optimizer"]})
    spec = timeline(tl, budget_bytes=3, estimate_bytes=2).to_dict()
    phases = spec["layer"][0]["encoding"]["color"]["scale"]
    assert phases["domain"][2] == "backward" and len(set(phases["range"])) == len(phases["range"])
    reds = lambda colors: [c for c in colors if c.startswith("#") and int(c[1:3], 16) > 0xc0 > int(c[3:5], 16) + 0x40]
    assert reds([BUDGET_COLOR]) and not reds(PHASE_COLORS + COMPONENT_COLORS)
    assert spec["layer"][1]["mark"]["color"] == BUDGET_COLOR
    bar = breakdown_spec([{"scenario": "a", "component": "params", "bytes": 1}])
    assert BUDGET_COLOR not in json.dumps(bar)


def test_a_curve_far_below_the_budget_is_not_flattened_by_it():
    rows = [{"seq": s, "peak_bytes": s * 2**20} for s in (1, 32, 64)]
    assert len(curve_spec(rows, "seq", 64 * 2**30, "Sequence")["layer"]) == 1
    assert len(curve_spec(rows, "seq", 100 * 2**20, "Sequence")["layer"]) == 2


def test_the_estimates_categories_stack_phase_by_phase():
    """planner.api.category_stack_rows -> planner.charts.category_bars (the Training step page, issue #34 item 4):
    every phase's categories filled, stacked in the measured timeline's colours, summing to the phase's peak."""
    from planner.api import category_stack_rows
    from planner.charts import CATEGORY_ORDER, category_bars
    from planner.config import config_from_dict
    from planner.estimate.training import estimate_training
    from planner.spec import TrainSpec, prepare

    cfg = config_from_dict({"arch": "llama", "vocab_size": 97, "num_hidden_layers": 2, "max_position_embeddings": 512,
                            "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
                            "num_key_value_heads": 2})
    spec = TrainSpec(2, 16, precision="bf16-amp", optimizer="adamw", checkpointing=True)
    est = estimate_training(prepare(cfg, spec), spec).to_dict()
    rows = category_stack_rows(est)
    assert {r["category"] for r in rows} <= set(CATEGORY_ORDER)
    for phase, total in est["phase_peak_bytes"].items():
        assert sum(r["bytes"] for r in rows if r["phase"] == phase) == total
        assert {r["split"] for r in rows if r["phase"] == phase} == {est["categories"][phase]["split"]}
    backward = {r["category"]: r["bytes"] for r in rows if r["phase"] == "backward"}
    assert backward["gradient"] and backward["activation"] and backward["temporary"]  # no None, no lumped sum
    spec_json = category_bars(rows, budget_bytes=est["peak_bytes"]).to_dict()
    layer = spec_json["layer"][0]
    assert layer["mark"]["type"] == "bar" and layer["encoding"]["y"]["stack"] == "zero"
    assert layer["encoding"]["color"]["scale"]["domain"] == CATEGORY_ORDER
    assert len(spec_json["layer"]) == 2  # the budget rule, within 3x
    assert category_stack_rows({}) == []
