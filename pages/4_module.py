"""Your module: will it fit? The Planner for a model with no formula family (your own nn.Module).

THIS RUNS YOUR CODE, in child processes: `python -m planner simulate whatif --module FILE.py:FUNCTION`
simulates the training step on fake tensors at a few small (batch, sequence) points and fits every op's live
bytes as a polynomial in b and s (planner.whatif): the basis is chosen from the data and checked on held-out
points, and the page shows both (an approximate fit says by how much). The sliders then answer from that fit in
microseconds: batch and sequence, or batch only for a model without a sequence (`--input-shape`, a one-argument
make_batch, or a step that does not depend on s). "Simulate this point" checks one answer against a fresh
simulation; "Measure this point" runs the real step (`measure train --module`). The fit is kept on disk (in the
data folder), keyed by the file's contents and the run settings, so it survives a restart.
"""
import json

import pandas as pd
import streamlit as st

from pages import frame, machine_budget, md_escape

from planner.charts import curve_spec
from planner.module_ref import parse_module_ref
from planner.config import ConfigError
from planner.jobs import Job, JobBusy
from planner.module_ref import fit_path, has_sequence, parse_input_shape
from planner.plan import check_point, module_plan
from planner.spec import OPTIMIZER_IMPLS, OPTIMIZERS, PRECISIONS, TrainSpec
from planner.store import RunStore
from planner.units import bytes_to_gib, fmt_bytes, gib_to_bytes

TIMEOUT_S = 900  # ten small simulations, each a child importing torch; a big module takes longer per point
EXAMPLE = "my_model.py:make_model"

state = st.session_state
frame("Your module", picker=False)
st.title("Your module: will it fit?")
st.caption("For a model the planner has no formulas for: a Python file with `make_model()` returning an "
           "`nn.Module` (optionally `make_batch(batch_size, seq_len)`, or `make_batch(batch_size)` for a model "
           "without a sequence, and `loss_fn(output, targets)`). "
           "**This imports and runs your code** in child processes, on fake tensors (no memory used).")

i1, i2 = st.columns([3, 1])
ref = i1.text_input("Module (FILE.py:FUNCTION)", key="module_ref", bind="query-params", placeholder=EXAMPLE)
shape_text = i2.text_input("Input shape (no sequence)", key="m_input_shape", bind="query-params",
                           placeholder="3x224x224",
                           help="an image or tabular model: one sample's shape; inputs randn(batch, *shape), "
                                "targets class ids (leave empty for token ids or your make_batch)")
r1, r2, r3, r4 = st.columns(4)
precision = r1.selectbox("Precision", PRECISIONS, key="m_precision", bind="query-params")
optimizer = r2.selectbox("Optimizer", OPTIMIZERS, OPTIMIZERS.index(TrainSpec(1, 1).optimizer), key="m_optimizer",
                         bind="query-params")
impl = r3.selectbox("Optimizer implementation", OPTIMIZER_IMPLS, key="m_impl", bind="query-params")
accum = r4.number_input("Grad. accumulation", 1, 1024, 1, key="m_accum", bind="query-params")
run = {"precision": precision, "optimizer": optimizer, "optimizer_impl": impl, "grad_accum": int(accum), "device": "cpu"}

if not ref.strip():
    st.info(f"Type the path of your file and its function, e.g. `{EXAMPLE}`.")
    st.stop()
try:
    path, func = parse_module_ref(ref.strip())
    input_shape = parse_input_shape(shape_text)
except ConfigError as exc:
    st.error(str(exc))
    st.stop()
if input_shape:
    run["input_shape"] = list(input_shape)
fit_file = fit_path(path, func, run)
sequence = has_sequence(path, input_shape)


