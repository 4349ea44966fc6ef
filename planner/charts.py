"""Chart builders: tidy data in, chart out (no streamlit, no torch).

The Planner page's two charts, redrawn on every slider move, are plain Vega-Lite specs (dicts, for
st.vega_lite_chart): building and schema-validating an Altair chart costs ~20 ms each, the dict ~0.1 ms.
The other pages' charts are Altair charts (st.altair_chart); tests read both as Vega-Lite.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

GIB = 2**30
COMPONENT_ORDER = ["params", "buffers", "inputs", "optimizer", "grads", "comm buffers", "activations", "transients",
                   "kv cache"]
PHASE_ORDER = ["forward", "loss", "backward", "optimizer", "zero_grad", "done"]
# One colour per meaning across the app: red is the budget and nothing else, black the estimated peak.
BUDGET_COLOR = "#d62728"
ESTIMATE_COLOR = "black"
COMPONENT_COLORS = ["#4c78a8", "#9ecae9", "#bab0ac", "#54a24b", "#eeca3b", "#8c6d31", "#f58518", "#b279a2",
                    "#72b7b2"]
PHASE_COLORS = ["#72b7b2", "#e6a0c4", "#9d755d", "#88d27a", "#c6dbef", "#d9d9d9"]
CATEGORY_SCHEME = "set2"  # other categorical colours (no red)


def unit_for(max_bytes: float) -> tuple[str, int]:
    """GiB for big figures, MiB below 1 GiB, so a tiny model's chart is not all zeros."""
    return ("GiB", GIB) if max_bytes >= GIB else ("MiB", 2**20)


def breakdown_spec(rows: list[dict]) -> dict:
    """rows: scenario, component, bytes -> one stacked horizontal bar per scenario (Vega-Lite)."""
    totals: dict = {}
    for r in rows:
        totals[r["scenario"]] = totals.get(r["scenario"], 0) + r["bytes"]
    unit, size = unit_for(max(totals.values()))
    values = [{**r, "size": r["bytes"] / size, "rank": COMPONENT_ORDER.index(r["component"])} for r in rows]
    return {"data": {"values": values}, "mark": {"type": "bar"}, "height": {"step": 40},
            "encoding": {
                "y": {"field": "scenario", "type": "nominal", "title": None, "sort": None, "axis": {"labelLimit": 260}},
                "x": {"aggregate": "sum", "field": "size", "type": "quantitative", "title": unit},
                "color": {"field": "component", "type": "nominal", "legend": {"orient": "bottom", "title": None},
                          "scale": {"domain": COMPONENT_ORDER, "range": COMPONENT_COLORS}},
                "order": {"field": "rank", "type": "quantitative"},
                "tooltip": [{"field": "scenario", "type": "nominal"}, {"field": "component", "type": "nominal"},
                            {"field": "size", "type": "quantitative", "format": ".3f", "title": unit}]}}


def rank_groups_spec(groups: list[dict], budget_bytes: int | None) -> dict:
    """groups: first_rank, last_rank, count, peak_bytes (ranks with identical shards share one figure) -> one
    bar per group, the budget as a red rule (Vega-Lite)."""
    top = max(g["peak_bytes"] for g in groups)
    unit, size = unit_for(max(top, budget_bytes or 0))
    values = [{"ranks": f"rank {g['first_rank']}" if g["count"] == 1 else
               f"ranks {g['first_rank']}-{g['last_rank']} ({g['count']})", "peak": g["peak_bytes"] / size}
              for g in groups]
    bars = {"data": {"values": values}, "mark": {"type": "bar", "color": COMPONENT_COLORS[0]},
            "encoding": {"y": {"field": "ranks", "type": "nominal", "title": None, "sort": None},
                         "x": {"field": "peak", "type": "quantitative", "title": f"Estimated peak per rank ({unit})"},
                         "tooltip": [{"field": "ranks", "type": "nominal"},
                                     {"field": "peak", "type": "quantitative", "format": ".3f", "title": unit}]}}
    layers = [bars]
    if budget_bytes:
        layers.append({"data": {"values": [{}]}, "mark": {"type": "rule", "color": BUDGET_COLOR, "strokeDash": [6, 3]},
                       "encoding": {"x": {"datum": budget_bytes / size}}})
    return {"layer": layers, "height": {"step": 32}}


