"""The app as a user drives it (streamlit.testing.v1.AppTest): every page, sliders, bad input, real runs."""
import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
TINY = {"arch": "gpt2", "vocab_size": 300, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 2,
        "drop_rate": 0.1}


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PLANNER_CACHE", str(tmp_path / "cache"))
    return tmp_path


def app() -> AppTest:
    return AppTest.from_file(APP, default_timeout=60).run()


def metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def paste_tiny(at):
    at.radio(key="source").set_value("Paste a config").run()
    at.text_area(key="config_text").set_value(json.dumps(TINY)).run()
    return at


def wait_for(at, key, timeout_s=120):
    """AppTest never ticks run_every fragments: rerun until the job leaves session state."""
    deadline = time.monotonic() + timeout_s
    while key in at.session_state and time.monotonic() < deadline:
        time.sleep(0.5)
        at.run()
    assert key not in at.session_state, "the job did not finish"


def test_planner_sliders_change_the_numbers():
    at = app()
    assert not at.exception
    before = metric(at, "Estimated peak")
    at.slider(key="batch").set_value(32).run()
    assert not at.exception and metric(at, "Estimated peak") != before
    at.toggle(key="ckpt").set_value(True).run()
    at.segmented_control(key="precision").set_value("bf16-amp").run()
    assert not at.exception and metric(at, "Peak phase") in ("forward", "loss", "backward", "optimizer", "zero_grad")


def test_advice_option_applies_to_sliders():
    at = app()
    at.slider(key="batch").set_value(64).run()
    labels = at.selectbox(key="advice_choice").options
    choice = next(l for l in labels if l == "checkpointing")
    at.selectbox(key="advice_choice").set_value(choice).run()
    at.button(key="apply").click().run()
    assert not at.exception and at.toggle(key="ckpt").value is True


def test_bad_config_shows_an_error_not_an_exception():
    at = app()
    at.radio(key="source").set_value("Paste a config").run()
    at.text_area(key="config_text").set_value('{"arch": "gpt2", "vocab_size": 10}').run()
    assert not at.exception and "missing key" in at.error[0].value
    at.text_area(key="config_text").set_value("{oops").run()
    assert not at.exception and "not valid JSON" in at.error[0].value


def test_hf_config_is_accepted():
    at = app()
    at.radio(key="source").set_value("Paste a config").run()
    at.text_area(key="config_text").set_value((ROOT / "tests/data/Llama-3-8B.config.json").read_text()).run()
    assert not at.exception and metric(at, "Estimated peak")


@pytest.mark.parametrize("page", ["pages/1_training.py", "pages/2_loading.py", "pages/3_runs.py"])
def test_every_page_renders(page):
    at = app()
    at.switch_page(page).run()
    assert not at.exception


def test_training_measurement_completes_and_is_stored(data_dir):
    at = paste_tiny(app())
    at.slider(key="batch").set_value(2).run()
    at.slider(key="seq").set_value(32).run()
    at.switch_page("pages/1_training.py").run()
    at.button(key="run").click().run()
    wait_for(at, "job")
    assert not at.exception and not at.error
    assert abs(float(metric(at, "Error").rstrip("%"))) <= 2.0
    from planner.store import RunStore
    runs = RunStore(data_dir / "data" / "runs.sqlite").list()
    assert len(runs) == 1 and runs[0]["kind"] == "train" and runs[0]["measured_bytes"] > 0
    at.switch_page("pages/3_runs.py").run()
    assert not at.exception and metric(at, "Worst |error| over these runs")


def test_training_refuses_what_cannot_fit():
    at = app()  # gpt2-small preset
    at.selectbox(key="preset").set_value("llama-3-8b").run()
    at.slider(key="batch").set_value(64).run()
    at.switch_page("pages/1_training.py").run()
    assert not at.exception and "Not started" in at.error[0].value
    assert at.button(key="run").disabled


def test_loading_measure_all(data_dir):
    at = paste_tiny(app())
    at.switch_page("pages/2_loading.py").run()
    at.button(key="measure_all").click().run()
    wait_for(at, "load_job", timeout_s=300)
    assert not at.exception and not at.error
    assert len(at.session_state["load_result"]["results"]) == 7
