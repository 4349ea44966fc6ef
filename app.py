"""Torch Memory Planner: will it fit, and what do I change so it fits?

Run: streamlit run app.py
This file is the frame around every page: the model (shared by all pages) and the machine in the
sidebar, then the chosen page. No torch here: estimates are arithmetic in planner/, measurements run
as child processes (planner.jobs).
"""
import psutil
import streamlit as st

from planner.config import PRESETS, ConfigError, parse_config_text
from planner.fit import gpu_info
from planner.units import fmt_bytes

st.set_page_config(page_title="Torch Memory Planner", page_icon=":material/memory:", layout="wide")

PAGES = [
    st.Page("pages/planner.py", title="Planner", icon=":material/tune:", default=True),
    st.Page("pages/training.py", title="Training step", icon=":material/speed:"),
    st.Page("pages/loading.py", title="Weight loading", icon=":material/download:"),
    st.Page("pages/runs.py", title="Runs", icon=":material/history:"),
]
page = st.navigation(PAGES, position="hidden")

with st.sidebar:
    st.markdown("### Torch Memory Planner")
    for p in PAGES:
        st.page_link(p)
    st.divider()
    st.markdown("**Model**")
    source = st.radio("Model from", ["Preset", "Paste or upload a config"], key="source", horizontal=True,
                      label_visibility="collapsed")
    cfg, cfg_error = None, None
    if source == "Preset":
        name = st.selectbox("Preset", list(PRESETS), key="preset")
        cfg = PRESETS[name]
    else:
        uploaded = st.file_uploader("config.json", type=["json"], key="config_file")
        text = uploaded.getvalue().decode("utf-8", "replace") if uploaded else st.text_area(
            "Config JSON (arch gpt2/llama, or a Hugging Face config.json)", key="config_text", height=200,
            placeholder='{"arch": "gpt2", "vocab_size": 50257, "context_length": 1024, ...}')
        name = uploaded.name if uploaded else "pasted config"
        if text.strip():
            try:
                cfg = parse_config_text(text, source="the config")
            except ConfigError as exc:
                cfg_error = str(exc)
    st.divider()
    st.markdown("**Machine**")
    gpu = gpu_info()
    ram = psutil.virtual_memory()
    if gpu:
        st.caption(f"GPU: {gpu['name']}, {fmt_bytes(gpu['total_bytes'])}")
    else:
        st.caption("CPU only — measurements run on the CPU")
    st.caption(f"RAM: {fmt_bytes(ram.available)} free of {fmt_bytes(ram.total)}")

st.session_state["model_cfg"] = cfg
st.session_state["model_name"] = name if cfg is not None else None
st.session_state["model_error"] = cfg_error
st.session_state["gpu"] = gpu
page.run()