def curve_spec(rows: list[dict], x: str, budget_bytes: int | None, title: str) -> dict:
    """rows: <x> (integers), peak_bytes -> the estimated peak against x, with the budget as a red dashed rule
    when it is within 3x of the curve (else it would flatten the curve to a line at zero)."""
    top = max(r["peak_bytes"] for r in rows)
    budget_bytes = budget_bytes if budget_bytes and budget_bytes <= 3 * top else None
    unit, size = unit_for(max(top, budget_bytes or 0))
    line = {"data": {"values": [{x: r[x], "peak": r["peak_bytes"] / size} for r in rows]},
            "mark": {"type": "line", "point": True, "color": COMPONENT_COLORS[0]},
            "encoding": {"x": {"field": x, "type": "quantitative", "title": title,
                               "axis": {"format": "d", "tickMinStep": 1}},
                         "y": {"field": "peak", "type": "quantitative", "title": f"Estimated peak ({unit})"},
                         "tooltip": [{"field": x, "type": "quantitative", "format": "d"},
                                     {"field": "peak", "type": "quantitative", "format": ".3f", "title": unit}]}}
    layers = [line]
    if budget_bytes:
        layers.append({"data": {"values": [{}]}, "mark": {"type": "rule", "color": BUDGET_COLOR, "strokeDash": [6, 3]},
                       "encoding": {"y": {"datum": budget_bytes / size}}})
    return {"layer": layers, "height": 260}


def timeline(df: pd.DataFrame, budget_bytes: int | None = None, estimate_bytes: int | None = None) -> alt.LayerChart:
    """df: t_s (or op, a simulation's op index), bytes, phase -> live bytes over one training step, coloured by
    phase. The budget rule is drawn only when it is within 3x of the data (else it would flatten the curve)."""
    top = df["bytes"].max()
    show_budget = bool(budget_bytes) and budget_bytes <= 3 * top
    unit, size = unit_for(max(top, budget_bytes if show_budget else 0))
    data = df.assign(gib=df["bytes"] / size)
    x, title = ("t_s", "Time in the step (s)") if "t_s" in df else ("op", "Op in the step (simulated)")
    line = alt.Chart(data).mark_area(interpolate="step-after", opacity=0.7).encode(
        x=alt.X(f"{x}:Q", title=title), y=alt.Y("gib:Q", title=f"Live tensor bytes ({unit})"),
        color=alt.Color("phase:N", title="phase", scale=alt.Scale(domain=PHASE_ORDER, range=PHASE_COLORS)),
        tooltip=["phase:N", alt.Tooltip("gib:Q", format=".3f"), f"{x}:Q"])
    layers = [line]
    if show_budget:
        layers.append(alt.Chart().mark_rule(color=BUDGET_COLOR, strokeDash=[6, 3]).encode(y=alt.datum(budget_bytes / size)))
    if estimate_bytes:
        layers.append(alt.Chart().mark_rule(color=ESTIMATE_COLOR, strokeDash=[2, 2]).encode(y=alt.datum(estimate_bytes / size)))
    return alt.layer(*layers).properties(height=280)


def grouped_bars(df: pd.DataFrame, category: str, title: str = "Peak", order: list | None = None) -> alt.Chart:
    """df: <category>, source (estimate / measured), bytes -> bars side by side per category."""
    unit, size = unit_for(df["bytes"].max())
    data = df.assign(gib=df["bytes"] / size)
    return alt.Chart(data).mark_bar().encode(
        x=alt.X(f"{category}:N", title=None, sort=order, axis=alt.Axis(labelAngle=-30, labelLimit=200)),
        xOffset="source:N", y=alt.Y("gib:Q", title=f"{title} ({unit})"),
        color=alt.Color("source:N", title=None, scale=alt.Scale(scheme=CATEGORY_SCHEME)),
        tooltip=[f"{category}:N", "source:N", alt.Tooltip("gib:Q", format=".3f")]).properties(height=280)


def estimate_vs_measured(df: pd.DataFrame) -> alt.LayerChart:
    """df: label, estimate_bytes, measured_bytes -> scatter with the y = x line (the accuracy at a glance)."""
    unit, size = unit_for(max(df["estimate_bytes"].max(), df["measured_bytes"].max()))
    data = df.assign(estimate_gib=df["estimate_bytes"] / size, measured_gib=df["measured_bytes"] / size)
    hi = float(max(data["estimate_gib"].max(), data["measured_gib"].max(), 1e-3)) * 1.1
    scale = alt.Scale(domain=[0, hi], nice=False)
    points = alt.Chart(data).mark_circle(size=80).encode(
        x=alt.X("estimate_gib:Q", title=f"Estimated peak ({unit})", scale=scale),
        y=alt.Y("measured_gib:Q", title=f"Measured peak ({unit})", scale=scale),
        color=alt.Color("label:N", title=None, scale=alt.Scale(scheme=CATEGORY_SCHEME)), tooltip=["label:N", "estimate_gib:Q", "measured_gib:Q"])
    diagonal = alt.Chart(pd.DataFrame({"v": [0.0, hi]})).mark_line(strokeDash=[4, 4], color="gray").encode(
        x="v:Q", y="v:Q")
    return alt.layer(diagonal, points).properties(height=320)


CATEGORY_ORDER = ["parameter", "buffer", "input", "optimizer state", "gradient", "activation", "temporary"]
CATEGORY_COLORS = ["#4c78a8", "#9ecae9", "#bab0ac", "#54a24b", "#eeca3b", "#f58518", "#b279a2"]


