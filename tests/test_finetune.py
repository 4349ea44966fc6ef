"""Fine-tuning (issue #12): trainable subsets and peft LoRA, estimated from the config and measured on
transformers' models wrapped by peft, within 1%; simulate equals measure; the CLI's fine-tuning flags."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.main import finetune_gap, finetune_grid, run_accuracy
from planner.config import ConfigError, config_from_dict
from planner.estimate.training import estimate_training
from planner.spec import TrainSpec, prepare

ROOT = Path(__file__).resolve().parent.parent
FINETUNE_BAR_PCT = 1.0  # issue #12: fine-tuning (trainable subsets, LoRA) within 1% of the measured step
FINETUNE_QUANT_BAR_PCT = 2.0  # issue #12: QLoRA (a bitsandbytes-quantized base) within 2% of the measured step
# a documented gap (planner/estimate/finetune.py known_gap) is held to this looser bar (none is named now)
FINETUNE_GAP_BAR_PCT = 6.0
TINY = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}


def test_finetune_quick_grid_within_1pct():
    """Rows of `bench finetune`'s quick grid (every 23rd row of the grid; here the first four of every eight of
    those, 20 of 36: the quick grid cycles precision x checkpointing with period 4, so these keep every pair)
    across llama, qwen2, mistral, qwen3, gemma, gemma2; last:1, head, LoRA r=4/16 on attention and on all linear
    layers, r=8 on the MLP, dropout 0 and 0.1, two micro-batches, fp32 and a bf16 base, checkpointing off/on,
    AdamW/SGD; measured in this process: every estimate within 1% of the exact peak. (All 816 rows of the grid
    are re-estimated against their recorded measurements on every run: tests/test_recorded.py.)"""
    from bench.main import FINETUNE_FAMILIES

    # (the families measured later, FINETUNE_WALKED_FAMILIES, have their own tests: test_phi3_finetuning_within_1pct)
    rows = [row for i, row in enumerate(finetune_grid(quick=True, families_=FINETUNE_FAMILIES)) if i % 8 < 4]
    assert {(spec.precision, spec.checkpointing) for _, _, spec in rows} == {
        ("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)}
    assert {cfg.arch for _, cfg, _ in rows} == {"llama", "qwen2", "mistral", "qwen3", "gemma", "gemma2"}
    assert {spec.optimizer for _, _, spec in rows} == {"adamw", "sgd"}
    assert any(spec.grad_accum > 1 for _, _, spec in rows) and any(spec.lora_dropout for _, _, spec in rows)
    assert any(spec.lora_r for _, _, spec in rows) and any(spec.train_layers != "all" for _, _, spec in rows)
    results = run_accuracy(rows, in_process=True, progress=lambda *_: None)
    gaps = [finetune_gap(row) is not None for row in rows]
    modelled = [r for r, g in zip(results, gaps) if not g]
    assert len(modelled) >= 20
    worst = max(modelled, key=lambda r: abs(r["error_pct"]))
    assert abs(worst["error_pct"]) <= FINETUNE_BAR_PCT, worst
    # the documented gap (planner/estimate/finetune.py known_gap) is held to its own, looser bar
    for r, g in zip(results, gaps):
        if g:
            assert abs(r["error_pct"]) <= FINETUNE_GAP_BAR_PCT, r


@pytest.mark.parametrize("kw", [dict(train_layers="last:1"), dict(train_layers="head"), dict(lora_r=4),
                                dict(lora_r=16, lora_targets="all-linear", lora_dropout=0.1)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_grads_and_optimizer_state_are_the_trainable_parameters(kw, precision):
    """Grads and AdamW state exist for what trains only: the estimate's bytes equal the real model's
    trainable parameters (LoRA: r*(in + out) per adapted linear, fp32 on a bf16 base)."""
    from planner.routines.training import TrainingStep

    cfg = config_from_dict(TINY)
    spec = TrainSpec(2, 8, precision, "adamw", **kw)
    step = TrainingStep(prepare(cfg, spec), spec)
    step.run()
    trainable = [p for p in step.model.parameters() if p.requires_grad]
    est = estimate_training(cfg, spec)
    assert est.grads_bytes == sum(p.numel() * p.element_size() for p in trainable)
    assert est.optimizer_bytes == step.optimizer_state_bytes()
    if kw.get("lora_r"):
        assert all(p.dtype.is_floating_point and p.element_size() == 4 for p in trainable)
        r, h, f, kv = kw["lora_r"], 64, 160, 2 * 16  # k/v projections: 2 heads of 16
        q_v = r * (h + h) + r * (h + kv)  # r*(in + out) for q_proj and v_proj (peft's default targets)
        per_block = q_v if "lora_targets" not in kw else q_v + r * (h + kv) + r * (h + h) + 3 * r * (h + f)
        assert sum(p.numel() for p in trainable) == 2 * per_block  # 2 blocks


@pytest.mark.parametrize("kw", [dict(precision="bf16", lora_r=4, lora_targets="all-linear", lora_dropout=0.1),
                                dict(precision="fp32", lora_r=16, checkpointing=True, optimizer="sgd")])
def test_simulate_equals_measure_on_lora_rows(kw):
    """peft's adapters on a fake-tensor model (planner/measure/simulate.py): the simulated step equals the real one,
    to the byte, phase by phase."""
    from planner.measure.training import measure_training
    from planner.measure.simulate import simulate_training

    cfg = config_from_dict({**TINY, "model_type": "qwen2"})
    spec = TrainSpec(2, 32, **kw)
    cfg = prepare(cfg, spec)
    sim, meas = simulate_training(cfg, spec), measure_training(cfg, spec)
    assert sim["peak_bytes"] == meas["peak_bytes"]
    assert sim["phase_peak_bytes"] == meas["phase_peak_bytes"]


def test_frozen_prefix_saves_nothing_and_lora_saves_its_inputs():
    """What needs grad decides the saved set: training only the head saves no block tensor; LoRA with
    dropout saves more than without (the dropout's output and noise per adapter)."""
    cfg = config_from_dict(TINY)
    head = estimate_training(cfg, TrainSpec(2, 64, train_layers="head"))
    assert not any("input norm" in t["name"] or "SDPA" in t["name"] for t in head.terms)
    plain = estimate_training(cfg, TrainSpec(2, 64, lora_r=4, lora_targets="all-linear"))
    dropout = estimate_training(cfg, TrainSpec(2, 64, lora_r=4, lora_targets="all-linear", lora_dropout=0.1))
    assert dropout.activations_bytes > plain.activations_bytes


@pytest.mark.parametrize("args, message", [
    (["--lora-r", "0"], "--lora-r must be positive, got 0"),
    (["--lora-r", "-4"], "--lora-r must be positive"),
    (["--lora-r", "4", "--lora-targets", "q_proj,qkv"],
     "qkv not in the model; its linear layers: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head"),
    (["--lora-targets", "q_proj"], "need --lora-r"),
    (["--train-layers", "last:0"], "train_layers must be all, head or last:N"),
    (["--train-layers", "last:3"], "the model has 2 blocks"),
    (["--lora-r", "4", "--train-layers", "last:1"], "not both"),
    (["--lora-r", "4", "--precision", "bf16-amp", "--optimizer", "adamw-8bit"], "not modelled yet"),
])
def test_cli_refuses_invalid_finetuning_with_one_line(tmp_path, args, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(TINY))
    out = subprocess.run([sys.executable, "-m", "planner", "estimate", "train", "--config", str(path), "--batch-size",
                          "2", "--seq-len", "16", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr


def test_cli_estimate_and_measure_lora_agree(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**TINY, "model_type": "qwen2"}))
    args = ["--config", str(path), "--batch-size", "2", "--seq-len", "32", "--lora-r", "8", "--lora-targets",
            "all-linear", "--lora-dropout", "0.1", "--precision", "bf16", "--json"]
    est = subprocess.run([sys.executable, "-m", "planner", "estimate", "train", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert est.returncode == 0, est.stderr
    rec = json.loads(est.stdout)
    assert rec["run"]["lora_r"] == 8 and rec["run"]["lora_targets"] == "all-linear"
    meas = subprocess.run([sys.executable, "-m", "planner", "measure", "train", *args, "--device", "cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert meas.returncode == 0, meas.stderr
    m = json.loads(meas.stdout)
    assert m["estimate"]["peak_bytes"] == rec["peak_bytes"]
    assert abs(m["error_pct"]) <= FINETUNE_BAR_PCT


def test_head_of_a_tied_model_is_refused():
    cfg = config_from_dict({**TINY, "tie_word_embeddings": True})
    with pytest.raises(ConfigError, match="tied to the input embedding"):
        prepare(cfg, TrainSpec(2, 16, train_layers="head"))


def test_finetune_estimate_imports_neither_torch_transformers_nor_peft():
    code = ("import sys\n"
            "from planner.config import config_from_dict\n"
            "from planner.estimate.training import estimate_training\n"
            "from planner.spec import TrainSpec, prepare\n"
            f"cfg = config_from_dict({TINY!r})\n"
            "for kw in (dict(train_layers='last:1'), dict(lora_r=4, lora_targets='all-linear', lora_dropout=0.1)):\n"
            "    spec = TrainSpec(2, 64, 'bf16', checkpointing=True, **kw)\n"
            "    estimate_training(prepare(cfg, spec), spec)\n"
            "assert not {'torch', 'transformers', 'peft'} & set(sys.modules), 'imported'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_fit_offers_only_what_the_finetuning_estimate_models(tmp_path):
    """fit's advice for a LoRA run offers autocast (modelled for fine-tuning since issue #19: fp32 master
    weights, so the grid's LoRA row keeps its adapters) and gradient accumulation, and keeps the LoRA rank."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(TINY))
    out = subprocess.run([sys.executable, "-m", "planner", "fit", "--config", str(path), "--seq-len", "64",
                          "--batch-size", "8", "--lora-r", "4", "--budget", "3MB", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["advice"] and all(o["spec"]["precision"] in ("fp32", "bf16", "bf16-amp", "fp16-amp")
                                 and o["spec"]["lora_r"] == 4 for o in rec["advice"])
    assert any(o["spec"]["precision"].endswith("-amp") for o in rec["advice"])
    assert any("grad-accum" in o["changes"] for o in rec["advice"])


# QLoRA (issue #12 item 3): peft's recipe on a bitsandbytes-quantized base (planner/routines/quantized.py,
# planner/estimate/quantized.py). The full grid is `python -m planner bench finetune`'s QLoRA section.
QWEN = {**TINY, "model_type": "qwen2"}  # q/k/v biases: cast to the compute dtype by Linear4bit.forward


def test_qlora_quick_rows_within_2pct():
    """Llama's rows of the QLoRA grid, every 5th (nf4 / fp4, double quantization, LoRA on q,v / q,k,v,o /
    all linear layers, dropout 0 and 0.1, checkpointing off/on, AdamW/SGD, one shape whose peak is a
    dequantized weight in the backward), measured in this process: every estimate within 2%."""
    from bench.main import finetune_qlora_grid

    rows = finetune_qlora_grid(quick=True, families_=("llama",))
    assert {spec.checkpointing for _, _, spec in rows} == {False, True}
    assert {spec.quantize_base for _, _, spec in rows} >= {"nf4"} and any("h128 f512" in r[0] for r in rows)
    results = run_accuracy(rows, in_process=True, progress=lambda *_: None)
    worst = max(results, key=lambda r: abs(r["error_pct"]))
    assert abs(worst["error_pct"]) <= FINETUNE_QUANT_BAR_PCT, worst


@pytest.mark.parametrize("kw", [dict(quantize_base="nf4"), dict(quantize_base="nf4", double_quant=True),
                                dict(quantize_base="fp4", lora_targets="all-linear")])
def test_qlora_weights_are_the_packed_weights_and_their_statistics(kw):
    """The estimate's weights equal the real model's after a step: every parameter's storage (Params4bit's
    packed uint8, fp32 norms / embeddings / head from prepare_model_for_kbit_training, bf16 biases, fp32
    adapters) plus bitsandbytes' QuantState tensors (absmax, code, and nested absmax / code / offset)."""
    from planner.routines.quantized import quant_state_tensors
    from planner.routines.training import TrainingStep

    cfg = config_from_dict(QWEN)
    spec = TrainSpec(2, 8, "bf16", lora_r=4, **kw)
    step = TrainingStep(prepare(cfg, spec), spec)
    step.run()
    real = (sum(p.untyped_storage().nbytes() for p in step.model.parameters())
            + sum(t.untyped_storage().nbytes() for t in quant_state_tensors(step.model)))
    assert type(step.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"
    assert estimate_training(cfg, spec).params_bytes == real


def test_simulate_equals_measure_on_qlora():
    """The simulated QLoRA step (bitsandbytes' ops have fake kernels; the packed weight is quantized on a fake
    tensor, see planner/routines/quantized.py _quantize_fake_model) equals the real one, phase by phase."""
    from planner.measure.training import measure_training
    from planner.measure.simulate import simulate_training

    spec = TrainSpec(2, 16, "bf16", lora_r=4, lora_targets="all-linear", lora_dropout=0.1, checkpointing=True,
                     quantize_base="nf4", double_quant=True)
    cfg = prepare(config_from_dict(QWEN), spec)
    sim, meas = simulate_training(cfg, spec), measure_training(cfg, spec)
    assert sim["persistent_bytes"] == meas["persistent_bytes"]
    assert sim["phase_peak_bytes"] == meas["phase_peak_bytes"] and sim["peak_bytes"] == meas["peak_bytes"]


@pytest.mark.parametrize("args, message", [
    (["--quantize-base", "nf4"], "--quantize-base nf4 needs --lora-r R: quantized weights cannot train"),
    (["--quantize-base", "nf4", "--train-layers", "last:1"], "needs --lora-r"),
    (["--quantize-base", "fp4", "--lora-r", "4", "--precision", "fp32"], "computes in bf16"),
    (["--double-quant", "--lora-r", "4"], "--double-quant needs --quantize-base nf4|fp4"),
    (["--quantize-base", "int8", "--lora-r", "4", "--double-quant"], "applies to 4-bit bases"),
    (["--quantize-base", "int8", "--lora-r", "4"], "int8 is not estimated yet"),
    (["--quantize-base", "q3", "--lora-r", "4"], "invalid choice"),
])
def test_cli_refuses_invalid_qlora_with_one_line(tmp_path, args, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(TINY))
    out = subprocess.run([sys.executable, "-m", "planner", "estimate", "train", "--config", str(path), "--batch-size",
                          "2", "--seq-len", "16", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert message in out.stderr, out.stderr
    if "invalid choice" not in message:  # argparse's own refusal prints its usage first
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_cli_qlora_flags_imply_bf16(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(TINY))
    out = subprocess.run([sys.executable, "-m", "planner", "estimate", "train", "--config", str(path), "--batch-size",
                          "2", "--seq-len", "16", "--lora-r", "4", "--quantize-base", "nf4", "--double-quant", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["run"]["precision"] == "bf16" and rec["run"]["quantize_base"] == "nf4" and rec["run"]["double_quant"]
    plain = subprocess.run([sys.executable, "-m", "planner", "estimate", "train", "--config", str(path), "--batch-size",
                            "2", "--seq-len", "16", "--lora-r", "4", "--json"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert json.loads(plain.stdout)["run"]["precision"] == "fp32"  # the default without --quantize-base
    assert rec["params_bytes"] < json.loads(plain.stdout)["params_bytes"]


def test_qlora_without_bitsandbytes_measure_exits_2_estimate_runs(tmp_path, monkeypatch, capsys):
    """Only the measuring (or simulating) child needs bitsandbytes: without it `measure` refuses with one line
    before starting a child, and the estimate still answers (the import check is monkeypatched)."""
    import planner.bnb
    from planner.cli.main import main

    monkeypatch.setattr(planner.bnb, "bnb_available", lambda: False)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(TINY))
    run = ["--config", str(path), "--batch-size", "2", "--seq-len", "16", "--lora-r", "4", "--quantize-base", "nf4"]
    for command in (["measure", "train", *run, "--device", "cpu"], ["simulate", "train", *run]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs bitsandbytes" in err[0], err
    assert main(["estimate", "train", *run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["quantize_base"] == "nf4"


def test_qlora_estimate_imports_no_torch_nor_bitsandbytes():
    code = ("import sys, time\n"
            "from planner.config import PRESETS\n"
            "from planner.estimate.training import estimate_training\n"
            "from planner.spec import TrainSpec, prepare\n"
            "cfg = PRESETS['llama-3-8b']\n"
            "t = time.perf_counter()\n"
            "for s in (2048, 8192):\n"
            "    spec = TrainSpec(1, s, 'bf16', checkpointing=True, lora_r=32, lora_targets='all-linear',\n"
            "                     quantize_base='nf4')\n"
            "    estimate_training(prepare(cfg, spec), spec)\n"
            "assert time.perf_counter() - t < 2.0, time.perf_counter() - t\n"
            "assert not {'torch', 'transformers', 'peft', 'bitsandbytes'} & set(sys.modules), 'imported'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------- the book's GPT-2 (issue #12 item 2)

BOOK_TINY = {"arch": "gpt2", "vocab_size": 97, "context_length": 32, "emb_dim": 96, "n_heads": 3, "n_layers": 2,
             "drop_rate": 0.1, "qkv_bias": True}


def test_book_gpt2_quick_grid_within_1pct():
    """Rows of `bench finetune --family gpt2`'s quick grid (every 7th row; here the first three of every six of
    those, 12 of 21: every precision x checkpointing pair) — last:1, head, LoRA r=4 on W_query,W_value and r=16
    all-linear, lora_dropout 0 / 0.1, drop_rate 0 / 0.1, qkv_bias off/on, fp32 / a bf16 base, checkpointing
    off/on, AdamW / SGD — measured in this process on the book's GPTModel wrapped by peft: every estimate within
    1%. (All 144 rows are re-estimated against their recorded measurements on every run: tests/test_recorded.py.)"""
    from bench.main import finetune_book_grid

    rows = [row for i, row in enumerate(finetune_book_grid(quick=True)) if i % 6 < 3]
    assert {(spec.precision, spec.checkpointing) for _, _, spec in rows} == {
        ("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)}
    assert {spec.optimizer for _, _, spec in rows} == {"adamw", "sgd"}
    assert any(cfg.drop_rate for _, cfg, _ in rows) and any(cfg.qkv_bias for _, cfg, _ in rows)
    assert any(spec.lora_dropout for _, _, spec in rows)
    assert any(spec.lora_r for _, _, spec in rows) and any(spec.train_layers != "all" for _, _, spec in rows)
    results = run_accuracy(rows, in_process=True, progress=lambda *_: None)
    assert len(results) == len(rows) == 12
    worst = max(results, key=lambda r: abs(r["error_pct"]))
    assert abs(worst["error_pct"]) <= FINETUNE_BAR_PCT, worst


def test_book_gpt2_lora_targets_and_trainable_bytes():
    """peft on the book's nn.Module: all-linear is every Linear but out_head (the FeedForward's Sequential
    children by "layers.0"/"layers.2", not the bare index that would also name a block); the estimate's
    grads and AdamW state equal the real trainable parameters (fp32 adapters on a bf16 base)."""
    from planner.finetune import lora_target_names
    from planner.arch import family_of
    from planner.routines.training import TrainingStep

    cfg = config_from_dict(BOOK_TINY)
    spec = TrainSpec(2, 8, "bf16", "adamw", lora_r=4, lora_targets="all-linear", lora_dropout=0.1)
    assert lora_target_names(family_of(cfg), cfg, spec) == ("W_query", "W_key", "W_value", "out_proj", "layers.0",
                                                            "layers.2")
    step = TrainingStep(prepare(cfg, spec), spec)
    step.run()
    adapted = {n.rsplit(".lora_", 1)[0] for n, p in step.model.named_parameters() if p.requires_grad}
    assert len(adapted) == 2 * 6 and not any("out_head" in n for n in adapted)
    trainable = [p for p in step.model.parameters() if p.requires_grad]
    est = estimate_training(cfg, spec)
    assert est.grads_bytes == sum(p.numel() * p.element_size() for p in trainable)
    assert est.optimizer_bytes == step.optimizer_state_bytes()


def test_book_gpt2_simulate_equals_measure_on_a_lora_row():
    from planner.measure.training import measure_training
    from planner.measure.simulate import simulate_training

    cfg = config_from_dict(BOOK_TINY)
    spec = TrainSpec(2, 16, "fp32", "adamw", lora_r=4, lora_targets="W_query,W_value", lora_dropout=0.1,
                     checkpointing=True)
    cfg = prepare(cfg, spec)
    sim, meas = simulate_training(cfg, spec), measure_training(cfg, spec)
    assert sim["peak_bytes"] == meas["peak_bytes"]
    assert sim["phase_peak_bytes"] == meas["phase_peak_bytes"]


def test_cli_book_gpt2_lora():
    """`estimate train --model gpt2-small --lora-r 8 --lora-targets W_query,W_value` works; an unknown target,
    or no target (peft has no default for a custom module), exits 2 with one line naming the Linears."""
    base = [sys.executable, "-m", "planner", "estimate", "train", "--model", "gpt2-small", "--batch-size", "2",
            "--seq-len", "128", "--lora-r", "8"]
    ok = subprocess.run(base + ["--lora-targets", "W_query,W_value", "--json"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    rec = json.loads(ok.stdout)
    assert rec["run"]["lora_targets"] == "W_query,W_value" and rec["grads_bytes"] == 12 * 2 * 8 * (768 + 768) * 4
    names = "W_query, W_key, W_value, out_proj, layers.0, layers.2, out_head"
    for extra, message in ((["--lora-targets", "W_query,c_attn"], f"c_attn not in the model; its linear layers: {names}"),
                           ([], f"peft has no default LoRA targets for gpt2; give --lora-targets (its linear layers: {names})")):
        out = subprocess.run(base + extra, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2
        assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr


@pytest.mark.parametrize("args, message", [
    (["--lora-r", "4", "--lora-targets", "W_value", "--precision", "bf16-amp"], "under autocast"),
    (["--train-layers", "head", "--attention", "sdpa"], "not sdpa"),
])
def test_cli_book_gpt2_refuses_what_is_not_modelled(args, message):
    out = subprocess.run([sys.executable, "-m", "planner", "estimate", "train", "--model", "gpt2-small", "--batch-size",
                          "2", "--seq-len", "64", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr


def test_book_gpt2_finetune_estimate_imports_neither_torch_nor_peft():
    code = ("import sys\n"
            "from planner.config import config_from_dict\n"
            "from planner.estimate.training import estimate_training\n"
            "from planner.spec import TrainSpec, prepare\n"
            f"cfg = config_from_dict({BOOK_TINY!r})\n"
            "for kw in (dict(train_layers='last:1'), dict(lora_r=4, lora_targets='all-linear', lora_dropout=0.1)):\n"
            "    spec = TrainSpec(2, 16, 'bf16', checkpointing=True, **kw)\n"
            "    estimate_training(prepare(cfg, spec), spec)\n"
            "assert not {'torch', 'transformers', 'peft'} & set(sys.modules), 'imported'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("precision, targets, dropout", [
    ("bf16", "gate_proj,up_proj,down_proj", 0.0), ("bf16", "all-linear", 0.1), ("fp32", "down_proj", 0.0)])
def test_recompute_with_mlp_adapters_within_1pct(precision, targets, dropout):
    """Checkpointing with LoRA on the MLP: the block's recompute (planner/estimate/finetune.py recompute_points)
    decides the peak of the small-vocabulary config (V97, b4 s8); the down adapter's split grads on a bf16
    base (the grad * scaling in fp32 and the base layer's cast grad) were the documented gap (-1.8%)."""
    from planner.estimate.finetune import known_gap

    cfg = config_from_dict({**TINY, "vocab_size": 97, "hidden_size": 96, "intermediate_size": 256,
                            "num_attention_heads": 3, "num_key_value_heads": 1})
    spec = TrainSpec(4, 8, precision, "adamw", checkpointing=True, lora_r=4, lora_targets=targets,
                     lora_dropout=dropout)
    assert known_gap(cfg, spec) is None
    (r,) = run_accuracy([("recompute", cfg, spec)], in_process=True, progress=lambda *_: None)
    est = estimate_training(prepare(cfg, spec), spec)
    assert any("recompute" in k for k in est.backward_points)
    assert abs(r["error_pct"]) <= FINETUNE_BAR_PCT, r


@pytest.mark.parametrize("kw", [dict(train_layers="last:1", precision="bf16"),
                                dict(lora_r=8, lora_targets="all-linear", checkpointing=True),
                                dict(lora_r=4, lora_targets="all-linear", lora_dropout=0.1, precision="bf16")])
def test_gradient_accumulation_within_1pct(kw):
    """grad_accum=2: the second micro-batch's forward, loss and backward run with the first one's
    trainable grads alive, and AccumulateGrad adds the new ones in place (estimate_finetune's `accum`
    and _sweep(grads_exist=True)); the estimate is above the single micro-batch's and within 1%."""
    cfg = config_from_dict({**TINY, "vocab_size": 97, "hidden_size": 96, "intermediate_size": 256,
                            "num_attention_heads": 3, "num_key_value_heads": 1})
    spec = TrainSpec(4, 8, optimizer="adamw", grad_accum=2, **kw)
    one = estimate_training(prepare(cfg, spec), TrainSpec(4, 8, optimizer="adamw", **kw))
    two = estimate_training(prepare(cfg, spec), spec)
    assert two.peak_bytes > one.peak_bytes
    (r,) = run_accuracy([("accum2", cfg, spec)], in_process=True, progress=lambda *_: None)
    assert abs(r["error_pct"]) <= FINETUNE_BAR_PCT, r


@pytest.mark.parametrize("family, kw", [
    ("mistral", dict(precision="bf16", lora_r=4, lora_targets="all-linear", lora_dropout=0.1, checkpointing=True)),
    ("mistral", dict(train_layers="last:1")),
    ("qwen3", dict(precision="bf16", train_layers="last:1")),
    ("qwen3", dict(lora_r=16, lora_targets="all-linear"))])
def test_mistral_and_qwen3_within_1pct(family, kw):
    """Mistral (a sliding window shorter than s: SDPA gets a mask) and Qwen 3 (q_norm / k_norm, which save
    their fp32 input and rsqrt once the projections' outputs need grad) fine-tune within 1%."""
    from planner.arch import families

    label, cfg, b, s = families()[family].grid_configs()[0 if family == "mistral" else 2]
    spec = TrainSpec(b, s, optimizer="adamw", **kw)
    (r,) = run_accuracy([(label, cfg, spec)], in_process=True, progress=lambda *_: None)
    assert abs(r["error_pct"]) <= FINETUNE_BAR_PCT, r


@pytest.mark.parametrize("family, shape, kw", [
    ("gemma", 2, dict(precision="bf16", train_layers="last:1")),
    ("gemma", 2, dict(precision="bf16", train_layers="last:1", grad_accum=2)),
    ("gemma", 0, dict(precision="bf16", lora_r=16, lora_targets="all-linear", lora_dropout=0.1, checkpointing=True)),
    ("gemma2", 0, dict(train_layers="last:1")),
    ("gemma2", 3, dict(lora_r=16, lora_targets="q_proj,k_proj,v_proj,o_proj", lora_dropout=0.1)),
    ("gemma2", 3, dict(train_layers="last:1", checkpointing=True)),
    ("gemma2", 2, dict(precision="bf16", train_layers="last:1", grad_accum=2))])
def test_gemma_and_gemma2_within_1pct(family, shape, kw):
    """Gemma (GemmaRMSNorm: fp32 normed x and 1 + weight saved) and Gemma 2 (post-attention / post-feedforward
    norms, soft-capped attention scores and final logits, eager attention) fine-tune within 1%."""
    from planner.arch import families

    label, cfg, b, s = families()[family].grid_configs()[shape]
    spec = TrainSpec(b, s, optimizer="adamw", **kw)
    (r,) = run_accuracy([(label, cfg, spec)], in_process=True, progress=lambda *_: None)
    assert abs(r["error_pct"]) <= FINETUNE_BAR_PCT, r


def test_gemma_and_phi3_qlora_stay_refused():
    """Gemma's and Phi-3's fine-tuning is measured without a quantized base; peft maps no default LoRA targets
    for Phi-3, so LoRA there names its targets."""
    from planner.arch import families

    for family in ("gemma", "phi3"):
        _, cfg, b, s = families()[family].grid_configs()[0]
        qlora = TrainSpec(b, s, precision="bf16", lora_r=4, lora_targets="all-linear", quantize_base="nf4")
        with pytest.raises(ConfigError, match="QLoRA"):
            estimate_training(prepare(cfg, qlora), qlora)
    with pytest.raises(ConfigError, match="no default LoRA targets for phi3"):
        prepare(cfg, TrainSpec(b, s, lora_r=4))


@pytest.mark.parametrize("kw", [dict(lora_r=8, lora_targets="qkv_proj,o_proj"),
                                dict(precision="bf16", lora_r=4, lora_targets="all-linear", lora_dropout=0.1),
                                dict(precision="bf16-amp", lora_r=8, lora_targets="all-linear", checkpointing=True),
                                dict(precision="bf16-amp", train_layers="last:1")])
def test_phi3_finetuning_within_1pct(kw):
    """Phi-3's fused qkv_proj / gate_up_proj under LoRA and frozen layers (the block walk, planner/arch/saved.py:
    q, k and v are views of one output, gate and up halves of another), measured on transformers' model wrapped
    by peft: within 1% (the whole Phi-3 grid, fp32 / bf16 / AMP, is recorded: tests/test_recorded.py)."""
    from planner.arch import families

    label, cfg, b, s = families()["phi3"].grid_configs()[0]
    spec = TrainSpec(b, s, optimizer="adamw", **kw)
    (r,) = run_accuracy([(label, cfg, spec)], in_process=True, progress=lambda *_: None)
    assert abs(r["error_pct"]) <= FINETUNE_BAR_PCT, r


@pytest.mark.parametrize("family, kw", [
    ("qwen2_moe", dict(lora_r=8, lora_targets="all-linear")),
    ("qwen2_moe", dict(precision="bf16-amp", train_layers="last:1", checkpointing=True)),
    ("mixtral", dict(precision="bf16", lora_r=8)),
    ("qwen3_moe", dict(precision="bf16-amp", lora_r=4, lora_targets="all-linear", lora_dropout=0.1))])
def test_moe_finetuning_within_1pct(family, kw):
    """The MoE families under LoRA and frozen layers (planner/arch/moe.py saved_mlp: frozen experts save no
    grouped-GEMM inputs; the router is no nn.Linear, so LoRA adapts attention and Qwen2-MoE's shared expert),
    measured on transformers' model wrapped by peft: within 1% (every MoE row of the grids is recorded:
    tests/test_recorded.py)."""
    from planner.arch import families

    label, cfg, b, s = families()[family].grid_configs()[0]
    spec = TrainSpec(b, s, optimizer="adamw", **kw)
    (r,) = run_accuracy([(label, cfg, spec)], in_process=True, progress=lambda *_: None)
    assert abs(r["error_pct"]) <= FINETUNE_BAR_PCT, r


def test_moe_lora_targets_are_the_linears_peft_can_wrap():
    """A MoE router is a bare parameter (MixtralTopKRouter.weight) and the experts are 3-D parameters: peft's
    all-linear leaves them out and naming the router is refused; peft maps default targets for mixtral only."""
    from planner.arch import families
    from planner.finetune import adapted_linears, lora_target_names

    _, mixtral, b, s = families()["mixtral"].grid_configs()[0]
    fam = families()["mixtral"]
    spec = TrainSpec(b, s, lora_r=8, lora_targets="all-linear")
    assert {lin.short for lin in adapted_linears(fam, mixtral, spec)} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert lora_target_names(fam, mixtral, TrainSpec(b, s, lora_r=8)) == ("q_proj", "v_proj")
    with pytest.raises(ConfigError, match="not in the model"):
        prepare(mixtral, TrainSpec(b, s, lora_r=8, lora_targets="gate"))
    _, qwen2_moe, b, s = families()["qwen2_moe"].grid_configs()[0]
    shorts = {lin.short for lin in adapted_linears(families()["qwen2_moe"], qwen2_moe, TrainSpec(b, s, lora_r=8, lora_targets="all-linear"))}
    assert shorts == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "shared_expert_gate"}
    with pytest.raises(ConfigError, match="no default LoRA targets for qwen2_moe"):
        prepare(qwen2_moe, TrainSpec(b, s, lora_r=8))


def _family_config(tmp_path, family: str) -> str:
    from planner.arch import families
    from planner.config import config_to_dict

    _, cfg, _, _ = families()[family].grid_configs()[0]
    path = tmp_path / f"{family}.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    return str(path)


@pytest.mark.parametrize("family, args, message", [
    ("phi3", ["--lora-r", "4"], "peft has no default LoRA targets for phi3; give --lora-targets (its linear layers: "
                                "o_proj, qkv_proj, gate_up_proj, down_proj, lm_head)"),
    ("mixtral", ["--lora-r", "4", "--lora-targets", "gate"], "gate not in the model; its linear layers: q_proj, "
                                                            "k_proj, v_proj, o_proj, lm_head"),
    ("phi3", ["--lora-r", "4", "--lora-targets", "all-linear", "--quantize-base", "nf4"], "QLoRA"),
])
def test_cli_refuses_what_phi3_and_moe_do_not_have(tmp_path, family, args, message):
    out = subprocess.run([sys.executable, "-m", "planner", "estimate", "train", "--config",
                          _family_config(tmp_path, family), "--batch-size", "2", "--seq-len", "16", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr


def test_cli_measures_mixtral_lora_and_phi3_frozen_layers(tmp_path):
    """`measure train` (the real step in a child) on the families measured later agrees with `estimate train`."""
    for family, extra in (("mixtral", ["--lora-r", "8"]), ("phi3", ["--train-layers", "last:1", "--checkpointing"])):
        args = ["--config", _family_config(tmp_path, family), "--batch-size", "2", "--seq-len", "32", *extra, "--json"]
        meas = subprocess.run([sys.executable, "-m", "planner", "measure", "train", *args, "--device", "cpu"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert meas.returncode == 0, meas.stderr
        m = json.loads(meas.stdout)
        assert abs(m["error_pct"]) <= FINETUNE_BAR_PCT, (family, m["error_pct"])
