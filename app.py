"""Torch Memory Planner: pick a model, see what it holds and what one training step peaks at.

Run: streamlit run app.py     (no torch is imported here: estimates are plain arithmetic in planner/)
"""
import pandas as pd
import streamlit as st

from planner.accounting import param_count, tensor_inventory, weights_table
from planner.config import PRESETS, ConfigError, parse_config_text
from planner.estimate.training import estimate_training
from planner.spec import OPTIMIZERS, PRECISIONS, TrainSpec, prepare
from planner.units import fmt_bytes

st.set_page_config(page_title="Torch Memory Planner", page_icon=":material/memory:", layout="wide")
st.title("Torch Memory Planner")
st.caption("Will it fit, and what do I change so it fits? Every figure below is a formula of the config; "
           "`python -m planner measure train ...` checks it against a real step.")

with st.sidebar:
    st.header("Model")
    source = st.radio("Model from", ["Preset", "Paste a config"], key="source", horizontal=True)
    cfg, error = None, None
    if source == "Preset":
        name = st.selectbox("Preset", list(PRESETS), key="preset")
        cfg = PRESETS[name]
    else:
        text = st.text_area("Config JSON (arch gpt2/llama, or a Hugging Face config.json)", key="config_text",
                            height=220, placeholder='{"arch": "gpt2", "vocab_size": 50257, ...}')
        if text.strip():
            try:
                cfg = parse_config_text(text, source="the pasted config")
            except ConfigError as exc:
                error = str(exc)

if error:
    st.error(error)
    st.stop()
if cfg is None:
    st.info("Paste a config in the sidebar, or pick a preset.")
    st.stop()

n_params = param_count(cfg)
col1, col2, col3 = st.columns(3)
col1.metric("Parameters", f"{n_params:,}")
col2.metric("Layers x hidden", f"{cfg.layers} x {cfg.hidden}")
col3.metric("Largest tensor", f"{max(t.numel for t in tensor_inventory(cfg)):,} elements")

st.subheader("Weights per dtype")
table = pd.DataFrame(weights_table(cfg))
st.dataframe(table.assign(**{c: table[c].map(fmt_bytes) for c in ("params_bytes", "buffers_bytes", "total_bytes")}),
             hide_index=True, width="stretch")

st.subheader("One training step")
c1, c2, c3, c4, c5 = st.columns(5)
batch = c1.number_input("Batch size", 1, 4096, 1, key="batch")
seq = c2.number_input("Sequence length", 1, cfg.max_seq_len, min(256, cfg.max_seq_len), key="seq")
precision = c3.selectbox("Precision", PRECISIONS, key="precision")
optimizer = c4.selectbox("Optimizer", OPTIMIZERS, index=OPTIMIZERS.index("adamw"), key="optimizer")
ckpt = c5.toggle("Checkpointing", key="ckpt")
try:
    spec = TrainSpec(batch_size=int(batch), seq_len=int(seq), precision=precision, optimizer=optimizer,
                     checkpointing=ckpt)
    est = estimate_training(prepare(cfg, spec), spec)
except ConfigError as exc:
    st.error(str(exc))
    st.stop()

st.metric("Estimated peak (CPU)", fmt_bytes(est.peak_bytes), help=f"in the {est.peak_phase} phase")
components = pd.DataFrame([
    {"component": k.removesuffix("_bytes"), "bytes": getattr(est, k)}
    for k in ("params_bytes", "buffers_bytes", "inputs_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")])
components["size"] = components["bytes"].map(fmt_bytes)
st.dataframe(components, hide_index=True, width="stretch")
st.write("Peak of each phase:", ", ".join(f"{k} {fmt_bytes(v)}" for k, v in est.phase_peak_bytes.items()))
with st.expander("Every activation term and its formula"):
    st.dataframe(pd.DataFrame(est.terms), hide_index=True, width="stretch")
