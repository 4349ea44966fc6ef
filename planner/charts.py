"""Altair chart builders: tidy DataFrame in, chart out (no streamlit, no torch; tested via to_dict())."""
from __future__ import annotations

import altair as alt
import pandas as pd

GIB = 2**30
COMPONENT_ORDER = ["params", "buffers", "inputs", "optimizer", "grads", "activations", "transients"]
PHASE_ORDER = ["forward", "loss", "backward", "optimizer", "zero_grad", "done"]


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
                    color=alt.Color("component:N", sort=COMPONENT_ORDER, legend=alt.Legend(orient="bottom", title=None)),
                    order=alt.Order("rank:Q"),
                    tooltip=["scenario:N", "component:N", alt.Tooltip("gib:Q", format=".3f")])
            .transform_calculate(rank=f"indexof({COMPONENT_ORDER!r}, datum.component)")
            .properties(height=alt.Step(40)))


def curve_with_budget(df: pd.DataFrame, x: str, budget_bytes: int | None, title: str) -> alt.LayerChart:
    """df: <x>, peak_bytes -> the estimated peak against x, with the budget as a dashed rule."""
    unit, size = unit_for(max(df["peak_bytes"].max(), budget_bytes or 0))
    data = df.assign(gib=df["peak_bytes"] / size)
    line = alt.Chart(data).mark_line(point=True).encode(
        x=alt.X(f"{x}:Q", title=title), y=alt.Y("gib:Q", title=f"Estimated peak ({unit})"),
        tooltip=[f"{x}:Q", alt.Tooltip("gib:Q", format=".3f")])
    layers = [line]
    if budget_bytes:
        layers.append(alt.Chart().mark_rule(color="firebrick", strokeDash=[6, 3]).encode(y=alt.datum(budget_bytes / size)))
    return alt.layer(*layers).properties(height=260)


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
        color=alt.Color("phase:N", title="phase", sort=PHASE_ORDER),
        tooltip=["phase:N", alt.Tooltip("gib:Q", format=".3f"), f"{x}:Q"])
    layers = [line]
    if show_budget:
        layers.append(alt.Chart().mark_rule(color="firebrick", strokeDash=[6, 3]).encode(y=alt.datum(budget_bytes / size)))
    if estimate_bytes:
        layers.append(alt.Chart().mark_rule(color="black", strokeDash=[2, 2]).encode(y=alt.datum(estimate_bytes / size)))
    return alt.layer(*layers).properties(height=280)


def grouped_bars(df: pd.DataFrame, category: str, title: str = "Peak", order: list | None = None) -> alt.Chart:
    """df: <category>, source (estimate / measured), bytes -> bars side by side per category."""
    unit, size = unit_for(df["bytes"].max())
    data = df.assign(gib=df["bytes"] / size)
    return alt.Chart(data).mark_bar().encode(
        x=alt.X(f"{category}:N", title=None, sort=order, axis=alt.Axis(labelAngle=-30, labelLimit=200)),
        xOffset="source:N", y=alt.Y("gib:Q", title=f"{title} ({unit})"), color=alt.Color("source:N", title=None),
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
        color=alt.Color("label:N", title=None), tooltip=["label:N", "estimate_gib:Q", "measured_gib:Q"])
    diagonal = alt.Chart(pd.DataFrame({"v": [0.0, hi]})).mark_line(strokeDash=[4, 4], color="gray").encode(
        x="v:Q", y="v:Q")
    return alt.layer(diagonal, points).properties(height=320)
