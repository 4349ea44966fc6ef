"""The app as a user drives it (streamlit.testing.v1.AppTest): every page, sliders, bad input, and runs started from
the pages: each page starts its child with the right arguments, then shows and keeps the child's recorded output
(tests/replay.py); the children themselves are tested through the CLI (tests/test_cli.py, tests/test_loading.py)
and end to end in a browser (tests/e2e/test_browser.py)."""
import dataclasses
import json
import time
from pathlib import Path

import psutil
import pytest
from streamlit.testing.v1 import AppTest

from planner.config import PRESETS, config_from_dict
from planner.estimate.offload import host_bytes
from planner.estimate.training import CUDA_CONTEXT_BYTES, estimate_training, optimizer_state_bytes
from planner.finetune import target_choices, tune_fields
from planner.spec import TrainSpec, prepare
from planner.units import fmt_bytes
from tests.replay import ReplayJob, recorded

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
TINY = {"arch": "gpt2", "vocab_size": 300, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 2,
        "drop_rate": 0.1}


pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


def app() -> AppTest:
    return AppTest.from_file(APP, default_timeout=60).run()


def metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def paste(at, config=TINY):
    at.radio(key="source").set_value("Paste a config").run()
    at.text_area(key="config_text").set_value(config if isinstance(config, str) else json.dumps(config)).run()
    return at



def shown(at, cfg=None) -> tuple[TrainSpec, str]:
    """The run settings the Planner page shows, and its attention; with the model (cfg), its fine-tuning
    controls too (the LoRA targets' names are the model's)."""
    tuning = {}
    if cfg is not None:
        tuning = tune_fields(at.selectbox(key="tune").value, last_n=int(at.number_input(key="train_last").value),
                             lora_r=int(at.number_input(key="lora_r").value),
                             lora_targets=target_choices(cfg)[at.selectbox(key="lora_targets").value],
                             quantize=at.selectbox(key="quant").value, double_quant=at.toggle(key="double_quant").value)
    spec = TrainSpec(**{**dict(batch_size=at.slider(key="batch").value, seq_len=at.slider(key="seq").value,
                               precision=at.segmented_control(key="precision").value,
                               optimizer=at.selectbox(key="optimizer").value, checkpointing=at.toggle(key="ckpt").value,
                               grad_accum=int(at.number_input(key="accum").value),
                               optimizer_impl=at.selectbox(key="opt_impl").value,
                               device=at.selectbox(key="device").value, loss=at.selectbox(key="loss").value,
                               checkpoint_policy=at.selectbox(key="ckpt_policy").value
                               if at.toggle(key="ckpt").value else "full",
                               offload_optimizer=at.toggle(key="offload_opt").value),
                       **tuning})
    return spec, at.selectbox(key="attention").value


def assert_figures_follow_what_is_shown(at, cfg):
    """Every figure comes from exactly the settings on the screen (and this model)."""
    assert not at.exception
    spec, attention = shown(at, cfg)
    est = estimate_training(prepare(cfg, spec, attention), spec)
    assert metric(at, "Estimated peak") == fmt_bytes(est.peak_bytes)
    assert metric(at, "Peak phase") == est.peak_phase
    return est


def wait_for(at, key, timeout_s=120):
    """AppTest never ticks run_every fragments: rerun until the job leaves session state."""
    deadline = time.monotonic() + timeout_s
    while key in at.session_state and time.monotonic() < deadline:
        time.sleep(0.5)
        at.run()
    assert key not in at.session_state, "the job did not finish"


def replay(at, key, name):
    """End the child the page just started (its arguments checked by the caller) and let the page take the
    recorded output of the same command instead (tests/replay.py: RECORDED)."""
    at.session_state[key].cancel()
    at.session_state[key] = ReplayJob(recorded(name), "done")


def test_planner_sliders_change_the_numbers():
    at = app()
    assert not at.exception
    before = metric(at, "Estimated peak")
    at.slider(key="batch").set_value(32).run()
    assert not at.exception and metric(at, "Estimated peak") != before
    at.toggle(key="ckpt").set_value(True).run()
    at.segmented_control(key="precision").set_value("bf16-amp").run()
    assert not at.exception and metric(at, "Peak phase") in ("forward", "loss", "backward", "optimizer", "zero_grad")


