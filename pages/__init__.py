"""The frame every page draws first: page config, the shared model picker and the machine, page links.

Why here: Streamlit runs each page of a `pages/` app on its own (its legacy multipage mode, which also
makes deep links work on a fresh server), and skips `__init__.py` when it lists pages, so this module
is shared UI code that is never a page.

The model choice lives in plain session state (`model_choice`), not only in widget state, which Streamlit
drops on a page switch: a pasted config survives every page switch. The model is also in the URL
(`?model=gpt2-small`, or `?model=pasted-1a2b3c4d` for a config pasted in this session), so a link opens
with it; an invalid paste keeps the last valid model (its name says which) and shows the error beside the box.
"""
import functools
import hashlib
import json

import psutil
import streamlit as st

from planner.accounting import param_count
from planner.arch import family_of
from planner.config import PRESETS, ConfigError, config_to_dict, parse_config_text
from planner.fit import default_budget, gpu_info
from planner.units import fmt_bytes, fmt_count

LINKS = [("app.py", "Planner", ":material/tune:"), ("pages/1_training.py", "Training step", ":material/speed:"),
         ("pages/2_loading.py", "Weight loading", ":material/download:"), ("pages/3_runs.py", "Runs", ":material/history:"),
         ("pages/4_module.py", "Your module", ":material/code:")]
DEFAULT_MODEL = "gpt2-small"
SOURCES = ["Preset", "Paste a config"]


# Machine facts that do not change while the app runs: read once per process (functools, not st.cache_data,
# whose lookup hashes the function on every call: ~7 ms of each rerun).
@functools.cache
def _gpu():
    return gpu_info()


@functools.cache
def machine_budget(device: str) -> tuple[int, str]:
    """The default budget for `device` (planner.fit.default_budget: the GPU's total, else the total RAM),
    or this machine's RAM with a note when no GPU figure is here."""
    try:
        return default_budget(device)
    except ConfigError:
        total, source = default_budget("cpu")
        return total, f"{source}: no GPU here, so type your GPU's memory"


def md_escape(text: str) -> str:
    """Text shown through Markdown as written (formulas such as b*s*V keep their asterisks)."""
    return "".join("\\" + ch if ch in "\\`*_{}[]<>()#+-.!|~$:" else ch for ch in text)


def pasted_model(text: str) -> tuple[str, str, object]:
    """(id for the URL, display name, config) of a pasted config; raises ConfigError if it is invalid.
    The id is a short hash of the parsed config (spacing and key order do not change it); the name is the
    config's own `name` (or Hugging Face's `_name_or_path`), else its architecture and size."""
    cfg = parse_config_text(text, source="the config")
    digest = hashlib.sha1(json.dumps(config_to_dict(cfg), sort_keys=True).encode()).hexdigest()[:8]
    data = json.loads(text)
    own = data.get("name") or data.get("_name_or_path")
    fitted = family_of(cfg).basis != "formula"  # issue #20: no inventory without building it (planner/arch/auto.py)
    name = f"{own} (pasted {digest})" if isinstance(own, str) and own else \
        f"pasted {cfg.model_type} ({digest})" if fitted else f"pasted {cfg.arch} {fmt_count(param_count(cfg))} ({digest})"
    return f"pasted-{digest}", name, cfg


def _choice() -> dict:
    return st.session_state.setdefault("model_choice", {
        "source": SOURCES[0], "preset": DEFAULT_MODEL, "text": "", "origin": None, "upload": None,
        "model": DEFAULT_MODEL, "pasted": {}, "url": None, "notice": None})


def _on_source():
    _choice()["source"] = st.session_state["source"]
    _choice()["notice"] = None


def _on_preset():
    _choice()["preset"] = st.session_state["preset"]
    _choice()["notice"] = None


def _on_text():
    c = _choice()
    c["text"], c["notice"] = st.session_state["config_text"], None
    c["origin"] = f"edited after uploading {c['upload']}" if c["upload"] else "typed or pasted"


def _on_upload():
    """An upload replaces the text in the box (so the box always shows the config in use): newest wins."""
    f = st.session_state.get("config_file")
    if f is not None:
        c = _choice()
        c["text"] = st.session_state["config_text"] = f.getvalue().decode("utf-8", "replace")
        c["origin"], c["upload"], c["notice"] = f"from the uploaded {f.name}", f.name, None


