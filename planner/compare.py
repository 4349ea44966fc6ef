"""Estimate against measurement: the one place the app computes an error (the Runs page's question, "how far
off is the planner?", and each page's result beside its estimate). No torch, no streamlit.

The formula is the one the CLI writes into every record (planner/cli/main.py, simulate.py, infer.py:
`error_pct`) and the run store keeps: signed, (estimate - measured) / measured, in percent, so a negative
error is an estimate under the measurement.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def error_pct(estimate_bytes: int | None, measured_bytes: int | None) -> float | None:
    """(estimate - measured) / measured in percent; None when either is missing or nothing was measured."""
    if estimate_bytes is None or not measured_bytes:
        return None
    return 100.0 * (estimate_bytes - measured_bytes) / measured_bytes


@dataclass
class RunsSummary:
    """What the Runs page shows over a list of stored runs (planner.store.RunStore.list)."""
    runs: list[dict]                 # the runs listed
    completed: list[dict]            # those that measured something (completed below)
    worst_error_pct: float           # the largest |error| over the completed runs (0.0 when none has one)
    not_completed: int               # cancelled or failed runs, listed but not charted
    chart_rows: list[dict] = field(default_factory=list)  # label, estimate_bytes, measured_bytes (completed runs)


def runs_summary(runs: list[dict], models: list[str] | None = None) -> RunsSummary:
    """The runs of `models` (None: every model), with the worst error and the estimate-against-measurement
    points."""
    chosen = [r for r in runs if models is None or r["model"] in models]
    done = completed(chosen)
    worst = max((abs(r["error_pct"]) for r in done if r["error_pct"] is not None), default=0.0)
    return RunsSummary(chosen, done, worst, len(chosen) - len(done),
                       [{"label": f"{r['kind']}: {r['model']}", "estimate_bytes": r["estimate_bytes"],
                         "measured_bytes": r["measured_bytes"]} for r in done])


def completed(runs: list[dict]) -> list[dict]:
    """The runs that measured something (the scatter and the worst error use only these)."""
    return [r for r in runs if r["status"] == "done" and r["measured_bytes"]]
