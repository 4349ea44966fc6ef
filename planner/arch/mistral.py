"""Mistral (transformers' MistralForCausalLM, models/mistral/modeling_mistral.py), from its config.json.

Llama's block (no biases) with a sliding-window attention mask. While the sequence is shorter than the
window, transformers skips the mask (masking_utils.py _ignore_causal_mask_sdpa): SDPA runs is_causal
with enable_gqa and the memory is Llama's to the byte. From s >= sliding_window on, SDPA gets a
(b, 1, s, s) bool mask: it saves the mask, K/V are repeat_kv copies (enable_gqa needs no mask), and
under checkpointing the mask is an input kept through backward. Eager attention is the same either
way (the additive float mask only changes values).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .decoder import DecoderConfigMixin, RMSDecoder, check_zero, normalise_rope


@dataclass(frozen=True)
class MistralConfig(DecoderConfigMixin):
    """Keys and defaults as transformers' MistralConfig (configuration_mistral.py)."""
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 8
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    sliding_window: int | None = 4096   # None (Mistral-7B-v0.2 and later): plain causal attention
    attention: str = "sdpa"
    torch_dtype: str | None = None  # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None  # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="mistral", init=False)

    def __post_init__(self) -> None:
        self._validate()


class Mistral(RMSDecoder):
    offload_finetune = True  # --offload-activations with LoRA / a trainable subset measured (decoder.py)
    arch = "mistral"
    offload_plain = True  # --offload-activations' host copies measured (planner/arch/decoder.py offload_copies)
    model_types = ("mistral",)
    model_type = "mistral"
    hf_attribute_map: dict = {}  # transformers 5.23 models/mistral/configuration_mistral.py MistralConfig.attribute_map: none
    config_cls = MistralConfig
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    description = "transformers MistralForCausalLM"
    q_bias = False
    o_bias = False
    lora_supported = subset_supported = True  # fine-tuning terms measured (tests/test_finetune.py, bench finetune)

    grid_options = {"sliding_window": 32}  # s64 and s48 run beyond the window, s8 inside it

    def presets(self) -> dict:
        # tests/data/Mistral-7B-v0.1.config.json; 7,241,732,096 parameters (model card: 7.24B).
        return {"mistral-7b-v0.1": MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                                 max_position_embeddings=32768, rms_norm_eps=1e-5,
                                                 rope_theta=10000.0, sliding_window=4096, torch_dtype="bfloat16")}

    def normalise(self, data: dict) -> dict:
        return normalise_rope(data)

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout",))
        return super().from_dict(data)


FAMILY = Mistral()
