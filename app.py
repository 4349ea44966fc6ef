"""Torch Memory Planner - the Planner page (home): will it fit, and what do I change so it fits?

Run: streamlit run app.py
What-if sliders re-estimate instantly (arithmetic in planner/, no torch here); measurements run as child
processes from the Training step and Weight loading pages.
"""
import dataclasses

import pandas as pd
import psutil
import streamlit as st

from planner.charts import breakdown_bar, curve_with_budget
from planner.config import ConfigError
from planner.estimate.training import CUDA_CONTEXT_BYTES, estimate_training
from planner.fit import fit_report
from planner.spec import OPTIMIZERS, PRECISIONS, TrainSpec, prepare
from planner.units import fmt_bytes
from pages import frame

PHASE_WHY = {
    "forward": "the forward pass, with every saved activation and the logits alive",
    "loss": "the loss, where the logits and the log-softmax output (b*s*V each) coexist",
    "backward": "backward: the saved activations plus the gradients being produced "
                "(at the start, the cross-entropy's b*s*V gradients; later, a block's working set)",
    "optimizer": "optimizer.step(): weights + gradients + optimizer states + the update's temporaries",
    "zero_grad": "just before zero_grad(): weights + gradients + optimizer states",
}

cfg = frame("Planner")
st.title("Planner: will it fit?")
if cfg is None:
    st.stop()

# An option applied from the advice table below sets the widgets before they are drawn.
for key, value in st.session_state.pop("apply_settings", {}).items():
    st.session_state[key] = value

gpu = st.session_state.get("gpu")
default_budget = (gpu["total_bytes"] - CUDA_CONTEXT_BYTES) if gpu else psutil.virtual_memory().available
c1, c2, c3 = st.columns(3)
batch = c1.slider("Batch size", 1, 256, 4, key="batch", bind="query-params")
seq_max = min(cfg.max_seq_len, 32768)
seq = c2.slider("Sequence length", 1, seq_max, min(512, seq_max), key="seq", bind="query-params")
budget_gib = c3.number_input("Memory budget (GiB)", 0.1, 4096.0, round(default_budget / 2**30, 1), step=0.5,
                             key="budget_gib", bind="query-params",
                             help="Default: the GPU's memory minus the CUDA context, else the RAM free now")
c4, c5, c6, c7, c8, c9 = st.columns([2, 1.3, 1, 1.3, 1, 1])
precision = c4.segmented_control("Precision", PRECISIONS, default="fp32", key="precision", bind="query-params")
optimizer = c5.selectbox("Optimizer", OPTIMIZERS, index=OPTIMIZERS.index("adamw"), key="optimizer",
                         bind="query-params")
attention = c6.selectbox("Attention", ["eager", "sdpa"], index=0 if cfg.attention == "eager" else 1,
                         key="attention", bind="query-params")
accum = c7.number_input("Grad. accumulation", 1, 1024, 1, key="accum", bind="query-params")
device = c8.selectbox("Device", ["cuda", "cpu"] if gpu else ["cpu", "cuda"], key="device", bind="query-params")
ckpt = c9.toggle("Checkpointing", key="ckpt", bind="query-params")

budget = int(budget_gib * 2**30)
try:
    spec = TrainSpec(batch_size=int(batch), seq_len=int(seq), precision=precision or "fp32", optimizer=optimizer,
                     checkpointing=bool(ckpt), grad_accum=int(accum), device=device)
    run_cfg = prepare(cfg, spec, attention)
except ConfigError as exc:
    st.error(str(exc))
    st.stop()
est = estimate_training(run_cfg, spec)
st.session_state["run_settings"] = {"spec": dataclasses.asdict(spec), "attention": attention, "budget": budget}

fits = est.peak_bytes <= budget
m1, m2, m3 = st.columns(3)
m1.metric("Estimated peak", fmt_bytes(est.peak_bytes),
          delta=f"{'fits' if fits else 'over'} by {fmt_bytes(abs(budget - est.peak_bytes))}",
          delta_color="normal" if fits else "inverse")
m2.metric("Budget", fmt_bytes(budget))
m3.metric("Peak phase", est.peak_phase)
st.caption(f"The peak falls in {PHASE_WHY[est.peak_phase]}.")
for note in est.notes:
    st.caption(note)

persistent = {"params": est.params_bytes, "buffers": est.buffers_bytes, "inputs": est.inputs_bytes,
              "optimizer": est.optimizer_bytes}
