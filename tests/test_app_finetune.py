"""Fine-tuning on the Planner page (issue #12): the fine-tuning mode (full / frozen layers / LoRA / QLoRA) with
its rank and targets gives the CLI's estimate of the same run; the advice offers LoRA, QLoRA and 8-bit AdamW
with what each costs in quality; the Training step page measures the fine-tuning run it is given; the longest
context at each GPU size stands beside Unsloth's published figures, labelled as theirs."""
import dataclasses
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.cli.main import build_parser, parse_train
from planner.config import PRESETS, config_from_dict
from planner.estimate.training import estimate_training
from planner.finetune import TUNE_MODES, tune_fields, tune_mode
from planner.fit import advice, tensor_budget
from planner.plan import longest_context
from planner.reference import UNSLOTH_LLAMA31_8B
from planner.spec import TrainSpec, prepare, run_args
from planner.units import fmt_bytes
from tests.test_app import metric, paste, replay, shown, wait_for

ROOT = Path(__file__).resolve().parent.parent
TINY_LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 160,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256}

pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


def app() -> AppTest:
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=90).run()


def tuned(at) -> TrainSpec:
    """The run the Planner page shows, fine-tuning fields included (the page's own record of it)."""
    return TrainSpec(**at.session_state["run_settings"]["spec"])


@pytest.mark.parametrize("spec", [
    TrainSpec(2, 64),
    TrainSpec(1, 128, "bf16", "sgd", checkpointing=True, train_layers="last:2", loss="labels"),
    TrainSpec(3, 32, lora_r=8, lora_alpha=16.0, lora_dropout=0.1, lora_targets="all-linear", device="cuda"),
    TrainSpec(3, 32, lora_r=4),
    TrainSpec(1, 64, "bf16", "adamw-8bit", checkpointing=True, lora_r=32, lora_targets="all-linear",
              quantize_base="nf4", double_quant=True),
    TrainSpec(1, 64, "bf16", lora_r=8, quantize_base="fp4"),
    TrainSpec(2, 64, checkpointing=True, checkpoint_policy="every:3"),  # issue #24
    TrainSpec(1, 64, "bf16-amp", checkpointing=True, checkpoint_policy="selective", device="cuda",
              offload_optimizer=True),
])
def test_run_args_give_the_cli_the_same_run(spec):
    """What the Training step page passes its child (planner.spec.run_args) parses back to the same TrainSpec."""
    args = build_parser().parse_args(["estimate", "train", "--model", "llama-3.2-1b", *run_args(spec)])
    assert parse_train(args)[1] == spec


def test_tune_fields_and_tune_mode_are_inverse():
    for mode in TUNE_MODES:
        fields = tune_fields(mode, last_n=2, lora_r=8, lora_targets="all-linear")
        assert tune_mode(TrainSpec(1, 8, **fields)) == mode
    assert tune_fields("freeze", last_n=0) == {"train_layers": "head"}


def test_lora_mode_gives_the_estimate_of_that_run():
    at = paste(app(), TINY_LLAMA)
    full = metric(at, "Estimated peak")
    at.selectbox(key="tune").set_value("lora").run()
    at.number_input(key="lora_r").set_value(8).run()
    at.selectbox(key="lora_targets").set_value("all-linear").run()
    assert not at.exception and not at.error
    spec = tuned(at)
    assert (spec.lora_r, spec.lora_targets) == (8, "all-linear")
    base, attention = shown(at)
    assert dataclasses.replace(spec, lora_r=0, lora_targets="") == base
    cfg = prepare(config_from_dict(TINY_LLAMA), spec, attention)
    assert metric(at, "Estimated peak") == fmt_bytes(estimate_training(cfg, spec).peak_bytes) != full
    assert any("LoRA r=8 on" in c.value for c in at.caption)  # the estimate's note: what trains
    # frozen layers: the last block and the head train
    at.selectbox(key="tune").set_value("freeze").run()
    spec = tuned(at)
    assert spec.train_layers == "last:1" and not spec.lora_r
    assert metric(at, "Estimated peak") == fmt_bytes(estimate_training(prepare(config_from_dict(TINY_LLAMA), spec,
                                                                               attention), spec).peak_bytes)


