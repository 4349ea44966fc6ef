"""The app as a user drives it (streamlit.testing.v1.AppTest)."""
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def test_preset_shows_counts_and_estimate():
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert at.metric[0].value == "163,037,184"
    before = at.metric[3].value
    at.number_input(key="batch").set_value(8).run()
    assert not at.exception and at.metric[3].value != before


def test_pasted_hf_config_and_bad_config():
    at = AppTest.from_file(APP, default_timeout=30).run()
    at.radio(key="source").set_value("Paste a config").run()
    text = (Path(__file__).parent / "data" / "Llama-3-8B.config.json").read_text()
    at.text_area(key="config_text").set_value(text).run()
    assert not at.exception and at.metric[0].value == "8,030,261,248"
    at.text_area(key="config_text").set_value('{"arch": "gpt2", "vocab_size": 10}').run()
    assert not at.exception and "missing key" in at.error[0].value
