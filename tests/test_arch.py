"""The architecture registry (planner/arch): published configs, presets, inventories against transformers'
models, the estimator against transformers' measured training steps (1%), the tracker against torch's
MemTracker, and the estimate side staying free of torch and transformers."""
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.accounting import param_count, tensor_inventory
from planner.arch import families, family_of, supported_model_types
from bench.main import family_grid, run_accuracy
from planner.config import PRESETS, ConfigError, config_from_dict, config_to_dict, load_config
from planner.estimate.training import estimate_training
from planner.measure.training import measure_training
from planner.spec import TrainSpec

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
FAMILY_BAR_PCT = 1.0  # issue #10: every family within 1% of the peak of transformers' measured model

# Published config.json files (tests/data), the preset that copies each, and the parameter count
# transformers' model has (the model card's: tied heads counted once).
PUBLISHED = [
    ("Mistral-7B-v0.1", "mistral-7b-v0.1", 7_241_732_096),
    ("Qwen2.5-0.5B", "qwen2.5-0.5b", 494_032_768),
    ("Qwen2.5-7B", "qwen2.5-7b", 7_615_616_512),
    ("Qwen3-0.6B", "qwen3-0.6b", 596_049_920),
    ("Qwen3-8B", "qwen3-8b", 8_190_735_360),
    ("gemma-2b", "gemma-2b", 2_506_172_416),
    ("gemma-2-2b", "gemma-2-2b", 2_614_341_888),
    ("Phi-3-mini-4k-instruct", "phi-3-mini-4k", 3_821_079_552),
    ("gpt2", "hf-gpt2", 124_439_808),
    ("gpt2-xl", "hf-gpt2-xl", 1_557_611_200),
]
HF_FAMILIES = [f for f in families() if families()[f].source == "transformers"]