def test_each_advice_option_applies_exactly_its_own_settings():
    """Labels repeated ("grad-accum" three times) and choosing the second applied the first."""
    at = app()
    at.slider(key="batch").set_value(64).run()
    before = {k: at.session_state[k] for k in ("batch", "seq", "precision", "optimizer", "opt_impl", "accum", "ckpt",
                                               "attention", "tune", "lora_r", "lora_targets", "quant", "double_quant", "loss",
                                               "ckpt_policy", "offload_opt")}
    labels = at.selectbox(key="advice_choice").options
    assert len(set(labels)) == len(labels) and {"grad-accum 2 x batch 32", "grad-accum 4 x batch 16"} <= set(labels)
    table = at.dataframe[0].value.set_index("option")
    for label in labels:
        for key, value in before.items():  # back to the settings the advice was made for
            at.session_state[key] = value
        at.run()
        at.selectbox(key="advice_choice").set_value(label).run()
        at.button(key="apply").click().run()
        est = assert_figures_follow_what_is_shown(at, PRESETS["gpt2-small"])
        assert fmt_bytes(est.peak_bytes) == table.loc[label, "peak"], label
        if "--checkpointing" in label:  # a policy option sets the policy control (issue #24)
            assert at.toggle(key="ckpt").value and label.endswith(f"{at.selectbox(key='ckpt_policy').value})")
        if label.startswith("grad-accum"):
            assert label == f"grad-accum {at.number_input(key='accum').value} x batch {at.slider(key='batch').value}"


def test_offload_advice_shows_the_host_beside_on_a_gpu_and_is_stated_not_ranked_on_the_cpu():
    """Issue #24: on cuda the offloads are ranked by the device peak with a host RAM column beside (this machine's RAM
    named); on the cpu device they are captions saying the host is the same RAM, not options."""
    at = app()
    at.slider(key="batch").set_value(64).run()
    at.selectbox(key="device").set_value("cuda").run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("option")
    hosted = [label for label in table.index if "on the host (--offload-" in label]
    assert len(hosted) == 2 and all(table.loc[label, "host RAM"] for label in hosted)
    spec, attention = shown(at)
    for label in hosted:
        flag, line = (("offload_optimizer", "host_optimizer_offload") if "optimizer" in label
                      else ("offload_activations", "host_activation_offload"))
        est = estimate_training(prepare(PRESETS["gpt2-small"], spec, attention), dataclasses.replace(spec, **{flag: True}))
        assert table.loc[label, "host RAM"] == fmt_bytes(est.transients[line])
        assert table.loc[label, "peak"] == fmt_bytes(est.peak_bytes)
    captions = " ".join(c.value for c in at.caption)
    assert f"this machine has {fmt_bytes(psutil.virtual_memory().total)} of RAM" in captions
    at.selectbox(key="device").set_value("cpu").run()
    assert not at.exception and not [o for o in at.selectbox(key="advice_choice").options if "--offload-" in o]
    assert "host RAM" not in at.dataframe[0].value.columns
    stated = [c.value for c in at.caption if "not ranked on a CPU device" in c.value]
    assert len(stated) == 2 and all("same RAM" in c for c in stated)


