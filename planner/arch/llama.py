"""Llama (transformers' LlamaForCausalLM, models/llama/modeling_llama.py), from its config.json.

Both {"arch": "llama", ...} and a published config.json ({"model_type": "llama", ...}) are read here,
and the model measured is transformers' own, built with AutoModelForCausalLM.from_config: RMSNorm
(fp32 inside), RoPE, a gated MLP with `hidden_act`, grouped-query attention (eager or SDPA), an untied
or tied head, optional biases (attention_bias on q/k/v/o, mlp_bias). Terms and backward high points:
planner/arch/decoder.py.
"""
from __future__ import annotations

from ..config import LlamaConfig
from .decoder import RMSDecoder, check_zero, normalise_rope


class Llama(RMSDecoder):
    arch = "llama"
    model_types = ("llama",)
    model_type = "llama"
    config_cls = LlamaConfig
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    description = "transformers LlamaForCausalLM"
    mlp_bias_key = "mlp_bias"
    lora_supported = subset_supported = True  # fine-tuning terms measured (tests/test_finetune.py)

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