def _from_url(c: dict) -> None:
    """A link (or a typed URL) that names a model selects it; an unknown name is said, not guessed."""
    wanted = st.query_params.get("model")
    if not wanted or wanted == c["url"]:
        return
    c["url"] = wanted
    if wanted in PRESETS:
        c.update(source=SOURCES[0], preset=wanted, model=wanted)
    elif wanted in c["pasted"]:
        c.update(source=SOURCES[1], text=c["pasted"][wanted], origin="pasted earlier in this session", model=wanted)
    else:
        c["notice"] = (f"The link names the model {wanted!r}, which this session does not know (a pasted config "
                       f"lives in the session that pasted it): paste it again, or pick a preset.")


def _resolve(model: str, c: dict):
    if model in PRESETS:
        return PRESETS[model], model
    _, name, cfg = pasted_model(c["pasted"][model])
    return cfg, name


def _machine() -> dict | None:
    st.markdown("**Machine**")
    gpu = _gpu()
    ram = psutil.virtual_memory()
    st.caption(f"GPU: {gpu['name']}, {fmt_bytes(gpu['total_bytes'])}" if gpu
               else "CPU only — measurements run on the CPU")
    st.caption(f"RAM: {fmt_bytes(ram.available)} free of {fmt_bytes(ram.total)}")
    return gpu


def frame(title: str, picker: bool = True):
    """Draw the sidebar and return the model config in use (the last valid one while a paste is invalid).
    Sets session state: model_cfg, model_name, model_id (as in the URL), machine_gpu (this machine's GPU; "gpu"
    is the Planner's catalog GPU, in the URL). picker=False (a page with a model of its own, the user's module):
    the links and the machine only; returns None."""
    st.set_page_config(page_title=f"{title} - Torch Memory Planner", page_icon=":material/memory:", layout="wide")
    if not picker:
        with st.sidebar:
            st.markdown("### Torch Memory Planner")
            for path, label, icon in LINKS:
                st.page_link(path, label=label, icon=icon)
            st.divider()
            st.session_state["machine_gpu"] = _machine()
        return None
    c = _choice()
    _from_url(c)
    for key, field in (("source", "source"), ("preset", "preset"), ("config_text", "text")):
        st.session_state[key] = c[field]  # the widgets show the choice (their callbacks keep it current)
    with st.sidebar:
        st.markdown("### Torch Memory Planner")
        for path, label, icon in LINKS:
            st.page_link(path, label=label, icon=icon)
        st.divider()
        st.markdown("**Model**")
        source = st.radio("Model from", SOURCES, key="source", horizontal=True, label_visibility="collapsed",
                          on_change=_on_source)
        valid = source == SOURCES[0]
        if valid:
            c["model"] = st.selectbox("Preset", list(PRESETS), key="preset", on_change=_on_preset)
        else:
            text = st.text_area("Config JSON (arch gpt2/llama, or a Hugging Face config.json)", key="config_text",
                                height=200, on_change=_on_text,
                                placeholder='{"arch": "gpt2", "vocab_size": 50257, "context_length": 1024, ...}')
            st.file_uploader("or upload a config.json (it replaces the text above)", type=["json"],
                             key="config_file", on_change=_on_upload)
            if text.strip():
                try:
                    model_id, _, _ = pasted_model(text)
                    c["pasted"][model_id], c["model"], valid = text, model_id, True
                    st.caption(f"In use: the text above ({c['origin'] or 'typed or pasted'}).")
                except ConfigError as exc:
                    st.error(str(exc))
        if c["notice"]:
            st.warning(c["notice"])
        cfg, name = _resolve(c["model"], c)
        if not valid:
            st.caption(md_escape(f"Still showing the last valid model: {name}."))
        count = (f"{param_count(cfg):,} parameters" if family_of(cfg).basis == "formula"
                 else "parameters counted by the simulation")
        st.caption(md_escape(f"{name}: {count}, context {cfg.max_seq_len:,}."))
        if note := family_of(cfg).count_note(cfg):
            st.caption(md_escape(note))
        st.divider()
        gpu = _machine()
    if st.query_params.get("model") != c["model"]:
        st.query_params["model"] = c["model"]
    c["url"] = c["model"]
    st.session_state.update(model_cfg=cfg, model_name=name, model_id=c["model"], machine_gpu=gpu)
    return cfg