def category_area(timeline: dict, budget_bytes: int | None = None) -> alt.LayerChart:
    """timeline: a record's `category_timeline` ({"points": [{"op", <category>: bytes}], "phases": [{"op",
    "phase"}]}) -> live bytes stacked by category over the step (the memory_viz look), a rule where each phase
    starts. The budget rule is drawn only within 3x of the data."""
    points = timeline["points"]
    cats = [c for c in CATEGORY_ORDER if c in timeline.get("categories", CATEGORY_ORDER)]
    top = max((sum(p.get(c, 0) for c in cats) for p in points), default=0)
    show_budget = bool(budget_bytes) and budget_bytes <= 3 * top
    unit, size = unit_for(max(top, budget_bytes if show_budget else 0))
    rows = [{"op": p["op"], "category": c, "size": p.get(c, 0) / size, "rank": CATEGORY_ORDER.index(c)}
            for p in points for c in cats]
    area = alt.Chart(pd.DataFrame(rows)).mark_area(interpolate="step-after").encode(
        x=alt.X("op:Q", title="Op in the step"), y=alt.Y("size:Q", stack="zero", title=f"Live tensor bytes ({unit})"),
        color=alt.Color("category:N", title="category", scale=alt.Scale(domain=CATEGORY_ORDER, range=CATEGORY_COLORS),
                        sort=CATEGORY_ORDER),
        order=alt.Order("rank:Q"), tooltip=["category:N", alt.Tooltip("size:Q", format=".3f", title=unit), "op:Q"])
    marks = pd.DataFrame(timeline.get("phases") or [{"op": 0, "phase": "forward"}])
    rules = alt.Chart(marks).mark_rule(color="gray", strokeDash=[3, 3]).encode(x="op:Q", tooltip=["phase:N", "op:Q"])
    labels = alt.Chart(marks).mark_text(align="left", dx=3, dy=-5, baseline="top", color="gray").encode(
        x="op:Q", y=alt.value(0), text="phase:N")
    layers = [area, rules, labels]
    if show_budget:
        layers.append(alt.Chart().mark_rule(color=BUDGET_COLOR, strokeDash=[6, 3]).encode(y=alt.datum(budget_bytes / size)))
    return alt.layer(*layers).properties(height=300)


def category_bars(rows: list[dict], budget_bytes: int | None = None) -> alt.LayerChart:
    """rows: planner.api.category_stack_rows (phase, category, bytes, split) -> one bar per phase, stacked by
    category in the colours of category_area; the budget rule only within 3x of the tallest bar."""
    df = pd.DataFrame(rows)
    top = int(df.groupby("phase")["bytes"].sum().max()) if len(df) else 0
    show_budget = bool(budget_bytes) and budget_bytes <= 3 * top
    unit, size = unit_for(max(top, budget_bytes if show_budget else 0))
    df = df.assign(size=df["bytes"] / size, rank=df["category"].map(CATEGORY_ORDER.index))
    bars = alt.Chart(df).mark_bar().encode(
        x=alt.X("phase:N", title=None, sort=PHASE_ORDER),
        y=alt.Y("size:Q", stack="zero", title=f"Estimated bytes ({unit})"),
        color=alt.Color("category:N", title="category", scale=alt.Scale(domain=CATEGORY_ORDER, range=CATEGORY_COLORS),
                        sort=CATEGORY_ORDER),
        order=alt.Order("rank:Q"),
        tooltip=["phase:N", "category:N", alt.Tooltip("size:Q", format=".3f", title=unit), "split:N"])
    layers = [bars]
    if show_budget:
        layers.append(alt.Chart().mark_rule(color=BUDGET_COLOR, strokeDash=[6, 3]).encode(y=alt.datum(budget_bytes / size)))
    return alt.layer(*layers).properties(height=280, title="Estimated bytes by category, phase by phase")


def alive_tables(alive: dict) -> dict[str, pd.DataFrame]:
    """A record's `alive_at_peak` as three tables (by category, by module, the largest tensors), bytes readable."""
    from .units import fmt_bytes

    peak = alive["peak_bytes"] or 1

    def table(rows, key):
        return pd.DataFrame([{key: r[key], "bytes": r["bytes"], "size": fmt_bytes(r["bytes"]),
                              "share": f"{100 * r['bytes'] / peak:.1f}%"} for r in rows])

    largest = pd.DataFrame([{"bytes": t["bytes"], "size": fmt_bytes(t["bytes"]), "category": t["category"],
                             "module": t["module"], "op": t["op"], "phase": t["phase"],
                             "shape": "x".join(map(str, t["shape"])) if t.get("shape") is not None else "",
                             "dtype": t.get("dtype") or ""} for t in alive["largest"]])
    return {"category": table(alive["by_category"], "category"), "module": table(alive["by_module"], "module"),
            "largest": largest}