def test_a_model_change_takes_the_models_own_attention_as_the_cli_does(capsys):
    """llama-3.2-1b b4 s512 fp32 was 25.30 GiB in the app (eager kept from gpt2), 23.30 GiB from the CLI."""
    from planner.cli.main import main

    at = app()
    assert at.selectbox(key="attention").value == "eager"  # the book's GPT-2
    at.selectbox(key="preset").set_value("llama-3.2-1b").run()
    assert at.selectbox(key="attention").value == "sdpa"
    assert main(["estimate", "train", "--model", "llama-3.2-1b", "--batch-size", "4", "--seq-len", "512", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert metric(at, "Estimated peak") == fmt_bytes(cli["peak_bytes"])
    assert_figures_follow_what_is_shown(at, PRESETS["llama-3.2-1b"])


def test_after_pasting_configs_the_figures_are_those_of_the_settings_shown():
    """The Attention box showed sdpa while the figures were eager's; a slider moved and back changed them."""
    llama = json.loads((ROOT / "tests/data/Llama-3-8B.config.json").read_text())
    at = paste(app(), TINY)
    assert_figures_follow_what_is_shown(at, config_from_dict(TINY))
    at = paste(at, llama)
    assert at.selectbox(key="attention").value == "sdpa"
    first = assert_figures_follow_what_is_shown(at, config_from_dict(llama))
    at.slider(key="batch").set_value(5).run()
    at.slider(key="batch").set_value(4).run()
    assert assert_figures_follow_what_is_shown(at, config_from_dict(llama)).peak_bytes == first.peak_bytes


def test_an_upload_replaces_the_pasted_text_visibly_and_the_newest_input_wins():
    llama = (ROOT / "tests/data/Llama-3-8B.config.json").read_text()
    at = paste(app(), TINY)
    at.file_uploader(key="config_file").set_value(("llama3.json", llama.encode(), "application/json")).run()
    assert at.text_area(key="config_text").value == llama
    assert any("uploaded llama3.json" in c.value for c in at.sidebar.caption)
    assert_figures_follow_what_is_shown(at, config_from_dict(json.loads(llama)))
    at.text_area(key="config_text").set_value(json.dumps(TINY)).run()  # typed after the upload: the text wins
    assert any("edited after uploading llama3.json" in c.value for c in at.sidebar.caption)
    assert_figures_follow_what_is_shown(at, config_from_dict(TINY))


def test_an_invalid_paste_keeps_the_last_model_and_shows_the_error_beside_the_box():
    at = paste(app(), TINY)
    at.text_area(key="config_text").set_value('{"arch": "gpt2", "vocab_size": 10}').run()
    assert not at.main.error and "missing key" in at.sidebar.error[0].value
    assert any("last valid model" in c.value for c in at.sidebar.caption)
    assert_figures_follow_what_is_shown(at, config_from_dict(TINY))


def test_a_link_restores_every_setting_including_the_model():
    """`/?budget_gib=24&batch=1&seq=2048` dropped seq: the model was not in the URL (gpt2's context is 1024)."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update({"model": "llama-3.2-1b", "budget_gib": "24", "batch": "1", "seq": "2048",
                            "precision": "bf16-amp", "opt_impl": "fused", "attention": "eager"})
    at.run()
    assert at.session_state["model_id"] == "llama-3.2-1b" and at.selectbox(key="preset").value == "llama-3.2-1b"
    spec, attention = shown(at)
    assert (spec.batch_size, spec.seq_len, spec.precision, spec.optimizer_impl, attention) == (1, 2048, "bf16-amp",
                                                                                               "fused", "eager")
    assert at.number_input(key="budget_gib").value == 24
    assert_figures_follow_what_is_shown(at, PRESETS["llama-3.2-1b"])
    at.selectbox(key="preset").set_value("gpt2-medium").run()  # and the URL follows the model
    assert at.query_params["model"] == "gpt2-medium" and at.slider(key="seq").value == 1024


def test_budget_default_is_total_ram_and_on_cuda_the_context_is_its_own_line():
    from planner.fit import ALLOCATOR_RESERVE

    at = app()
    default = round(psutil.virtual_memory().total / 2**30, 1)
    assert at.number_input(key="budget_gib").value == default
    assert any("total RAM" in c.value for c in at.caption)
    at.number_input(key="budget_gib").set_value(24.0).run()
    at.selectbox(key="device").set_value("cuda").run()
    # less the context and the allocator's reserve (the worst share of a training peak measured on an H200)
    tensors = int((24 * 2**30 - CUDA_CONTEXT_BYTES) / (1 + ALLOCATOR_RESERVE[False]))
    assert metric(at, "Budget for tensors") == fmt_bytes(tensors)
    assert any("CUDA context" in c.value and "allocator's reserve" in c.value for c in at.caption)
    est = assert_figures_follow_what_is_shown(at, PRESETS["gpt2-small"])
    assert next(m for m in at.metric if m.label == "Estimated peak").delta.endswith(
        fmt_bytes(abs(tensors - est.peak_bytes)))  # the plan search's figures come first (issue #35)


def test_optimizer_implementation_is_a_setting_and_fused_is_advised_when_it_helps():
    at = app()
    at.selectbox(key="preset").set_value("llama-3.2-1b").run()
    for key, value in (("device", "cuda"), ("batch", 1), ("precision", "bf16-amp"), ("budget_gib", 20.0)):
        at.session_state[key] = value
    at.run()
    assert metric(at, "Peak phase") == "optimizer"
    assert "fused optimizer" in at.selectbox(key="advice_choice").options
    at.selectbox(key="opt_impl").set_value("fused").run()
    assert_figures_follow_what_is_shown(at, PRESETS["llama-3.2-1b"])
    assert metric(at, "Peak phase") != "optimizer"


def test_every_term_and_its_formula_is_one_click_away():
    at = app()
    assert len(at.dataframe) == 1  # the advice; the term tables are drawn only when asked for
    at.session_state["terms_open"] = True
    at.run()
    est = assert_figures_follow_what_is_shown(at, PRESETS["gpt2-small"])
    terms = at.dataframe[1].value
    assert list(terms["formula"]) == [t["formula"] for t in est.terms]
    assert dict(zip(at.dataframe[2].value["phase"], at.dataframe[2].value["bytes"]))["backward"] == \
        est.phase_peak_bytes["backward"]


def test_parameter_count_and_formulas_are_shown_as_written():
    at = app()
    sidebar = " ".join(c.value for c in at.sidebar.caption)
    assert "163,037,184 parameters" in sidebar and "124,439,808" in sidebar
    at.slider(key="batch").set_value(1).run()
    at.slider(key="seq").set_value(1024).run()
    for caption in at.main.caption:  # an asterisk is in a code span or escaped, never Markdown emphasis
        text = caption.value.replace("\\*", "")
        assert all(part.count("*") == 0 for part in text.split("`")[::2]), caption.value


def test_bad_config_shows_an_error_not_an_exception():
    at = app()
    at.radio(key="source").set_value("Paste a config").run()
    at.text_area(key="config_text").set_value('{"arch": "gpt2", "vocab_size": 10}').run()
    assert not at.exception and "missing key" in at.sidebar.error[0].value
    at.text_area(key="config_text").set_value("{oops").run()
    assert not at.exception and "not valid JSON" in at.sidebar.error[0].value


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


def test_training_page_stacks_the_estimates_categories():
    """The Training step page draws the estimate's bytes by category, phase by phase (issue #34 item 4), before
    any run: the chart's data are planner.api.category_stack_rows of the page's estimate."""
    at = app()
    at.switch_page("pages/1_training.py").run()
    assert not at.exception
    assert any("What each byte is at each phase's high point" in c.value for c in at.caption)
    (chart,) = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")
                if "Estimated bytes by category" in c.proto.spec]
    bars = chart["layer"][0]
    assert bars["mark"]["type"] == "bar" and bars["encoding"]["y"]["stack"] == "zero"
    assert bars["encoding"]["color"]["field"] == "category" and bars["encoding"]["x"]["field"] == "phase"
    # (the rows, every phase's categories filled: tests/test_charts.py, on the same facade)


def test_training_measurement_completes_and_is_stored(data_dir):
    at = paste(app(), TINY)
    at.slider(key="batch").set_value(2).run()
    at.slider(key="seq").set_value(32).run()
    at.switch_page("pages/1_training.py").run()
    at.button(key="run").click().run()
    assert at.session_state["job"].config["emb_dim"] == TINY["emb_dim"]  # the pasted model survived the switch
    assert " ".join(at.session_state["job"].args).startswith("measure train --batch-size 2 --seq-len 32 ")
    replay(at, "job", "measure_train_tiny.jsonl")
    wait_for(at, "job")
    assert not at.exception and not at.error
    assert abs(float(metric(at, "Error").rstrip("%"))) <= 2.0
    from planner.store import RunStore
    runs = RunStore(data_dir / "data" / "runs.sqlite").list()
    assert len(runs) == 1 and runs[0]["kind"] == "train" and runs[0]["measured_bytes"] > 0
    spec = TrainSpec(**{k: v for k, v in runs[0]["settings"].items() if k != "attention"})
    assert (spec.batch_size, spec.seq_len) == (2, 32) and "pasted gpt2" in runs[0]["model"]
    assert runs[0]["record"]["optimizer_bytes"] == optimizer_state_bytes(config_from_dict(TINY), spec)
    at.switch_page("pages/3_runs.py").run()
    assert not at.exception and metric(at, "Worst |error| over these runs")


def test_measure_this_option_after_moving_sliders_measures_that_option(data_dir):
    """Moving a slider then "Measure this option" raised from st.switch_page (the URL's bound settings)."""
    at = paste(app(), TINY)
    at.slider(key="batch").set_value(8).run()
    at.slider(key="seq").set_value(64).run()
    at.selectbox(key="advice_choice").set_value("grad-accum 4 x batch 2").run()
    at.button(key="measure_option").click().run()
    assert not at.exception and "job" in at.session_state  # on the Training step, started
    job = at.session_state["job"]
    assert job.config["emb_dim"] == TINY["emb_dim"]
    assert " ".join(job.args).count("--batch-size 2 ") == 1 and "--grad-accum 4" in " ".join(job.args)
    assert "--seq-len 64 " in " ".join(job.args)
    replay(at, "job", "measure_train_tiny_accum4.jsonl")
    wait_for(at, "job")
    from planner.store import RunStore
    run = RunStore(data_dir / "data" / "runs.sqlite").list()[0]
    assert (run["settings"]["batch_size"], run["settings"]["grad_accum"], run["settings"]["seq_len"]) == (2, 4, 64)
    assert "pasted gpt2" in run["model"]


def test_training_refuses_what_cannot_fit():
    at = app()  # gpt2-small preset
    at.selectbox(key="preset").set_value("llama-3-8b").run()
    at.slider(key="batch").set_value(64).run()
    at.switch_page("pages/1_training.py").run()
    assert not at.exception and "Not started" in at.error[0].value
    assert at.button(key="run").disabled


def test_loading_measure_all(data_dir):
    at = paste(app(), TINY)
    at.switch_page("pages/2_loading.py").run()
    at.button(key="measure_all").click().run()
    assert at.session_state["load_job"].config["emb_dim"] == TINY["emb_dim"]  # the pasted model, not gpt2-small
    assert at.session_state["load_job"].args[:8] == ["measure", "load", "--method", "all", "--device", "cpu",
                                                     "--dtype", "float32"]
    replay(at, "load_job", "measure_load_all_tiny_fp32.jsonl")
    wait_for(at, "load_job", timeout_s=300)
    assert not at.exception and not at.error
    results = at.session_state["load_result"]["results"]
    assert len(results) == 7 and all(r["file_bytes"] < 2**20 for r in results)  # gpt2-small's is ~650 MB


def test_checkpointing_policy_and_optimizer_offload_controls():
    """Issue #24: the policy control (with checkpointing on) and, on cuda, the optimizer-offload toggle drive the
    figures; the offload's host bytes are a line of their own, not in the peak."""
    at = app()
    at.toggle(key="ckpt").set_value(True).run()
    at.selectbox(key="ckpt_policy").set_value("selective").run()
    spec, _ = shown(at)
    assert spec.checkpoint_policy == "selective"
    assert_figures_follow_what_is_shown(at, PRESETS["gpt2-small"])
    at.selectbox(key="device").set_value("cuda").run()
    at.toggle(key="offload_opt").set_value(True).run()
    spec, _ = shown(at)
    assert spec.offload_optimizer
    est = assert_figures_follow_what_is_shown(at, PRESETS["gpt2-small"])
    assert est.transients["host_optimizer_offload"] > 0
    # on the cpu too: the plain-torch equivalent's device figure and its unpinned host bytes (planner/estimate/
    # offload.py with --device cpu), the host's own line, and both summed as this machine's RAM
    at.selectbox(key="device").set_value("cpu").run()
    spec, _ = shown(at)
    assert spec.offload_optimizer and spec.device == "cpu"
    est = assert_figures_follow_what_is_shown(at, PRESETS["gpt2-small"])
    host = est.transients["host_optimizer_offload"]
    assert host == sum(host_bytes(PRESETS["gpt2-small"], spec).values()) and "pinned_param_and_grad_copies" not in \
        host_bytes(PRESETS["gpt2-small"], spec)
    caption = " ".join(c.value for c in at.caption)
    assert f"Host RAM for the offloaded optimizer (parameter and grad copies, AdamW's states): {fmt_bytes(host)}" in \
        caption and fmt_bytes(est.peak_bytes + host) in caption
    plain = estimate_training(PRESETS["gpt2-small"], dataclasses.replace(spec, offload_optimizer=False,
                                                                         optimizer_impl="fused"))
    assert est.peak_bytes < plain.peak_bytes  # the offloaded states leave the device's figure
    # an optimizer it does not model: the planner's one line, not an exception
    at.selectbox(key="optimizer").set_value("sgd").run()
    assert not at.exception and at.error and "--offload-optimizer is modelled for adam / adamw" in at.error[0].value
