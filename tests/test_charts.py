"""Chart builders, checked through their Vega-Lite specs."""
import pandas as pd

from planner.charts import breakdown_bar, curve_with_budget, estimate_vs_measured, grouped_bars, timeline


def test_breakdown_bar_stacks_components():
    spec = breakdown_bar(pd.DataFrame({"scenario": ["a", "a"], "component": ["params", "grads"],
                                       "bytes": [2**30, 2**31]})).to_dict()
    assert spec["mark"]["type"] == "bar" and spec["encoding"]["x"]["title"] == "GiB"


def test_small_figures_use_mib_and_budget_rule_only_when_near():
    tl = pd.DataFrame({"t_s": [0, 1], "bytes": [2**20, 4 * 2**20], "phase": ["forward", "backward"]})
    far = timeline(tl, budget_bytes=20 * 2**30, estimate_bytes=4 * 2**20).to_dict()
    assert len(far["layer"]) == 2 and "MiB" in far["layer"][0]["encoding"]["y"]["title"]
    near = timeline(tl, budget_bytes=8 * 2**20).to_dict()
    assert len(near["layer"]) == 2 and near["layer"][1]["mark"]["type"] == "rule"


def test_curve_grouped_and_scatter():
    c = curve_with_budget(pd.DataFrame({"batch": [1, 2], "peak_bytes": [2**30, 2**31]}), "batch", 3 * 2**30, "Batch").to_dict()
    assert c["layer"][1]["mark"]["type"] == "rule"
    g = grouped_bars(pd.DataFrame({"m": ["x", "x"], "source": ["estimate", "measured"], "bytes": [1, 2]}), "m",
                     order=["x"]).to_dict()
    assert g["encoding"]["xOffset"]["field"] == "source"
    s = estimate_vs_measured(pd.DataFrame({"label": ["a"], "estimate_bytes": [10], "measured_bytes": [11]})).to_dict()
    assert s["layer"][0]["mark"]["type"] == "line"  # the y = x diagonal
