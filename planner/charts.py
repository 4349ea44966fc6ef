"""Altair chart builders: tidy DataFrame in, chart out (no streamlit, no torch; tested via to_dict())."""
from __future__ import annotations

import altair as alt
import pandas as pd

GIB = 2**30
COMPONENT_ORDER = ["params", "buffers", "inputs", "optimizer", "grads", "activations", "transients"]
PHASE_ORDER = ["forward", "loss", "backward", "optimizer", "zero_grad", "done"]
# One colour per meaning across the app: red is the budget and nothing else, black the estimated peak.
BUDGET_COLOR = "#d62728"
ESTIMATE_COLOR = "black"
COMPONENT_COLORS = ["#4c78a8", "#9ecae9", "#bab0ac", "#54a24b", "#eeca3b", "#f58518", "#b279a2"]
PHASE_COLORS = ["#72b7b2", "#e6a0c4", "#9d755d", "#88d27a", "#c6dbef", "#d9d9d9"]
CATEGORY_SCHEME = "set2"  # other categorical colours (no red)


def unit_for(max_bytes: float) -> tuple[str, int]:
    """GiB for big figures, MiB below 1 GiB, so a tiny model's chart is not all zeros."""
    return ("GiB", GIB) if max_bytes >= GIB else ("MiB", 2**20)


def breakdown_bar(df: pd.DataFrame) -> alt.Chart:
    """df: scenario, component, bytes -> one stacked horizontal bar per scenario."""
    unit, size = unit_for(df.groupby("scenario")["bytes"].sum().max())
    data = df.assign(gib=df["bytes"] / size)
    return (alt.Chart(data).mark_bar()
            .encode(y=alt.Y("scenario:N", title=None, axis=alt.Axis(labelLimit=260)),
                    x=alt.X("sum(gib):Q", title=unit),
                    color=alt.Color("component:N", legend=alt.Legend(orient="bottom", title=None),
                                    scale=alt.Scale(domain=COMPONENT_ORDER, range=COMPONENT_COLORS)),
                    order=alt.Order("rank:Q"),
                    tooltip=["scenario:N", "component:N", alt.Tooltip("gib:Q", format=".3f")])
            .transform_calculate(rank=f"indexof({COMPONENT_ORDER!r}, datum.component)")
            .properties(height=alt.Step(40)))


def curve_with_budget(df: pd.DataFrame, x: str, budget_bytes: int | None, title: str) -> alt.LayerChart:
    """df: <x> (integers), peak_bytes -> the estimated peak against x, with the budget as a red dashed rule."""
    unit, size = unit_for(max(df["peak_bytes"].max(), budget_bytes or 0))
    data = df.assign(gib=df["peak_bytes"] / size)
    line = alt.Chart(data).mark_line(point=True, color=COMPONENT_COLORS[0]).encode(
        x=alt.X(f"{x}:Q", title=title, axis=alt.Axis(format="d", tickMinStep=1)),
        y=alt.Y("gib:Q", title=f"Estimated peak ({unit})"),
        tooltip=[alt.Tooltip(f"{x}:Q", format="d"), alt.Tooltip("gib:Q", format=".3f")])
    layers = [line]
    if budget_bytes:
        layers.append(alt.Chart().mark_rule(color=BUDGET_COLOR, strokeDash=[6, 3]).encode(y=alt.datum(budget_bytes / size)))
    return alt.layer(*layers).properties(height=260)


def timeline(df: pd.DataFrame, budget_bytes: int | None = None, estimate_bytes: int | None = None) -> alt.LayerChart:
    """df: t_s, bytes, phase -> live bytes over one training step, coloured by phase. The budget rule is
    drawn only when it is within 3x of the data (else it would flatten the curve to a line at zero)."""
    top = df["bytes"].max()
    show_budget = bool(budget_bytes) and budget_bytes <= 3 * top
    unit, size = unit_for(max(top, budget_bytes if show_budget else 0))
    data = df.assign(gib=df["bytes"] / size)
    line = alt.Chart(data).mark_area(interpolate="step-after", opacity=0.7).encode(
        x=alt.X("t_s:Q", title="Time in the step (s)"), y=alt.Y("gib:Q", title=f"Live tensor bytes ({unit})"),
        color=alt.Color("phase:N", title="phase", scale=alt.Scale(domain=PHASE_ORDER, range=PHASE_COLORS)),
        tooltip=["phase:N", alt.Tooltip("gib:Q", format=".3f"), "t_s:Q"])
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
