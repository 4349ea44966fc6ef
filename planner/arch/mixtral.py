"""Mixtral (transformers' MixtralForCausalLM, models/mixtral/modeling_mixtral.py), from its config.json.

Mistral's attention (grouped K/V, RoPE, an optional sliding window) with a sparse Mixture-of-Experts block in
place of the MLP: a router (`mlp.gate`, MixtralTopKRouter: a bias-free (E, h) linear, softmax in fp32, top-k,
the top-k weights renormalised to sum to 1) and E experts stored as two 3-D parameters
(`mlp.experts.gate_up_proj` (E, 2f, h), `mlp.experts.down_proj` (E, h, f), MixtralExperts). transformers 5.23
runs the experts with `integrations/moe.py::grouped_mm_experts_forward` (the default "grouped_mm"
implementation): tokens sorted by expert, gathered, two grouped GEMMs in the parameters' dtype (the input is
cast with `.to(weight.dtype)`; grouped_mm is not on autocast's lists, so under AMP the experts run in fp32),
weighted and summed back over the top-k. Saved tensors: planner/arch/moe.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .decoder import DecoderConfigMixin, check_zero, normalise_rope
from .moe import MoEDecoder, check_moe


@dataclass(frozen=True)
class MixtralConfig(DecoderConfigMixin):
    """Keys and defaults as transformers' MixtralConfig (configuration_mixtral.py)."""
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336          # each expert's SwiGLU width
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 8
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_theta: float = 1e6
    rope_scaling: dict | None = None
    sliding_window: int | None = None
    num_local_experts: int = 8              # E
    num_experts_per_tok: int = 2            # top-k
    attention: str = "sdpa"
    torch_dtype: str | None = None          # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None                 # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="mixtral", init=False)

    def __post_init__(self) -> None:
        self._validate()
        check_moe(self)

    @property
    def num_experts(self) -> int:
        return self.num_local_experts

    @property
    def expert_size(self) -> int:
        return self.intermediate_size


class Mixtral(MoEDecoder):
    arch = "mixtral"
    model_types = ("mixtral",)
    model_type = "mixtral"
    # transformers 5.23 models/mixtral/configuration_mixtral.py MixtralConfig.attribute_map
    hf_attribute_map = {"num_experts": "num_local_experts"}
    config_cls = MixtralConfig
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_local_experts", "num_experts_per_tok")
    description = "transformers MixtralForCausalLM (sparse MoE)"
    router_name = "mlp.gate"
    expert_width_key = "intermediate_size"

    def presets(self) -> dict:
        # mistralai/Mixtral-8x7B-v0.1 config.json; 46,702,792,704 parameters (tests hold the accounting to it).
        return {
            "mixtral-8x7b": MixtralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                          max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1e6,
                                          num_local_experts=8, num_experts_per_tok=2, torch_dtype="bfloat16"),
        }

    grid_options = {"num_local_experts": 4, "num_experts_per_tok": 2}  # every grid shape: 4 experts, top-2

    def tiny(self, cfg):
        return dataclasses.replace(super().tiny(cfg), num_local_experts=4, num_experts_per_tok=2)

    def normalise(self, data: dict) -> dict:
        return normalise_rope(data)

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout", "router_jitter_noise"))
        return super().from_dict(data)


FAMILY = Mixtral()
