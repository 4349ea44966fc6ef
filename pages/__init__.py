"""The frame every page draws first: page config, the shared model picker and the machine, page links.

Why here: Streamlit runs each page of a `pages/` app on its own (its legacy multipage mode, which also
makes deep links work on a fresh server), and skips `__init__.py` when it lists pages, so this module
is shared UI code that is never a page. Sidebar widgets use persist_state="session": a widget's identity
includes its page, so without it the chosen model would reset on every page switch.
"""
import psutil
import streamlit as st

from planner.config import PRESETS, ConfigError, parse_config_text
from planner.fit import gpu_info
from planner.units import fmt_bytes

LINKS = [("app.py", "Planner", ":material/tune:"), ("pages/1_training.py", "Training step", ":material/speed:"),
         ("pages/2_loading.py", "Weight loading", ":material/download:"), ("pages/3_runs.py", "Runs", ":material/history:")]


@st.cache_data(ttl=60)
def _gpu():
    return gpu_info()


def frame(title: str):
    """Draw the sidebar and return the chosen model config (None, with an error shown, when it is invalid)."""
    st.set_page_config(page_title=f"{title} - Torch Memory Planner", page_icon=":material/memory:", layout="wide")
    with st.sidebar:
        st.markdown("### Torch Memory Planner")
        for path, label, icon in LINKS:
            st.page_link(path, label=label, icon=icon)
        st.divider()
        st.markdown("**Model**")
        source = st.radio("Model from", ["Preset", "Paste a config"], key="source", horizontal=True,
                          label_visibility="collapsed", persist_state="session")
        cfg, error, name = None, None, None
        if source == "Preset":
            name = st.selectbox("Preset", list(PRESETS), key="preset", persist_state="session")
            cfg = PRESETS[name]
        else:
            text = st.text_area("Config JSON (arch gpt2/llama, or a Hugging Face config.json)", key="config_text",
                                height=200, persist_state="session",
                                placeholder='{"arch": "gpt2", "vocab_size": 50257, "context_length": 1024, ...}')
            uploaded = st.file_uploader("or upload a config.json", type=["json"], key="config_file")
            if uploaded is not None:
                text = uploaded.getvalue().decode("utf-8", "replace")
            name = uploaded.name if uploaded is not None else "pasted config"
            if text.strip():
                try:
                    cfg = parse_config_text(text, source="the config")
                except ConfigError as exc:
                    error = str(exc)
        st.divider()
        st.markdown("**Machine**")
        gpu = _gpu()
        ram = psutil.virtual_memory()
        st.caption(f"GPU: {gpu['name']}, {fmt_bytes(gpu['total_bytes'])}" if gpu
                   else "CPU only — measurements run on the CPU")
        st.caption(f"RAM: {fmt_bytes(ram.available)} free of {fmt_bytes(ram.total)}")
    st.session_state["model_cfg"] = cfg
    st.session_state["model_name"] = name if cfg is not None else None
    st.session_state["gpu"] = gpu
    if error:
        st.error(error)
    elif cfg is None:
        st.info("Paste a config in the sidebar, or pick a preset.")
    return cfg
