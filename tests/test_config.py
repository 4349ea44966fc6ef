"""Configs, presets and exact accounting against the real models built on the meta device."""
import json
from pathlib import Path

import pytest

from planner.accounting import buffer_bytes, param_bytes, param_count, tensor_inventory, weights_table
from planner.config import (PRESETS, ConfigError, GPT2Config, LlamaConfig, config_from_dict, config_to_dict,
                            load_config, parse_config_text)
from planner.routines import build_model

DATA = Path(__file__).parent / "data"
PUBLISHED = {"TinyLlama-1.1B": 1_100_048_384, "Llama-3.2-1B": 1_235_814_400,
             "Llama-2-7B": 6_738_415_616, "Llama-3-8B": 8_030_261_248}


def meta_inventory(model):
    return ([(k, tuple(p.shape), "param") for k, p in model.named_parameters()]
            + [(k, tuple(b.shape), "buffer") for k, b in model.named_buffers()])


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_inventory_matches_real_model(name):
    cfg = PRESETS[name]
    model = build_model(cfg, "meta")
    assert meta_inventory(model) == [(t.name, t.shape, t.kind) for t in tensor_inventory(cfg)]
    assert param_count(cfg) == sum(p.numel() for p in model.parameters())
    assert buffer_bytes(cfg) == sum(b.numel() * b.element_size() for b in model.buffers())
    assert param_bytes(cfg, "bfloat16") == 2 * param_count(cfg)


def test_gpt2_book_counts():
    assert param_count(PRESETS["gpt2-small"]) == 163_037_184
    assert param_count(PRESETS["gpt2-xl"]) == 1_638_022_400
    # 48 persistent fp32 ctx x ctx masks: the notebook's 6.4 GB on the GPU includes them.
    assert buffer_bytes(PRESETS["gpt2-xl"]) == 48 * 1024 * 1024 * 4


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_hf_config_json_accepted_as_is(name):
    cfg = load_config(DATA / f"{name}.config.json")
    assert isinstance(cfg, LlamaConfig)
    assert param_count(cfg) == PUBLISHED[name]
    model = build_model(cfg, "meta")
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]


def test_presets_equal_published_configs():
    for preset, fname in [("tinyllama-1.1b", "TinyLlama-1.1B"), ("llama-3.2-1b", "Llama-3.2-1B"),
                          ("llama-2-7b", "Llama-2-7B"), ("llama-3-8b", "Llama-3-8B")]:
        assert PRESETS[preset] == load_config(DATA / f"{fname}.config.json")


@pytest.mark.parametrize("cfg", [
    GPT2Config(vocab_size=101, context_length=37, emb_dim=30, n_heads=5, n_layers=3, qkv_bias=False),
    LlamaConfig(vocab_size=77, hidden_size=48, intermediate_size=100, num_hidden_layers=2,
                num_attention_heads=6, num_key_value_heads=3, tie_word_embeddings=True),
    LlamaConfig(vocab_size=77, hidden_size=48, intermediate_size=100, num_hidden_layers=2, num_attention_heads=4,
                head_dim=16, attention_bias=True, mlp_bias=True),
])
def test_odd_configs_inventory_and_round_trip(cfg):
    model = build_model(cfg, "meta")
    assert meta_inventory(model) == [(t.name, t.shape, t.kind) for t in tensor_inventory(cfg)]
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg


def test_weights_table_bytes():
    rows = {r["dtype"]: r for r in weights_table(PRESETS["gpt2-small"])}
    assert rows["float32"]["params_bytes"] == 4 * 163_037_184
    assert rows["bfloat16"]["total_bytes"] * 2 == rows["float32"]["total_bytes"]
    llama = {r["dtype"]: r for r in weights_table(PRESETS["tinyllama-1.1b"])}
    # transformers keeps two fp32 copies of RoPE's inverse frequencies (inv_freq, original_inv_freq)
    assert llama["bfloat16"]["buffers_bytes"] == llama["float32"]["buffers_bytes"] == 2 * 32 * 4
    m = build_model(PRESETS["tinyllama-1.1b"], "meta", dtype="bfloat16")
    assert sum(b.numel() * b.element_size() for b in m.buffers()) == 2 * 32 * 4


@pytest.mark.parametrize("data, message", [
    ({"arch": "gpt2", "vocab_size": 10, "context_length": 8, "emb_dim": 10, "n_heads": 3, "n_layers": 1},
     "not divisible"),
    ({"arch": "llama", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 4, "num_key_value_heads": 3}, "does not divide"),
    ({"arch": "gpt2", "vocab_size": 0, "context_length": 8, "emb_dim": 8, "n_heads": 2, "n_layers": 1},
     "must be positive"),
    ({"arch": "gpt2", "vocab_size": 10, "context_length": -8, "emb_dim": 8, "n_heads": 2, "n_layers": 1},
     "must be positive"),
    ({"arch": "gpt2", "vocab_size": 10, "emb_dim": 8}, "missing key"),
    ({"arch": "bert"}, "unsupported arch"),
    ({"vocab_size": 10}, 'no "arch"'),
    ([1, 2], "JSON object"),
    ({"arch": "gpt2", "vocab_size": 10**9, "context_length": 8, "emb_dim": 10**6, "n_heads": 2, "n_layers": 100},
     "more than"),
    ({"arch": "gpt2", "vocab_size": "many", "context_length": 8, "emb_dim": 8, "n_heads": 2, "n_layers": 1},
     "integer"),
])
def test_invalid_configs_say_why(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_bad_json_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_config_text("{nope")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.json")


def test_hf_extra_keys_ignored():
    data = json.loads((DATA / "Llama-3.2-1B.config.json").read_text())
    data["some_future_key"] = {"x": 1}
    assert config_from_dict(data) == PRESETS["llama-3.2-1b"]
