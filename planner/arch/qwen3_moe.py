"""Qwen3-MoE (transformers' Qwen3MoeForCausalLM, models/qwen3_moe/modeling_qwen3_moe.py), from its config.json.

Qwen 3's attention (explicit head_dim, q/k RMSNorms over head_dim, optional attention_bias) with a sparse block
(Qwen3MoeSparseMoeBlock): a router over `num_experts` experts of width `moe_intermediate_size`,
top-`num_experts_per_tok`, renormalised with `norm_topk_prob` (true in the published configs), the top-k
weights cast back to the logits' dtype; no shared expert. Saved tensors: planner/arch/moe.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ConfigError
from .decoder import DecoderConfigMixin, check_zero, normalise_rope
from .decoder import ROPE_POINT
from .moe import MoEDecoder, check_moe, refuse_dense_layers
from .qwen3 import Q_NORM_POINT, with_q_norm_point


@dataclass(frozen=True)
class Qwen3MoeConfig(DecoderConfigMixin):
    """Keys and defaults as transformers' Qwen3MoeConfig (configuration_qwen3_moe.py)."""
    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144           # the dense MLP's width (blocks that are not sparse: none here)
    num_hidden_layers: int = 24
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 4
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    moe_intermediate_size: int = 768        # each routed expert's width
    num_experts: int = 128
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    attention: str = "sdpa"
    torch_dtype: str | None = None
    name: str | None = None
    arch: str = dataclasses.field(default="qwen3_moe", init=False)

    def __post_init__(self) -> None:
        self._validate()
        check_moe(self, ("moe_intermediate_size",))

    @property
    def expert_size(self) -> int:
        return self.moe_intermediate_size


class Qwen3Moe(MoEDecoder):
    arch = "qwen3_moe"
    model_types = ("qwen3_moe",)
    model_type = "qwen3_moe"
    # transformers 5.23 models/qwen3_moe/configuration_qwen3_moe.py Qwen3MoeConfig.attribute_map
    hf_attribute_map = {"num_experts": "num_local_experts"}
    config_cls = Qwen3MoeConfig
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_experts",
                "num_experts_per_tok", "moe_intermediate_size")
    description = "transformers Qwen3MoeForCausalLM (sparse MoE)"
    # Qwen3MoeConfig: bos_token_id = eos_token_id = None (transformers 5.23 configuration file): generate holds no token
    # tensor and adds no MinLength / MinNewTokens processor (measured: issue #39's fuzz, qwen3_moe b3 p70 n4 fp16)
    infer_bos_eos, infer_has_eos = 0, False
    qk_norm = True
    lora_default_targets = ()  # peft 0.21 maps no default LoRA targets for this model type (peft/utils/constants.py)
    router_first = False  # Qwen3MoeSparseMoeBlock.__init__ registers experts, then gate
    fp32_routing_weights = False

    def renormalises(self, c) -> bool:
        return bool(c.norm_topk_prob)

    def infer_forward_points(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> dict[str, int]:
        """The sparse block's points (moe.py) and Qwen 3's q norm point (qwen3.py; measured: issue #39's fuzz,
        qwen3_moe h104 a6 kv1 d24 b4 p131 fp16 static, the prompt's peak at the q norm's product, -2.16% before)."""
        return with_q_norm_point(self, c, ispec, e, s, super().infer_forward_points(c, ispec, e, s, kv_len, masked))

    def infer_prefill_unwritten_kv(self, c, ispec, e: int) -> dict[str, int]:
        """The q norm comes before the last layer's cache update too (as its RoPE)."""
        out = super().infer_prefill_unwritten_kv(c, ispec, e)
        return {**out, Q_NORM_POINT: out[ROPE_POINT]}

    def presets(self) -> dict:
        # Qwen/Qwen3-30B-A3B config.json; 30,532,122,624 parameters (transformers' model on the meta device;
        # the card: 30.5B in total, 3.3B activated).
        return {
            "qwen3-30b-a3b": Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                            num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                            head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                                            rope_theta=1e6, moe_intermediate_size=768, num_experts=128,
                                            num_experts_per_tok=8, norm_topk_prob=True, torch_dtype="bfloat16"),
        }

    grid_options = {"head_dim": 24, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 40,
                    "norm_topk_prob": True}

    def normalise(self, data: dict) -> dict:
        return normalise_rope(data)

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout",))
        refuse_dense_layers(data)
        if data.get("use_sliding_window"):
            raise ConfigError("use_sliding_window: true is not modelled yet (Qwen's published configs leave it off)")
        return super().from_dict(data)

    def tiny(self, cfg):
        return dataclasses.replace(cfg, vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=8, moe_intermediate_size=16,
                                   num_experts=4, num_experts_per_tok=2)


FAMILY = Qwen3Moe()
