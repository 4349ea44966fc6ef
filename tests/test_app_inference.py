"""The Planner page's inference mode as a user drives it (AppTest): the figures are planner.serving's for the
settings on the screen, the serving capacity answers hold at their bounds, and refusals are one line."""
import dataclasses
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.config import PRESETS
from planner.infer_spec import InferSpec
from planner.serving import kv_tokens, plan_inference
from planner.units import fmt_bytes

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")

pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


def metric(at, label_start):
    return next(m.value for m in at.metric if m.label.startswith(label_start))


def open_inference(model: str, **params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update({"model": model, "goal": "inference", **{k: str(v) for k, v in params.items()}})
    return at.run()


def test_inference_mode_shows_the_plan_for_the_settings_on_screen():
    at = open_inference("llama-3.2-1b", infer_precision="bf16", infer_batch=4, prompt=1024, new_tokens=256,
                        infer_budget_gib=24)
    assert not at.exception, at.exception
    ispec = InferSpec(batch_size=4, prompt_len=1024, new_tokens=256, precision="bf16")
    p = plan_inference(PRESETS["llama-3.2-1b"], ispec, 24 * 2**30)
    assert metric(at, "Estimated peak of generate()") == fmt_bytes(p.peak_bytes)
    assert metric(at, "Peak phase") == p.estimate["peak_phase"]
    assert metric(at, "Largest batch") == str(p.max_batch)
    assert metric(at, "KV cache tokens that fit") == f"{p.kv_tokens:,}"
    # the training controls are not drawn in this mode
    assert not [s for s in at.selectbox if s.key == "optimizer"]


def test_serving_capacity_answers_hold_at_their_bounds():
    """The largest batch fits and one more does not; the longest context fits and one token more does not;
    the KV tokens fill the budget beside the working set to within one token's bytes."""
    cfg, budget = PRESETS["llama-3.2-1b"], 24 * 2**30
    ispec = InferSpec(batch_size=2, prompt_len=2048, new_tokens=128, precision="bf16")
    p = plan_inference(cfg, ispec, budget)
    usable = p.tensor_budget_bytes
    peak = lambda **kw: plan_inference(cfg, dataclasses.replace(ispec, **kw), budget).peak_bytes
    assert 0 < p.max_batch and peak(batch_size=p.max_batch) <= usable < peak(batch_size=p.max_batch + 1)
    assert p.max_context == cfg.max_seq_len or (
        peak(prompt_len=p.max_context - ispec.new_tokens) <= usable < peak(prompt_len=p.max_context - ispec.new_tokens + 1))
    ours, theirs = kv_tokens(p.estimate, usable)
    per_token = p.estimate["kv_cache_bytes_per_token"]
    working = p.peak_bytes - p.estimate["components"]["kv_cache"]
    assert working + ours * per_token <= usable < working + (ours + 1) * per_token
    assert theirs < ours  # vLLM plans in 90% of the device


def test_inference_mode_refuses_a_context_beyond_the_model_in_one_line():
    at = open_inference("gpt2-small", infer_batch=1, prompt=1000, new_tokens=100)
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "longer than the model's context" in errors[0], errors


def test_simulate_this_generation_runs_a_child_and_keeps_the_run():
    """One click simulates the generation on the screen in a child process; its record is shown beside the
    estimate and kept on the Runs page with kind infer. The child (`simulate infer`, tested in
    tests/test_inference.py) is started with the settings on the screen; the page takes its recorded output."""
    from planner.config import config_to_dict
    from planner.store import RunStore
    from tests.replay import ReplayJob, recorded

    at = open_inference("llama-3.2-1b", infer_precision="bf16", infer_batch=1, prompt=64, new_tokens=4,
                        infer_attention="sdpa")
    at.button(key="infer_simulate").click().run()
    job = at.session_state["infer_job"]
    assert job.config == config_to_dict(PRESETS["llama-3.2-1b"]) and job.args == [
        "simulate", "infer", "--batch-size", "1", "--prompt-len", "64", "--new-tokens", "4", "--precision", "bf16",
        "--cache", "dynamic", "--device", "cpu", "--attention", "sdpa", "--json", "--progress", "--timeout", "600"]
    job.cancel()
    at.session_state["infer_job"] = ReplayJob(recorded("simulate_infer_llama32_1b.jsonl"), "done")
    for _ in range(120):
        if "infer_job" not in at.session_state:
            break
        time.sleep(1)
        at.run()
    assert not at.exception, at.exception
    est = at.session_state["infer_result"]["estimate"]
    rec = at.session_state["infer_result"]["record"]
    assert at.session_state["infer_result"]["status"] == "done", at.session_state["infer_result"]
    assert metric(at, "Simulated peak") == fmt_bytes(rec["peak_bytes"])
    assert abs(est["peak_bytes"] - rec["peak_bytes"]) <= 0.01 * rec["peak_bytes"]  # #21's bar
    runs = RunStore().list("infer")
    assert runs and runs[0]["measured_bytes"] == rec["peak_bytes"] and runs[0]["record"]["kind"] == "simulate"


def test_the_books_gpt2_generation_is_estimated():
    """The book's GPT-2 generates with generate_text_simple (no cache): its estimate is shown
    (planner/arch/gpt2_book.py estimate_generate_text_simple), and no KV cache figure is made up for it."""
    at = open_inference("gpt2-small", infer_batch=1, prompt=64, new_tokens=8)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    p = plan_inference(PRESETS["gpt2-small"], InferSpec(1, 64, 8, cache="none"), 24 * 2**30)
    assert metric(at, "Estimated peak of generate()") == fmt_bytes(p.peak_bytes)
    assert metric(at, "KV cache tokens that fit") == "no cache" and p.kv_tokens == 0
