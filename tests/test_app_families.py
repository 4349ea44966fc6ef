"""The app with the Hugging Face families: each published config.json is accepted and estimated, and the
model picker lists every family's presets (streamlit.testing.v1.AppTest)."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.config import PRESETS

ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


def app() -> AppTest:
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()


@pytest.mark.parametrize("fname", ["Qwen3-0.6B", "gpt2", "Mistral-7B-v0.1"])
def test_non_llama_config_json_is_estimated(fname):
    at = app()
    at.radio(key="source").set_value("Paste a config").run()
    at.text_area(key="config_text").set_value((ROOT / f"tests/data/{fname}.config.json").read_text()).run()
    assert not at.exception and not at.error
    assert next(m.value for m in at.metric if m.label == "Estimated peak")


def test_model_picker_lists_every_family_preset():
    at = app()
    options = at.selectbox(key="preset").options
    for name in ("mistral-7b-v0.1", "qwen2.5-0.5b", "qwen3-8b", "gemma-2b", "gemma-2-2b", "phi-3-mini-4k", "hf-gpt2"):
        assert name in options
    assert set(options) >= set(PRESETS)
