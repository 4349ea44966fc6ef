"""The Planner page's inference controls for weight quantization and the cache (AppTest): the choices are the
planner's (planner.serving), every figure follows them, and one-click simulate and the Runs page carry them."""
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.config import PRESETS
from planner.infer_spec import InferSpec
from planner.serving import cache_choices, plan_inference, weight_quant_choices
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


def test_choosing_nf4_changes_every_figure_to_the_planners():
    """Clicking nf4 then double quant: the peak, the largest batch, the KV tokens and both curves are
    plan_inference's for the quantized spec, and smaller than the bf16 weights' peak."""
    cfg, budget = PRESETS["llama-3.2-1b"], 24 * 2**30
    at = open_inference("llama-3.2-1b", infer_precision="bf16", infer_batch=4, prompt=1024, new_tokens=128,
                        infer_budget_gib=24, infer_device="cuda")
    assert not at.exception, at.exception
    assert at.segmented_control(key="infer_quant").options == list(weight_quant_choices(cfg, "cuda"))
    assert at.toggle(key="infer_double_quant").disabled  # only for 4-bit weights
    before = metric(at, "Estimated peak of generate()")
    at.segmented_control(key="infer_quant").set_value("nf4").run()
    at.toggle(key="infer_double_quant").set_value(True).run()
    assert not at.exception, at.exception
    ispec = InferSpec(4, 1024, 128, precision="bf16", quantize_weights="nf4", double_quant=True, device="cuda")
    p = plan_inference(cfg, ispec, budget)
    plain = plan_inference(cfg, InferSpec(4, 1024, 128, precision="bf16", device="cuda"), budget)
    assert before == fmt_bytes(plain.peak_bytes) != metric(at, "Estimated peak of generate()")
    assert metric(at, "Estimated peak of generate()") == fmt_bytes(p.peak_bytes) and p.peak_bytes < plain.peak_bytes
    assert metric(at, "Largest batch") == str(p.max_batch) and p.max_batch >= plain.max_batch
    assert metric(at, "KV cache tokens that fit") == f"{p.kv_tokens:,}"
    # the breakdown's weights bar is bitsandbytes' bytes; the curves are the quantized spec's
    run = at.session_state["infer_run"]
    assert run["ispec"]["quantize_weights"] == "nf4" and run["ispec"]["double_quant"] is True
    assert run["estimate"]["components"]["weights"] == p.estimate["components"]["weights"] \
        < plain.estimate["components"]["weights"]
    assert any("nf4" in c.value and "double quant" in c.value for c in at.caption)


def test_the_controls_offer_only_what_the_planner_allows():
    """The book's GPT-2 is not a transformers model: no quantization and only its own cache ('none');
    a transformers model offers the family's caches; int8 cannot be simulated (the button says why)."""
    at = open_inference("gpt2-small", infer_batch=1, prompt=64, new_tokens=8)
    assert not at.exception, at.exception
    assert at.segmented_control(key="infer_quant").options == ["none"]
    assert at.selectbox(key="cache").options == list(cache_choices(PRESETS["gpt2-small"])) == ["none"]
    at = open_inference("qwen2.5-0.5b", infer_precision="bf16", infer_batch=1, prompt=64, new_tokens=8,
                        infer_quant="int8", cache="static")
    assert not at.exception, at.exception
    assert at.selectbox(key="cache").options == list(cache_choices(PRESETS["qwen2.5-0.5b"]))
    assert at.selectbox(key="cache").value == "static"
    assert at.button(key="infer_simulate").disabled
    assert "Int8Params" in at.button(key="infer_simulate").help
    p = plan_inference(PRESETS["qwen2.5-0.5b"], InferSpec(1, 64, 8, precision="bf16", cache="static",
                                                          quantize_weights="int8"), 24 * 2**30)
    assert metric(at, "Estimated peak of generate()") == fmt_bytes(p.peak_bytes)


def test_simulate_carries_the_quantization_and_runs_keeps_it():
    """One click simulates the nf4 generation on the screen; the record is the quantized run's (within #21's
    1% of the estimate) and the Runs page keeps its settings, quantization included. The child (`simulate infer
    --quantize-weights nf4`, tested in tests/test_infer_quant.py) is started with the settings on the screen; the
    page takes its recorded output (tests/replay.py)."""
    from planner.config import config_to_dict
    from planner.store import RunStore
    from tests.replay import ReplayJob, recorded

    at = open_inference("llama-3.2-1b", infer_precision="bf16", infer_batch=1, prompt=32, new_tokens=2,
                        infer_quant="nf4", infer_attention="sdpa")
    assert not at.exception, at.exception
    at.button(key="infer_simulate").click().run()
    job = at.session_state["infer_job"]
    assert job.config == config_to_dict(PRESETS["llama-3.2-1b"]) and job.args == [
        "simulate", "infer", "--batch-size", "1", "--prompt-len", "32", "--new-tokens", "2", "--precision", "bf16",
        "--cache", "dynamic", "--device", "cpu", "--quantize-weights", "nf4", "--attention", "sdpa", "--json",
        "--progress", "--timeout", "600"]
    job.cancel()
    at.session_state["infer_job"] = ReplayJob(recorded("simulate_infer_llama32_1b_nf4.jsonl"), "done")
    for _ in range(240):
        if "infer_job" not in at.session_state:
            break
        time.sleep(1)
        at.run()
    res = at.session_state["infer_result"]
    assert res["status"] == "done", res
    est, rec = res["estimate"], res["record"]
    assert rec["persistent_bytes"] == est["persistent_bytes"]  # bitsandbytes' weight bytes, simulated
    assert abs(est["peak_bytes"] - rec["peak_bytes"]) <= 0.01 * rec["peak_bytes"]
    run = RunStore().list("infer")[0]
    assert run["settings"]["quantize_weights"] == "nf4" and run["record"]["kind"] == "simulate"
    assert run["measured_bytes"] == rec["peak_bytes"]

    # the Runs page lists it under its kind, with the quantization in its settings
    at.switch_page("pages/3_runs.py").run()
    at.segmented_control(key="runs_kind").set_value("infer").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert list(table["kind"]) == ["infer"] and "quantize_weights=nf4" in table["settings"][0]


def test_memoised_quantized_weight_bytes_are_the_count_itself():
    """planner/infer_quant.py memoises the quantized weights' bytes (a slider move asks again): the memoised
    figure is the uncached count, for a hashable preset and for a config with a dict field (not hashable)."""
    import dataclasses

    from planner.config import config_from_dict
    from planner.infer_quant import _weights_bytes, weights_bytes

    hf = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    for cfg in (PRESETS["llama-3.2-1b"], config_from_dict(hf)):
        for q, dq in (("int8", False), ("nf4", True), ("fp4", False)):
            ispec = InferSpec(1, 8, 8, precision="bf16", quantize_weights=q, double_quant=dq, device="cuda")
            got = weights_bytes(cfg, ispec, 2)
            assert got == _weights_bytes.__wrapped__(cfg, q, dq, False, "cuda", 2)
            assert got == weights_bytes(cfg, dataclasses.replace(ispec, batch_size=7, prompt_len=3), 2)
            assert got[1] == 7 * cfg.layers  # q, k, v, o, gate, up, down: every linear but the head