def test_the_books_gpt2_offers_its_own_linear_layers_and_a_family_without_lora_terms_says_so():
    at = app()  # the book's GPT-2: peft has no default targets for it, so the attention projections come first
    at.selectbox(key="tune").set_value("lora").run()
    assert not at.exception and not at.error
    assert at.selectbox(key="lora_targets").options == ["attention", "all-linear"]
    assert tuned(at).lora_targets == "W_query,W_key,W_value,out_proj"
    at.selectbox(key="preset").set_value("phi-3-mini-4k").run()  # fused qkv_proj: peft maps no default targets
    assert not at.exception and not at.error
    assert at.selectbox(key="lora_targets").options == ["attention", "all-linear"]
    at.selectbox(key="preset").set_value("hf-gpt2").run()  # transformers' GPT-2 (Conv1D): no LoRA terms yet
    assert not at.exception and at.error and "LoRA" in at.error[0].value


def test_advice_offers_lora_and_says_what_it_costs():
    cfg, spec = PRESETS["llama-3-8b"], TrainSpec(1, 2048, "bf16", "adamw", device="cuda")
    options = {o.changes[0]: o for o in advice(prepare(cfg, spec), spec, tensor_budget(40 * 2**30, "cuda"))
               if len(o.changes) == 1}
    lora = options["lora"]
    assert lora.spec["lora_r"] == 16 and lora.spec["lora_targets"] == "all-linear"
    assert "LoRA Learns Less and Forgets Less" in lora.cost
    assert lora.peak_bytes == estimate_training(cfg, TrainSpec(**lora.spec)).peak_bytes < estimate_training(
        cfg, spec).peak_bytes
    eight = options["adamw-8bit"]  # bitsandbytes AdamW8bit: two uint8 states instead of two bf16 ones
    assert eight.spec["optimizer"] == "adamw-8bit" and "Block-wise Quantization" in eight.cost
    assert eight.peak_bytes == estimate_training(cfg, TrainSpec(**eight.spec)).peak_bytes < estimate_training(
        cfg, spec).peak_bytes


def test_applying_lora_advice_sets_the_fine_tuning_controls():
    at = app()
    at.selectbox(key="preset").set_value("llama-3.2-1b").run()
    at.slider(key="seq").set_value(512).run()
    label = next(o for o in at.selectbox(key="advice_choice").options if o.startswith("LoRA r=16"))
    at.selectbox(key="advice_choice").set_value(label).run()
    at.button(key="apply").click().run()
    assert not at.exception and not at.error
    assert at.selectbox(key="tune").value == "lora" and at.selectbox(key="lora_targets").value == "all-linear"
    assert tuned(at).lora_r == 16


def test_the_training_step_measures_the_lora_run_it_is_given(data_dir):
    """The page passes --lora-* to `measure train`, and the stored run is that LoRA run (the child's recorded
    output, tests/replay.py; the LoRA child itself is tested in tests/test_finetune.py)."""
    at = paste(app(), TINY_LLAMA)
    at.slider(key="batch").set_value(2).run()
    at.slider(key="seq").set_value(32).run()
    at.selectbox(key="tune").set_value("lora").run()
    at.number_input(key="lora_r").set_value(4).run()
    spec = tuned(at)
    at.switch_page("pages/1_training.py").run()
    assert not at.exception and not at.error
    assert any("LoRA r=4" in m.value for m in at.markdown)
    at.button(key="run").click().run()
    assert "--lora-r 4" in " ".join(at.session_state["job"].args)
    assert " ".join(at.session_state["job"].args).startswith(
        "measure train --batch-size 2 --seq-len 32 --precision fp32 --optimizer adamw --grad-accum 1 "
        "--optimizer-impl default --device cpu --loss default --lora-r 4 --lora-alpha 8.0 --lora-dropout 0.0 "
        "--lora-targets q_proj,k_proj,v_proj,o_proj --json")  # the command of the recording replayed here
    replay(at, "job", "measure_train_tiny_llama_lora4.jsonl")
    wait_for(at, "job")
    assert not at.exception and not at.error
    assert abs(float(metric(at, "Error").rstrip("%"))) <= 1.0
    from planner.store import RunStore

    run = RunStore(data_dir / "data" / "runs.sqlite").list()[0]
    assert TrainSpec(**{k: v for k, v in run["settings"].items() if k != "attention"}) == spec


