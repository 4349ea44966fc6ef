"""The Planner page leads with the plan search's answer (issue #35, item 4): the question at the top (a GPU of the
catalog and how many, the task, LoRA / QLoRA allowed, the sequence, the tokens per step, each in the URL), the plan
beneath it at once (fits, its peak against the GPU, tokens/s by the roofline, what it changes from the settings),
and Apply, which sets the settings beneath to the plan's, so that the figures below are the plan's."""
import pytest
from streamlit.testing.v1 import AppTest

from planner.config import PRESETS
from planner.plan import plan_search_view
from planner.units import fmt_bytes
from tests.test_app import APP, metric

pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path
CANONICAL = {"model": "llama-3.1-8b", "gpu": "rtx-4090", "seq": "2048", "allow": "true"}  # the question
HOST = 64 * 2 ** 30


def test_the_canonical_question_answers_a_lora_plan_and_apply_sets_the_settings_to_it():
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(CANONICAL)
    at.run()
    assert not at.exception and not at.error
    assert at.selectbox(key="gpu").value == "rtx-4090" and at.toggle(key="allow").value
    quality = metric(at, "The plan: fits")
    assert quality in ("lora", "qlora")  # a full fine-tune of 8B does not fit 24 GB; the allowed ones do
    peak = metric(at, "Peak against the NVIDIA GeForce RTX 4090 24 GB")
    assert float(metric(at, "Tokens/s (roofline)").replace(",", "")) > 0
    changes = next(m.value for m in at.markdown if m.value.startswith("**What it changes"))
    assert "LoRA rank 0" in changes and "precision fp32" in changes  # the page starts at fp32, no LoRA
    assert metric(at, "Estimated peak") != peak  # the settings beneath are still the page's start

    at.slider(key="batch").set_value(2).run()  # a move below: the question is the same, the search memoised
    assert not at.exception and metric(at, "The plan: fits") == quality

    at.button(key="apply_plan").click().run()
    assert not at.exception and not at.error
    assert at.session_state["tune"] == quality and at.session_state["lora_r"] > 0
    assert at.session_state["device"] == "cuda" and at.session_state["budget_gib"] == 24.0
    assert at.session_state["precision"] in ("bf16", "bf16-amp") and at.session_state["batch"] >= 1
    # the figures beneath are now the plan's own estimate, and the plan is the settings
    assert metric(at, "Estimated peak") == peak
    assert any(m.value == "The plan is your settings." for m in at.markdown)
    assert at.button(key="apply_plan").disabled
    assert at.query_params["tune"] == quality  # applied settings stay in the URL, under their names


def test_without_the_allowance_the_page_says_nothing_fits_and_what_it_lacks():
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({**CANONICAL, "allow": "false"})
    at.run()
    assert not at.exception and not at.error
    warning = at.warning[0].value
    assert warning.startswith("Nothing in the searched space fits the NVIDIA GeForce RTX 4090 24 GB")
    view = plan_search_view(PRESETS["llama-3.1-8b"], ["--model", "llama-3.1-8b"], "rtx-4090", 1, "finetune", False,
                            2048, 0, HOST, {}, "sdpa", None)
    assert not view.fits and view.lacks_bytes == view.peak_bytes - view.tensor_budget_bytes > 0
    assert fmt_bytes(view.peak_bytes) in warning and fmt_bytes(view.lacks_bytes) + " short" in warning


def test_the_search_is_asked_once_per_question(monkeypatch):
    """The facade memoises the search (seconds cold): the same question is answered without searching again, and
    the changes are computed from the settings given each time."""
    import planner.search

    calls = []
    real = planner.search.search
    monkeypatch.setattr(planner.search, "search", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = PRESETS["gpt2-small"]
    args = (cfg, ["--model", "gpt2-small"], "l4", 1, "finetune", False, 512, 2048, HOST)
    first = plan_search_view(*args, {"batch_size": 4}, cfg.attention, None)
    searched = len(calls)
    again = plan_search_view(*args, first.apply["spec"], first.apply["attention"], None)
    assert searched <= 1 and len(calls) == searched  # the second asking searched nothing
    assert first.fits and first.changes and not again.changes
    assert {c["setting"] for c in first.changes} >= {"device"}  # the page's settings beneath start on the cpu


def test_the_question_is_read_from_the_url_under_its_names():
    """gpu, gpus, task, allow, tokens_per_step: the catalog's and `plan`'s own names, parsed as the other keys are."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({"model": "gpt2-small", "gpu": "t4", "gpus": "2", "task": "train", "allow": "true",
                            "seq": "512", "tokens_per_step": "4096"})
    at.run()
    assert not at.exception and not at.error
    assert (at.selectbox(key="gpu").value, at.number_input(key="gpus").value, at.segmented_control(key="task").value,
            at.number_input(key="tokens_per_step").value) == ("t4", 2, "train", 4096)
    assert at.toggle(key="allow").disabled  # training from scratch: no LoRA / QLoRA whatever allow says
    assert metric(at, "The plan: fits") in ("exact", "bf16", "8bit")
    assert any(m.label == "Peak per GPU against the NVIDIA T4 16 GB" for m in at.metric)
    at.number_input(key="tokens_per_step").set_value(1000).run()  # not whole samples: said, the page goes on
    assert not at.exception and "multiple of the sequence length" in at.warning[0].value
    assert metric(at, "Estimated peak")