@pytest.mark.parametrize("fname, preset, count", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_config_is_the_preset_with_the_published_count(fname, preset, count):
    cfg = load_config(DATA / f"{fname}.config.json")
    assert cfg == PRESETS[preset]
    assert param_count(cfg) == count
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_grid_configs_inventory_equals_transformers_model(family):
    """Names, shapes, kinds and registration order of every parameter and buffer, for each tiny grid
    config (tied and untied, grouped and plain heads, the family's options), built by transformers."""
    from planner.routines import build_model

    for _, cfg, _, _ in families()[family].grid_configs():
        model = build_model(cfg, "meta")
        real = ([(k, tuple(p.shape), "param") for k, p in model.named_parameters()]
                + [(k, tuple(b.shape), "buffer") for k, b in model.named_buffers()])
        assert real == [(t.name, t.shape, t.kind) for t in tensor_inventory(cfg)]
        assert type(model).__module__.startswith("transformers.models.")


def test_unknown_model_type_lists_the_supported_ones():
    # "resnet": a model_type transformers knows but AutoModelForCausalLM does not build (issue #20 accepts any
    # causal LM type, e.g. "bert" for BertLMHeadModel, as a fitted family)
    with pytest.raises(ConfigError) as exc:
        config_from_dict({"model_type": "resnet", "hidden_size": 8})
    for name in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2", "AutoModelForCausalLM"):
        assert name in str(exc.value)
    assert supported_model_types() == sorted(supported_model_types())


@pytest.mark.parametrize("data, message", [
    ({**json.loads((DATA / "gemma-2-2b.config.json").read_text()), "attention": "sdpa"}, "does not run SDPA"),
    ({"model_type": "llama", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 4, "hidden_act": "swishy"}, "not an activation transformers knows"),
    ({"model_type": "llama", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 4, "attention": "flash_attention_2"}, "needs a CUDA GPU"),
    ({**json.loads((DATA / "Phi-3-mini-4k-instruct.config.json").read_text()), "vocab_size": 1000},
     "pad_token_id 32000 must be below vocab_size"),
    ({**json.loads((DATA / "Qwen2.5-0.5B.config.json").read_text()), "use_sliding_window": True}, "not modelled"),
    ({**json.loads((DATA / "gpt2.config.json").read_text()), "n_embd": 100}, "not divisible"),
    ({"model_type": "mistral", "vocab_size": 10}, "missing key"),
])
def test_invalid_family_configs_say_why(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_llama_accepts_the_activations_transformers_allows():
    base = json.loads((DATA / "TinyLlama-1.1B.config.json").read_text())
    for act in ("gelu", "gelu_pytorch_tanh", "relu", "gelu_new"):
        assert config_from_dict({**base, "hidden_act": act}).hidden_act == act


@functools.cache
def quick_grid(family: str) -> list[dict]:
    """A family's quick grid: one row per shape and per precision (attention, checkpointing and optimizer rotate),
    each estimated, measured and simulated once in this process (run_accuracy); the two tests below read it."""
    full = family_grid(family)
    shapes = len(families()[family].grid_configs())
    per_precision = len(full) // shapes // 4  # attention kernels x checkpointing
    rows = [full[(i * 4 + i % 4) * per_precision + (i + 1) % per_precision] for i in range(shapes)]
    return run_accuracy(rows, in_process=True, progress=lambda *_: None, simulate=True)


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_family_quick_grid_within_1pct(family):
    """Every family on its tiny configs, one row per shape and per precision (attention, checkpointing and
    optimizer rotate), measured in this process on transformers' own model: within 1% of the exact peak.
    (`python -m planner bench families` runs the full grid: docs/accuracy.md.)"""
    results = quick_grid(family)
    worst = max(results, key=lambda r: abs(r["error_pct"]))
    assert abs(worst["error_pct"]) <= FAMILY_BAR_PCT, worst


def test_loss_option_cross_entropy_and_labels_differ_as_transformers_does():
    """Pure bf16: transformers' labels= loss upcasts the logits, 6*b*s*V (+ small) bytes more at the peak
    than cross-entropy over the bf16 logits; both estimates are within 1% of the measurement."""
    cfg = config_from_dict({"model_type": "qwen2", "vocab_size": 2000, "hidden_size": 32, "intermediate_size": 64,
                            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1})
    peaks = {}
    for loss in ("labels", "cross-entropy"):
        spec = TrainSpec(2, 32, "bf16", "sgd", loss=loss)
        est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
        assert abs(est.peak_bytes - meas["peak_bytes"]) <= 0.01 * meas["peak_bytes"]
        peaks[loss] = meas["peak_bytes"]
    assert peaks["labels"] - peaks["cross-entropy"] >= 6 * 2 * 32 * 2000


def test_book_gpt2_has_no_labels_loss():
    from planner.spec import prepare

    with pytest.raises(ConfigError, match="no labels= loss"):
        prepare(PRESETS["gpt2-small"], TrainSpec(1, 8, loss="labels"))


@pytest.mark.parametrize("cfg_dict, spec", [
    ({"model_type": "llama", "vocab_size": 500, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2}, TrainSpec(2, 16, "bf16-amp", "adamw")),
    ({"model_type": "gemma2", "vocab_size": 500, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "sliding_window": 8},
     TrainSpec(2, 16, "fp32", "sgd", checkpointing=True)),
    ({"model_type": "gpt2", "vocab_size": 500, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32},
     TrainSpec(2, 16, "bf16", "adamw")),
], ids=["llama-gqa-amp", "gemma2-ckpt", "gpt2-dropout-bf16"])
def test_tracker_equals_torch_memtracker(cfg_dict, spec):
    """The planner's live-bytes tracker and torch's MemTracker (torch.distributed._tools.mem_tracker)
    give the same peak, to the byte, for the same steady-state step of transformers' model."""
    import gc

    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from planner.measure.tracker import LiveBytesTracker
    from planner.routines.training import TrainingStep

    cfg = config_from_dict(cfg_dict)
    step = TrainingStep(cfg, spec)
    step.run()
    step.run()
    gc.collect()
    ours = LiveBytesTracker()
    ours.track(step.persistent_tensors())
    with ours:
        step.run()
    gc.collect()
    mt = MemTracker()
    mt.track_external(step.model, step.optimizer, step.inputs, step.targets)
    with mt:
        step.run()
        mt.reset_mod_stats()
    theirs = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert ours.peak == theirs


def test_estimate_side_imports_neither_torch_nor_transformers():
    code = ("import sys\n"
            "from planner.config import PRESETS, load_config\n"
            "from planner.estimate.training import estimate_training\n"
            "from planner.spec import TrainSpec\n"
            "import planner.fit, planner.arch\n"
            "for cfg in PRESETS.values():\n"
            "    estimate_training(cfg, TrainSpec(1, 128, 'bf16-amp', checkpointing=True))\n"
            "load_config('tests/data/gemma-2-2b.config.json')\n"
            "cfg = PRESETS['llama-3-8b']\n"  # fine-tuning (issue #12): a trainable subset and LoRA
            "estimate_training(cfg, TrainSpec(1, 128, 'bf16', train_layers='last:2'))\n"
            "estimate_training(cfg, TrainSpec(1, 128, 'bf16', lora_r=16, lora_targets='all-linear', lora_dropout=0.1))\n"
            "assert not {'torch', 'transformers', 'peft'} & set(sys.modules), 'imported'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_every_family_in_one_file_discovered():
    # auto: the family answered from a fit of simulations (issue #20), in all_families(), not families()
    # (infer_windows: the sliding-window cache's decode, shared by the decoder families: a helper, not a family;
    # saved: the decoder block's walk by what needs grad, which every decoder family's file answers pieces of;
    # memo: the per-config memo key every estimator shares)
    files = {p.stem for p in (ROOT / "planner" / "arch").glob("*.py")} - {"__init__", "base", "parts", "decoder", "terms",
                                                                           "moe", "auto", "infer_windows", "saved", "memo"}
    assert {type(f).__module__.rsplit(".", 1)[1] for f in families().values()} == files
    for family in families().values():
        assert family.presets(), family.arch
        for name, cfg in family.presets().items():
            assert family_of(cfg) is family
            assert estimate_training(cfg, TrainSpec(1, 64)).peak_bytes > param_count(cfg)


def test_mistral_equals_llama_inside_the_window_and_says_what_changes_beyond():
    """While s < sliding_window the mask is skipped (SDPA is_causal, enable_gqa): Llama's estimate to the
    byte; from s >= window on, SDPA saves a mask per layer and K/V are repeated."""
    kw = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512)
    mistral = config_from_dict({"model_type": "mistral", **kw, "sliding_window": 64})
    llama = config_from_dict({"model_type": "llama", **kw})
    inside, beyond = TrainSpec(2, 32, "bf16"), TrainSpec(2, 128, "bf16")
    assert estimate_training(mistral, inside).peak_bytes == estimate_training(llama, inside).peak_bytes
    diff = estimate_training(mistral, beyond).activations_bytes - estimate_training(llama, beyond).activations_bytes
    L, b, s, a, kv, d = 2, 2, 128, 4, 2, 16
    assert diff == L * (b * s * s * 2 + 2 * b * (a - kv) * s * d * 2)
    names = {t["name"] for t in estimate_training(mistral, beyond).terms}
    assert any("sliding-window mask" in n for n in names)


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_simulate_equals_measure_on_the_family(family):
    """The fake-tensor step takes the real step's branches on transformers' models too (planner.measure.simulate:
    real_run_branches, the packed-sequence read): equal to the byte, phase by phase, on every row of the family's
    quick grid (its measurements shared with the test above), among them SDPA with checkpointing where the family
    has SDPA and a bf16 row without."""
    rows = quick_grid(family)
    ckpt = [r for r in rows if " ckpt" in r["config"]]
    assert any(" sdpa " in r["config"] for r in ckpt) or " sdpa " not in " ".join(r["config"] for r in rows)
    assert any(" ckpt" not in r["config"] and " bf16" in r["config"] for r in rows)  # the mask branch; bf16 without
    for row in rows:
        label = row["config"]
        assert row["simulated_bytes"] == row["measured_bytes"], label
        assert row["simulated_phase_peak_bytes"] == row["measured_phase_peak_bytes"], label


def test_count_note_only_where_the_count_differs_from_the_published_one():
    """The book's GPT-2 has its own output head: the Planner's model caption says what the published (tied)
    count is; families counted as published say nothing."""
    note = families()["gpt2"].count_note(PRESETS["gpt2-small"])
    assert "124,439,808" in note and "38,597,376" in note  # HF GPT-2's published count; the book's head
    assert families()["llama"].count_note(PRESETS["llama-3-8b"]) == ""