def start(kind: str, batch: int = 2, seq: int = 16) -> None:
    """kind: whatif (the fit), train (simulate one point) or measure (the real step of one point)."""
    command = ["measure", "train"] if kind == "measure" else ["simulate", kind]
    args = command + ["--module", f"{path}:{func}", "--batch-size", str(batch), "--precision", precision,
                      "--optimizer", optimizer, "--optimizer-impl", impl, "--grad-accum", str(accum),
                      "--json", "--progress", "--timeout", str(TIMEOUT_S)]
    args += ["--input-shape", "x".join(map(str, input_shape))] if input_shape else ["--seq-len", str(seq)]
    if kind == "measure":
        args += ["--device", "cpu"]
    if kind == "whatif":
        fit_file.parent.mkdir(parents=True, exist_ok=True)
        args += ["--out", str(fit_file)]
    try:
        state["module_job"] = Job(args, timeout_s=TIMEOUT_S * 10 + 60).start()
        state["module_job_kind"] = kind
        state["module_point"] = {"batch_size": batch, "seq_len": seq}
        state.pop("module_check", None)
    except JobBusy as exc:
        state["module_message"] = str(exc)


running = "module_job" in state


@st.fragment(run_every=1.0 if running else None)
def job_panel() -> None:
    job = state.get("module_job")
    if job is None:
        return
    status = job.state()
    if status == "running":
        fraction, stage = job.progress()
        st.progress(min(max(fraction, 0.0), 1.0), text=f"Running: {stage}")
        if st.button("Cancel", key="module_cancel"):
            job.cancel()
            status = job.state()
    if status != "running":
        record = job.result() or {}
        kind = state.pop("module_job_kind", "whatif")
        ok = status == "done" and "peak_bytes" in record
        point = state.pop("module_point", {})
        if kind in ("train", "measure") and ok and fit_file.exists():
            # Stored in Runs as a simulation or a measurement, against what the fit answers at that point.
            checked = check_point(json.loads(fit_file.read_text()), record, point["batch_size"], point["seq_len"])
            what = "simulate" if kind == "train" else "measure"
            state["module_check"] = {**checked, **point, "what": what}
            RunStore().save("train", f"module {path.name}:{func}", {**run, **point}, "cpu", checked["fitted_bytes"],
                            record["peak_bytes"], {"kind": what, "estimate_source": "what-if fit",
                                                   "basis": "fitted simulation",
                                                   **{k: v for k, v in record.items() if k != "timeline"}})
        elif not ok:
            state["module_message"] = (("Cancelled: every process of the run has ended." if status == "cancelled" else
                                        f"{status}: {record.get('error', 'no result')}"))
        del state["module_job"]
        st.rerun()


b1, b2 = st.columns([1, 3])
b1.button("Fit the what-ifs" if not fit_file.exists() else "Fit again", type="primary", disabled=running,
          on_click=start, args=("whatif",), key="module_fit",
          help="simulates 10 small (batch, sequence) points in child processes (a minute for a small model)")
if msg := state.pop("module_message", None):
    st.warning(msg)
job_panel()
if not fit_file.exists():
    st.caption("No fit yet for this file and these settings.")
    st.stop()

fit = json.loads(fit_file.read_text())
try:
    from planner.whatif import WhatIf

    fit_seq = WhatIf.from_dict(fit).has_seq
except ValueError as exc:  # a fit this version cannot read
    st.error(str(exc))
    st.stop()
c1, c2, c3, c4 = st.columns(4)
batch = c1.slider("Batch size", 1, 1024, 4, key="m_batch", bind="query-params")
if fit_seq:  # the sliders show what the model has: batch and sequence, or batch only
    seq_limit = c4.number_input("Longest sequence to consider", 16, 1 << 20, 4096, key="m_seq_limit",
                                bind="query-params", help="your model's context (the fit knows no limit of its own)")
    seq = c2.slider("Sequence length", 1, int(seq_limit), min(512, int(seq_limit)), key="m_seq", bind="query-params")
else:
    seq_limit, seq = 1, 1
    c2.caption("No sequence axis: " + ("the input shape is fixed." if input_shape or not sequence else
                                       "the simulated step does not depend on the sequence length."))
