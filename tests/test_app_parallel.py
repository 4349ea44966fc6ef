"""Data parallel in the app (streamlit.testing.v1.AppTest): the Planner page's world size and layout give
per-rank figures (the CLI's `estimate train --world-size N --parallel ...`), the fit answers the fewest
devices and the largest batch per rank, and the Training step page runs and shows ranks."""
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.config import PRESETS, config_from_dict
from planner.estimate.distributed import estimate_distributed
from planner.fit import fewest_ranks, max_batch_per_rank, tensor_budget
from planner.parallel import ParallelSpec
from planner.spec import prepare
from planner.units import fmt_bytes
from tests.replay import ReplayJob, recorded
from tests.test_app import TINY, metric, paste, shown

ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


def app() -> AppTest:
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()


def layout(at, parallel: str, world: int, **fsdp) -> AppTest:
    at.selectbox(key="parallel").set_value(parallel).run()
    at.number_input(key="world").set_value(world).run()
    for key, value in fsdp.items():
        (at.selectbox(key=key) if key == "mp" else at.toggle(key=key)).set_value(value).run()
    return at


def budget(at) -> int:
    return int(at.number_input(key="budget_gib").value * 2**30)


def test_fsdp_figures_are_the_per_rank_estimate_of_the_settings_shown():
    at = app()
    at.selectbox(key="preset").set_value("llama-3.2-1b").run()
    layout(at, "fsdp", 4, mp="bf16")
    assert not at.exception and not at.error
    spec, attention = shown(at)
    cfg = prepare(PRESETS["llama-3.2-1b"], spec, attention)
    pspec = ParallelSpec(4, "fsdp", mp_param_dtype="bfloat16")
    est = estimate_distributed(cfg, spec, pspec)
    assert metric(at, "Estimated peak per rank") == fmt_bytes(est.peak_bytes)
    usable = tensor_budget(budget(at), spec.device)
    fewest, _ = fewest_ranks(cfg, spec, pspec, usable)
    assert str(metric(at, f"Fewest devices of {fmt_bytes(usable)}")) == str(fewest or "none")
    best, _ = max_batch_per_rank(cfg, spec, pspec, usable)
    assert str(metric(at, "Largest batch per rank that fits")) == str(best)
    assert any("fsdp x4 reshard mp bfloat16/-" in c.value for c in at.caption)
    assert at.session_state["run_settings"]["parallel"]["mp_param_dtype"] == "bfloat16"
    # More ranks, smaller shards: the per-rank peak falls.
    layout(at, "fsdp", 16)
    assert estimate_distributed(cfg, spec, ParallelSpec(16, "fsdp", mp_param_dtype="bfloat16")).peak_bytes < est.peak_bytes
    assert metric(at, "Estimated peak per rank") == fmt_bytes(
        estimate_distributed(cfg, spec, ParallelSpec(16, "fsdp", mp_param_dtype="bfloat16")).peak_bytes)


def test_fewest_devices_for_a_model_that_does_not_fit_one():
    at = app()
    at.selectbox(key="preset").set_value("llama-3-8b").run()
    at.slider(key="batch").set_value(1).run()
    at.number_input(key="budget_gib").set_value(40.0).run()
    layout(at, "fsdp", 8)
    spec, attention = shown(at)
    cfg = prepare(PRESETS["llama-3-8b"], spec, attention)
    n, why = fewest_ranks(cfg, spec, ParallelSpec(8, "fsdp"), tensor_budget(40 * 2**30, spec.device))
    assert n > 1 and str(metric(at, f"Fewest devices of {fmt_bytes(40 * 2**30)}")) == str(n)
    assert any(why.split(":")[0] in c.value for c in at.caption)
    # DDP replicates: no number of devices fits a model one device cannot hold.
    layout(at, "ddp", 8)
    assert metric(at, f"Fewest devices of {fmt_bytes(40 * 2**30)}") == "none"
    assert any("whole replica" in c.value for c in at.caption)


def test_invalid_layouts_say_why_and_one_device_is_the_default():
    at = app()
    assert at.selectbox(key="parallel").value == "one device" and at.number_input(key="world").disabled
    assert metric(at, "Estimated peak")  # the single-device page
    layout(at, "fsdp", 1)
    assert not at.exception and "at least 2" in at.error[0].value
    layout(at, "fsdp", 2, mp="bf16")
    at.segmented_control(key="precision").set_value("bf16-amp").run()
    assert not at.exception and "needs --precision fp32" in at.error[0].value


def test_a_link_restores_the_layout():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.query_params.update({"model": "gpt2-small", "parallel": "fsdp", "world": "16", "reshard": "false",
                            "batch": "2", "seq": "256"})
    at.run()
    assert not at.exception
    assert (at.selectbox(key="parallel").value, at.number_input(key="world").value, at.toggle(key="reshard").value) \
        == ("fsdp", 16, False)
    spec, attention = shown(at)
    est = estimate_distributed(prepare(PRESETS["gpt2-small"], spec, attention), spec,
                               ParallelSpec(16, "fsdp", reshard_after_forward=False))
    assert metric(at, "Estimated peak per rank") == fmt_bytes(est.peak_bytes)


def test_training_step_runs_the_ranks_and_shows_each_one():
    at = paste(app(), TINY)
    at.slider(key="batch").set_value(2).run()
    at.slider(key="seq").set_value(32).run()
    layout(at, "fsdp", 2)
    at.switch_page("pages/1_training.py").run()
    assert not at.exception and not at.error
    spec = shown_spec = at.session_state["run_settings"]["spec"]
    est = estimate_distributed(config_from_dict(TINY), __import__("planner.spec", fromlist=["TrainSpec"]).TrainSpec(
        **shown_spec), ParallelSpec(2, "fsdp"))
    assert metric(at, "Estimated peak per rank") == fmt_bytes(est.peak_bytes)
    at.button(key="run").click().run()
    job = at.session_state["job"]
    args = " ".join(job.args)
    assert "--world-size 2 --parallel fsdp --reshard-after-forward true" in args and job.config["emb_dim"] == 32
    job.cancel()  # the real ranks are tested through the CLI (tests/test_distributed.py); the page replays one
    at.session_state["job"] = ReplayJob(recorded("measure_train_tiny_fsdp2.jsonl"), "done")
    at.session_state["job_kind"] = "measure"
    at.run()
    assert not at.exception and not at.error
    rec = recorded("measure_train_tiny_fsdp2.jsonl")[-1]
    assert metric(at, "Measured peak (largest rank)") == fmt_bytes(rec["peak_bytes"])
    assert abs(float(metric(at, "Error").rstrip("%"))) <= 2.0
    assert spec["batch_size"] == 2


def test_too_many_ranks_are_not_measured_here_but_can_be_simulated():
    at = app()
    layout(at, "fsdp", 64)
    at.switch_page("pages/1_training.py").run()
    assert not at.exception
    assert any("Not measured here" in w.value for w in at.warning)
    assert at.button(key="run").disabled and not at.button(key="simulate").disabled
