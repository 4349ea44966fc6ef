"""A config.json is read under transformers' own aliases (its config class's `attribute_map`), as from_config reads
it (issue #34: a Qwen3-MoE config.json written by transformers 5.23 carries `num_local_experts`, no `num_experts`).

The estimate side never imports transformers, so each family file copies its config class's table
(`hf_attribute_map`); this test imports transformers and holds every copy to the real table, so they cannot drift.
"""
from __future__ import annotations

import dataclasses

import pytest

from planner.arch import families
from planner.config import config_from_dict, config_to_dict

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

HF_FAMILIES = [f for f in families().values() if f.model_types]


@pytest.mark.parametrize("family", HF_FAMILIES, ids=lambda f: f.arch)
def test_alias_table_is_transformers_own(family):
    for model_type in family.model_types:
        assert family.hf_attribute_map == dict(CONFIG_MAPPING[model_type].attribute_map), model_type


@pytest.mark.parametrize("family", HF_FAMILIES, ids=lambda f: f.arch)
def test_config_json_written_by_transformers_reads_back(family):
    """Every grid config of the family, through transformers' config class and its to_dict (what save_pretrained
    writes as config.json), reads back as the same config (attention, dtype and name are not in that file's
    model keys)."""
    grid = family.grid_configs()
    assert grid, family.arch
    for label, cfg, _b, _s in grid:
        written = AutoConfig.for_model(family.model_type, **family.hf_kwargs(cfg)).to_dict()
        read = config_from_dict(written)
        same = dataclasses.replace(read, attention=cfg.attention, torch_dtype=cfg.torch_dtype, name=cfg.name)
        assert same == cfg, (family.arch, label, written)


def test_qwen3_moe_config_json_with_num_local_experts():
    """The file transformers 5.23 writes for Qwen3-MoE: `num_local_experts` (Qwen3MoeConfig's attribute_map sends
    `num_experts` there), no `num_experts`."""
    written = AutoConfig.for_model("qwen3_moe", vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_intermediate_size=16,
                                   num_experts=6, num_experts_per_tok=2).to_dict()
    assert "num_experts" not in written and written["num_local_experts"] == 6
    cfg = config_from_dict(written)
    assert cfg.num_experts == 6
    assert config_from_dict(config_to_dict(cfg)) == cfg  # the planner's own form keeps its field name


def test_either_spelling_is_read_and_the_own_spelling_wins():
    base = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "num_experts_per_tok": 2}
    assert config_from_dict({**base, "num_experts": 3}).num_local_experts == 3
    assert config_from_dict({**base, "num_local_experts": 5, "num_experts": 3}).num_local_experts == 5
    gpt2 = config_from_dict({"model_type": "gpt2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "max_position_embeddings": 128})
    assert (gpt2.n_embd, gpt2.n_layer, gpt2.n_head, gpt2.n_positions) == (32, 2, 4, 128)


@pytest.mark.parametrize("family", [f for f in HF_FAMILIES if "head_dim" in {x.name for x in dataclasses.fields(
    f.config_cls)}], ids=lambda f: f.arch)
def test_explicit_head_dim_with_a_width_heads_do_not_divide_refused_as_transformers_refuses(family):
    """A width the heads do not divide, with an explicit head_dim: refused where transformers' config class refuses
    it (LlamaConfig / Gemma2Config.validate_architecture), read where it builds (the fuzz check, issue #34)."""
    from planner.config import ConfigError

    data = {**config_to_dict(family.grid_configs()[0][1]), "hidden_size": 176, "num_attention_heads": 6,
            "num_key_value_heads": 2, "head_dim": 8}
    try:
        config_from_dict(data)
        refused = False
    except ConfigError:
        refused = True
    kwargs = {k: v for k, v in data.items() if k not in ("arch", "attention", "name", "torch_dtype")}
    try:
        AutoConfig.for_model(family.model_type, **kwargs)
        raised = False
    except Exception as exc:  # huggingface_hub's StrictDataclassClassValidationError (a ValueError inside)
        raised = "not a multiple" in str(exc)
    assert refused == raised, (family.arch, refused, raised)