at_peak = dict(persistent)
rest = est.peak_bytes - sum(persistent.values())
if est.peak_phase in ("optimizer", "zero_grad") or spec.grad_accum > 1:
    at_peak["grads"] = est.grads_bytes
    rest -= est.grads_bytes
if est.peak_phase in ("forward", "loss", "backward"):
    at_peak["activations"] = min(est.activations_bytes, max(rest, 0))
    rest -= at_peak["activations"]
at_peak["transients"] = max(rest, 0)
totals = {"params": est.params_bytes, "buffers": est.buffers_bytes, "inputs": est.inputs_bytes,
          "optimizer": est.optimizer_bytes, "grads": est.grads_bytes, "activations": est.activations_bytes}
bars = pd.DataFrame([{"scenario": f"at the peak ({est.peak_phase})", "component": k, "bytes": v} for k, v in at_peak.items()]
                    + [{"scenario": "each component's full size", "component": k, "bytes": v} for k, v in totals.items()])
st.altair_chart(breakdown_bar(bars))

st.subheader("Fit the budget")
report = fit_report(run_cfg, dataclasses.replace(spec, batch_size=1), budget, batch_given=False)
seq_report = fit_report(run_cfg, spec, budget, batch_given=True)
f1, f2 = st.columns(2)
f1.metric("Largest batch that fits", report["max_batch_size"], help=report["reason"])
f2.metric(f"Longest sequence at batch {spec.batch_size}", seq_report["max_seq_len"], help=seq_report["reason"])
options = seq_report["advice"]
adv = pd.DataFrame([{"change": " + ".join(o["changes"]), "peak": fmt_bytes(o["peak_bytes"]),
                     "fits": "yes" if o["fits"] else "no", "cost": o["cost"]} for o in options])
st.dataframe(adv, hide_index=True, width="stretch")
labels = [" + ".join(o["changes"]) for o in options]
choice = st.selectbox("Option", labels, key="advice_choice") if labels else None
b1, b2 = st.columns(2)
if choice and b1.button("Apply to the sliders", key="apply"):
    o = options[labels.index(choice)]
    s = o["spec"]
    st.session_state["apply_settings"] = {"batch": s["batch_size"], "seq": s["seq_len"], "precision": s["precision"],
                                          "optimizer": s["optimizer"], "ckpt": s["checkpointing"],
                                          "accum": s["grad_accum"], "attention": o["attention"]}
    st.rerun()
if choice and b2.button("Measure this option", key="measure_option"):
    o = options[labels.index(choice)]
    st.session_state["run_settings"] = {"spec": o["spec"], "attention": o["attention"], "budget": budget}
    st.session_state["autostart"] = True
    st.switch_page("pages/1_training.py")

st.subheader("Peak against batch size and sequence length")
k1, k2 = st.columns(2)
top_batch = max(8, min(256, 2 * max(report["max_batch_size"], spec.batch_size)))
batches = sorted({max(1, round(top_batch * i / 24)) for i in range(25)})
k1.altair_chart(curve_with_budget(pd.DataFrame(
    [{"batch": b, "peak_bytes": estimate_training(run_cfg, dataclasses.replace(spec, batch_size=b)).peak_bytes}
     for b in batches]), "batch", budget, "Batch size"))
seqs = sorted({max(1, round(seq_max * i / 24)) for i in range(25)})
k2.altair_chart(curve_with_budget(pd.DataFrame(
    [{"seq": s, "peak_bytes": estimate_training(run_cfg, dataclasses.replace(spec, seq_len=s)).peak_bytes}
     for s in seqs]), "seq", budget, "Sequence length"))

st.subheader("Every term and its formula")
terms = pd.DataFrame(est.terms)
terms["bytes (x L if per layer)"] = [t["bytes"] * (cfg.layers if t["per_layer"] else 1) for t in est.terms]
st.dataframe(terms[["name", "formula", "per_layer", "bytes", "bytes (x L if per layer)"]], hide_index=True, width="stretch")
st.dataframe(pd.DataFrame([{"phase": k, "peak": fmt_bytes(v), "bytes": v} for k, v in est.phase_peak_bytes.items()]
                          + [{"phase": f"transient: {k}", "peak": fmt_bytes(v), "bytes": v}
                             for k, v in est.transients.items()]), hide_index=True, width="stretch")