def test_longest_context_beside_unsloth_is_ours_and_labelled_theirs():
    at = app()
    at.selectbox(key="preset").set_value("llama-3.1-8b").run()
    at.selectbox(key="device").set_value("cuda").run()
    at.slider(key="batch").set_value(1).run()
    at.toggle(key="ckpt").set_value(True).run()
    at.selectbox(key="tune").set_value("lora").run()
    at.number_input(key="lora_r").set_value(32).run()
    at.selectbox(key="lora_targets").set_value("all-linear").run()
    at.expander(key="published_open").open = True  # what a click does: the table is drawn while open
    at.session_state["published_open"] = True
    at.run()
    assert not at.exception and not at.error
    spec, attention = tuned(at), at.selectbox(key="attention").value
    ours = longest_context(prepare(PRESETS["llama-3.1-8b"], spec, attention), spec, UNSLOTH_LLAMA31_8B)
    table = next(df.value for df in at.dataframe if "Unsloth (theirs)" in df.value.columns)
    assert list(table["GPU (GiB)"]) == [8, 12, 16, 24, 40, 48, 80]
    assert list(table["Unsloth (theirs)"])[:4] == ["2,972", "21,848", "40,724", "78,475"]
    assert list(table["Hugging Face + FA2 (theirs)"])[0] == "OOM"
    assert list(table.iloc[:, 1]) == [f"{r['this estimate']:,}" for r in ours]
    assert any("not measurements of ours" in c.value for c in at.caption)


def test_qlora_mode_computes_in_bf16_and_gives_the_estimate_of_that_run():
    at = paste(app(), TINY_LLAMA)
    lora = None
    for mode in ("lora", "qlora"):
        at.selectbox(key="tune").set_value(mode).run()
        at.number_input(key="lora_r").set_value(8).run()
        assert not at.exception and not at.error
        spec = tuned(at)
        if mode == "lora":
            lora = metric(at, "Estimated peak")
            continue
        assert (spec.quantize_base, spec.double_quant, spec.precision) == ("nf4", True, "bf16")
        assert at.segmented_control(key="precision").value == "bf16" and at.segmented_control(key="precision").disabled
        cfg = prepare(config_from_dict(TINY_LLAMA), spec, at.selectbox(key="attention").value)
        assert metric(at, "Estimated peak") == fmt_bytes(estimate_training(cfg, spec).peak_bytes) != lora
    at.selectbox(key="quant").set_value("fp4").run()
    at.toggle(key="double_quant").set_value(False).run()
    assert (tuned(at).quantize_base, tuned(at).double_quant) == ("fp4", False)


def test_advice_offers_qlora_in_bf16():
    cfg, spec = PRESETS["llama-3-8b"], TrainSpec(1, 2048, "bf16", "adamw", device="cuda", checkpointing=True,
                                                 lora_r=32, lora_targets="all-linear")
    qlora = next(o for o in advice(prepare(cfg, spec), spec, tensor_budget(16 * 2**30, "cuda")) if o.changes == ["qlora"])
    assert (qlora.spec["quantize_base"], qlora.spec["precision"], qlora.spec["lora_r"]) == ("nf4", "bf16", 32)
    assert qlora.fits and "QLoRA, Dettmers et al. 2023" in qlora.cost
    assert qlora.peak_bytes == estimate_training(cfg, TrainSpec(**qlora.spec)).peak_bytes


def test_bench_longest_context_writes_ours_beside_theirs(tmp_path):
    """docs/finetune.md's table: this estimate's longest QLoRA context per GPU size, and Unsloth's figures labelled
    as published."""
    from planner.cli.main import main

    out = tmp_path / "finetune.md"
    assert main(["bench", "longest-context", "--out", str(out)]) == 0
    text = out.read_text()
    spec = TrainSpec(1, 1, "bf16", device="cuda", checkpointing=True, lora_r=32, lora_targets="all-linear",
                     quantize_base="nf4", double_quant=True)
    ours = longest_context(prepare(PRESETS["llama-3.1-8b"], spec, "sdpa"), spec, UNSLOTH_LLAMA31_8B)
    row24 = next(line for line in text.splitlines() if line.startswith("| 24 |"))
    assert row24.split(" | ")[1] == f"{ours[3]['this estimate']:,}" and "78,475" in row24 and "5,789" in row24
    assert "Unsloth (published)" in text and "not measurements of ours" in text
