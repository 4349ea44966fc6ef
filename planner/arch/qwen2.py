"""Qwen 2 / 2.5 (transformers' Qwen2ForCausalLM, models/qwen2/modeling_qwen2.py), from its config.json.

Llama's block with biases on the q, k and v projections (not on o_proj), and tied or untied heads.
Qwen's sliding window is off in every published config (use_sliding_window: false: all layers full
attention); a config that turns it on is refused, as its per-layer masks are not modelled yet.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ConfigError
from .decoder import DecoderConfigMixin, RMSDecoder, check_zero, normalise_rope


@dataclass(frozen=True)
class Qwen2Config(DecoderConfigMixin):
    """Keys and defaults as transformers' Qwen2Config (configuration_qwen2.py)."""
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 32
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    use_sliding_window: bool = False
    attention: str = "sdpa"
    torch_dtype: str | None = None  # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None  # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="qwen2", init=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def _validate(self) -> None:
        if self.num_attention_heads and self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by "
                              f"num_attention_heads {self.num_attention_heads}")
        super()._validate()

    def __post_init__(self) -> None:
        if self.use_sliding_window:
            raise ConfigError("use_sliding_window: true is not modelled yet (Qwen's published configs leave it off)")
        self._validate()


class Qwen2(RMSDecoder):
    offload_finetune = True  # --offload-activations with LoRA / a trainable subset measured (decoder.py)
    arch = "qwen2"
    offload_plain = True  # --offload-activations' host copies measured (planner/arch/decoder.py offload_copies)
    model_types = ("qwen2",)
    model_type = "qwen2"
    hf_attribute_map: dict = {}  # transformers 5.23 models/qwen2/configuration_qwen2.py Qwen2Config.attribute_map: none
    config_cls = Qwen2Config
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    description = "transformers Qwen2ForCausalLM"
    infer_bos_eos, infer_has_eos = 0, False  # Qwen2Config: bos_token_id = eos_token_id = None (generate holds no token tensor)
    lora_supported = subset_supported = True  # fine-tuning terms measured (tests/test_finetune.py)
    tp_supported = True  # Llama's plan; the q/k/v biases shard with their rows (tests/test_tensor_parallel.py)
    q_bias = True   # Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False
    o_bias = False

    def presets(self) -> dict:
        # tests/data/Qwen2.5-{0.5B,7B}.config.json; 494,032,768 and 7,615,616,512 parameters.
        return {
            "qwen2.5-0.5b": Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                        tie_word_embeddings=True, torch_dtype="bfloat16"),
            "qwen2.5-7b": Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                      num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                                      max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                      tie_word_embeddings=False, torch_dtype="bfloat16"),
        }

    def normalise(self, data: dict) -> dict:
        return normalise_rope(data)

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout",))
        return super().from_dict(data)

    def tiny(self, cfg):
        return dataclasses.replace(cfg, vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)

    def hf_kwargs(self, cfg) -> dict:
        data = super().hf_kwargs(cfg)
        data.pop("head_dim", None)
        return data


FAMILY = Qwen2()
