"""Runs: every measurement kept, with its estimate and status; the product's accuracy at a glance."""
import json

import pandas as pd
import streamlit as st

from pages import frame

from planner.charts import estimate_vs_measured
from planner.compare import runs_summary
from planner.store import RunStore, run_files, runs_csv, runs_table, source

cfg = frame("Runs")
st.title("Runs")
store = RunStore()
kind = st.segmented_control("Kind", ["all", "train", "load", "infer"], default="all", key="runs_kind")
runs = store.list(None if kind in (None, "all") else kind)
models = sorted({r["model"] for r in runs})
chosen = st.multiselect("Models", models, default=models, key="runs_models")
summary = runs_summary(runs, chosen)
runs = summary.runs
if not runs:
    st.info("No measurements yet: run one on the Training step or Weight loading page.")
    st.stop()

st.dataframe(pd.DataFrame(runs_table(runs)).convert_dtypes(), hide_index=True, width="stretch")
st.metric("Worst |error| over these runs", f"{summary.worst_error_pct:.2f}%", help="completed runs only")
if summary.not_completed:
    st.caption(f"The chart shows the {len(summary.completed)} completed runs; {summary.not_completed} cancelled or "
               "failed runs are listed above with their status.")
if summary.completed:
    st.altair_chart(estimate_vs_measured(pd.DataFrame(summary.chart_rows)))

c1, c2, c3 = st.columns([2, 1, 1])
to_delete = c1.multiselect("Delete runs", [r["id"] for r in runs], key="delete_ids")
if c1.button("Delete selected", key="delete", disabled=not to_delete):
    store.delete(to_delete)
    st.rerun()
c2.download_button("Export CSV", runs_csv(runs), "runs.csv", "text/csv", on_click="ignore")
c3.download_button("Export JSON", json.dumps(runs, indent=1), "runs.json", "application/json", on_click="ignore")

with_files = [r for r in runs if run_files(r)]
if with_files:  # the memory_viz snapshot and chrome trace a run exported (planner/measure/export.py)
    st.subheader("Snapshots and traces")
    chosen_id = st.selectbox("Run", [r["id"] for r in with_files], key="files_run",
                             format_func=lambda i: next(f"#{r['id']} {r['model']} ({source(r)}, {r['status']})"
                                                        for r in with_files if r["id"] == i))
    run = next(r for r in with_files if r["id"] == chosen_id)
    cols = st.columns(2)
    for col, (what, path) in zip(cols, run_files(run)):
        label, mime = (("Download memory snapshot", "application/octet-stream") if what == "memory_snapshot"
                       else ("Download trace", "application/json"))
        col.download_button(label, path.read_bytes(), path.name, mime, key=f"runs_dl_{what}", on_click="ignore")