default_bytes, default_source = machine_budget("cpu")
budget_gib = c3.number_input("Memory budget (GiB)", 0.1, 4096.0, bytes_to_gib(default_bytes), step=0.5,
                             key="m_budget_gib", bind="query-params", help=f"default: {default_source}")
try:
    p = module_plan(fit, int(batch), int(seq), gib_to_bytes(budget_gib), int(seq_limit))
except ValueError as exc:  # MisalignedError: batch 1 not covered by this fit
    st.error(str(exc))
    st.stop()

m1, m2, m3, m4 = st.columns(4)
m1.metric("Fitted peak", fmt_bytes(p.peak_bytes),
          delta=f"{'fits' if p.fits else 'over'} by {fmt_bytes(p.margin_bytes)}",
          delta_color="normal" if p.fits else "inverse")
m2.metric("Peak phase", p.peak_phase, help=f"at op {p.peak_op}")
m3.metric("Budget", fmt_bytes(p.budget_bytes))
m4.metric("Fit check", {"exact": "exact", "approximate": f"± {fmt_bytes(p.bound_bytes or 0)}",
                        "unvalidated": "unvalidated"}[p.status],
          help="the fit against held-out simulated points it was not fitted on")
if p.status == "approximate":
    st.warning(md_escape(f"Approximate: the fit misses held-out simulated points by up to {p.bound_bytes:,} B, so "
                         f"this peak is {p.peak_bytes:,} B ± {p.bound_bytes:,} B. Simulate the point to be exact."))
elif p.status == "unvalidated":
    st.warning("This fit was made before fits were checked on held-out points: its error is unknown. Fit again.")
st.caption(md_escape(f"From the fit of {p.simulated_points} simulated points: {p.description}."))
if p.validation_rows:
    st.dataframe(pd.DataFrame([{"held-out point": f"batch {r['batch']}" + (f", seq {r['seq']}" if fit_seq else ""),
                                "fitted": r["fitted_bytes"], "simulated": r["simulated_bytes"],
                                "error (B)": r["error_bytes"]} for r in p.validation_rows]),
                 hide_index=True, width="stretch")
f1, f2 = st.columns(2)
f1.metric("Largest batch that fits", p.max_batch, help=md_escape(p.max_batch_reason))
if fit_seq:
    f2.metric(f"Longest sequence at batch {batch}", p.max_seq, help=md_escape(p.max_seq_reason))
k1, k2 = st.columns(2)
k1.vega_lite_chart(curve_spec(p.batch_curve, "batch", p.budget_bytes,
                              f"Batch size (sequence {seq})" if fit_seq else "Batch size"))
if fit_seq:
    k2.vega_lite_chart(curve_spec(p.seq_curve, "seq", p.budget_bytes, f"Sequence length (batch {batch})"))
st.dataframe(pd.DataFrame([{"phase": k, "peak": fmt_bytes(v), "bytes": v} for k, v in p.phase_peak_bytes.items()]),
             hide_index=True, width="stretch")

s1, s2 = st.columns(2)
s1.button("Simulate this point", disabled=running, on_click=start, args=("train", int(batch), int(seq)),
          key="module_check_button", help="the same step on fake tensors at this batch and sequence: checks the fit")
s2.button("Measure this point", disabled=running, on_click=start, args=("measure", int(batch), int(seq)),
          key="module_measure_button", help="the real step in a child process on this machine's CPU (after a "
                                            "simulation of the point: refused if it would not fit the free RAM)")
if check := state.get("module_check"):
    where = f"batch {check['batch_size']}" + (f", sequence {check['seq_len']}" if fit_seq else "")
    st.caption(f"{'Measured' if check.get('what') == 'measure' else 'Simulated'} at {where}: "
               f"{fmt_bytes(check['peak_bytes'])} ({check['peak_bytes']:,} B) in {check['peak_phase']}; the fit "
               f"said {check['fitted_bytes']:,} B ({check['fit_error_pct']:+.4f}%). Kept on the Runs page.")
