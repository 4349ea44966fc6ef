"""Llama (transformers' LlamaForCausalLM, models/llama/modeling_llama.py), from its config.json.

Both {"arch": "llama", ...} and a published config.json ({"model_type": "llama", ...}) are read here,
and the model measured is transformers' own, built with AutoModelForCausalLM.from_config: RMSNorm
(fp32 inside), RoPE, a gated MLP with `hidden_act`, grouped-query attention (eager or SDPA), an untied
or tied head, optional biases (attention_bias on q/k/v/o, mlp_bias). Terms and backward high points:
planner/arch/decoder.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ConfigError, _check_optional, _check_positive, check_activation, check_attention_kind
from .decoder import RMSDecoder, check_zero, normalise_rope


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-style decoder, keys as Hugging Face's LlamaConfig (config.json) names them."""
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008          # SwiGLU width (gate/up/down projections)
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None means = num_attention_heads (HF's default: plain MHA)
    max_position_embeddings: int = 2048     # only bounds the sequence length: RoPE has no position table
    tie_word_embeddings: bool = False       # True: lm_head shares embed_tokens' weight (Llama 3.2 1B/3B)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    head_dim: int | None = None             # None means hidden_size // num_attention_heads (HF's default)
    attention_bias: bool = False            # HF flag: biases on q/k/v/o projections
    mlp_bias: bool = False                  # HF flag: biases on gate/up/down projections
    rope_scaling: dict | None = None        # accepted for HF compatibility; changes RoPE values, not memory
    attention: str = "sdpa"                 # sdpa (HF's default kernel) or eager (manual softmax attention)
    torch_dtype: str | None = None          # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None                 # optional display name (runs are stored under it)
    hidden_act: str = "silu"                # the gated MLP's activation (transformers' ACT2FN name)
    arch: str = dataclasses.field(default="llama", init=False)

    def __post_init__(self) -> None:
        _check_optional(self)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        _check_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "max_position_embeddings"))
        # an explicit head_dim too: transformers 5.23 LlamaConfig.validate_architecture refuses the config
        # (configuration_llama.py; the fuzz check, issue #34)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by "
                              f"num_attention_heads {self.num_attention_heads}")
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _check_positive(self, ("head_dim",))
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_key_value_heads {self.num_key_value_heads} does not divide "
                              f"num_attention_heads {self.num_attention_heads}")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        check_attention_kind(self.attention)
        check_activation(self.hidden_act)

    @property
    def max_seq_len(self) -> int:
        return self.max_position_embeddings

    @property
    def hidden(self) -> int:
        return self.hidden_size

    @property
    def layers(self) -> int:
        return self.num_hidden_layers

    @property
    def heads(self) -> int:
        return self.num_attention_heads


class Llama(RMSDecoder):
    offload_finetune = True  # --offload-activations with LoRA / a trainable subset measured (decoder.py)
    arch = "llama"
    offload_plain = True  # --offload-activations' host copies measured (planner/arch/decoder.py offload_copies)
    model_types = ("llama",)
    model_type = "llama"
    hf_attribute_map: dict = {}  # transformers 5.23 models/llama/configuration_llama.py LlamaConfig.attribute_map: none
    config_cls = LlamaConfig
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    description = "transformers LlamaForCausalLM"
    mlp_bias_key = "mlp_bias"
    lora_supported = subset_supported = True  # fine-tuning terms measured (tests/test_finetune.py)
    tp_supported = True  # q/k/v, o, gate/up, down: torchtitan's plan (tests/test_tensor_parallel.py)

    def presets(self) -> dict:
        # Shapes copied from each model's published config.json (tests/data); the parameter count in
        # the comment is the model card's, and tests hold the accounting to it.
        return {
            "tinyllama-1.1b": LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                          num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                          max_position_embeddings=2048, rms_norm_eps=1e-5,
                                          torch_dtype="bfloat16"),  # 1,100,048,384
            "llama-3.2-1b": LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                        head_dim=64, max_position_embeddings=131072, tie_word_embeddings=True,
                                        rms_norm_eps=1e-5, rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 8192},
                                        torch_dtype="bfloat16"),  # 1,235,814,400
            "llama-2-7b": LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                                      max_position_embeddings=4096, rms_norm_eps=1e-5,
                                      torch_dtype="float16"),  # 6,738,415,616
            "llama-3-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      max_position_embeddings=8192, rms_norm_eps=1e-5,
                                      rope_theta=500000.0, torch_dtype="bfloat16"),  # 8,030,261,248
            # Llama-3-8B's shapes with the 128K context of Llama 3.1 (meta-llama/Llama-3.1-8B config.json:
            # rope_scaling llama3, factor 8): the model Unsloth's long-context fine-tuning figures are for
            "llama-3.1-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 8192},
                                        torch_dtype="bfloat16"),  # 8,030,261,248
        }

    def normalise(self, data: dict) -> dict:
        return normalise_rope(data)

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout",))
        return super().from_dict(data)


FAMILY = Llama()
