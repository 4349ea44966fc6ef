"""Qwen2-MoE (transformers' Qwen2MoeForCausalLM, models/qwen2_moe/modeling_qwen2_moe.py), from its config.json.

Qwen 2's attention (q/k/v biases: `qkv_bias`) with a sparse block (Qwen2MoeSparseMoeBlock): a router over
`num_experts` experts of width `moe_intermediate_size`, top-`num_experts_per_tok` (renormalised only with
`norm_topk_prob`, the top-k weights cast back to the logits' dtype), plus a shared expert (a dense gated MLP
of width `shared_expert_intermediate_size`) scaled by sigmoid(shared_expert_gate(x)). Saved tensors:
planner/arch/moe.py. Every published config has decoder_sparse_step 1 and no mlp_only_layers (every block
sparse); others are refused.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ConfigError
from .decoder import DecoderConfigMixin, check_zero, normalise_rope
from .moe import MoEDecoder, check_moe, refuse_dense_layers


@dataclass(frozen=True)
class Qwen2MoeConfig(DecoderConfigMixin):
    """Keys and defaults as transformers' Qwen2MoeConfig (configuration_qwen2_moe.py)."""
    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 5632           # the dense MLP's width (blocks that are not sparse: none here)
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 16
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = 1e6
    rope_scaling: dict | None = None
    qkv_bias: bool = True
    moe_intermediate_size: int = 1408       # each routed expert's width
    shared_expert_intermediate_size: int = 5632
    num_experts: int = 60
    num_experts_per_tok: int = 4
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    attention: str = "sdpa"
    torch_dtype: str | None = None
    name: str | None = None
    arch: str = dataclasses.field(default="qwen2_moe", init=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def __post_init__(self) -> None:
        if self.num_attention_heads and self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                              f"{self.num_attention_heads}")
        self._validate()
        check_moe(self, ("moe_intermediate_size", "shared_expert_intermediate_size"))

    @property
    def expert_size(self) -> int:
        return self.moe_intermediate_size


class Qwen2Moe(MoEDecoder):
    arch = "qwen2_moe"
    model_types = ("qwen2_moe",)
    model_type = "qwen2_moe"
    hf_attribute_map: dict = {}  # transformers 5.23 models/qwen2_moe/configuration_qwen2_moe.py Qwen2MoeConfig.attribute_map: none
    config_cls = Qwen2MoeConfig
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_experts",
                "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
    description = "transformers Qwen2MoeForCausalLM (sparse MoE with a shared expert)"
    # Qwen2MoeConfig: bos_token_id = eos_token_id = None (transformers 5.23 configuration file): generate holds no token
    # tensor and adds no MinLength / MinNewTokens processor (measured: issue #39's fuzz, qwen3_moe b3 p70 n4 fp16)
    infer_bos_eos, infer_has_eos = 0, False
    renormalise_topk = False  # read from norm_topk_prob (renormalises)
    fp32_routing_weights = False
    o_bias = False
    lora_default_targets = ()  # peft 0.21 maps no default LoRA targets for this model type (peft/utils/constants.py)

    def biases(self, c) -> tuple[bool, bool, bool]:
        return bool(c.qkv_bias), False, False

    def renormalises(self, c) -> bool:
        return bool(c.norm_topk_prob)

    def shared_expert_size(self, c) -> int:
        return c.shared_expert_intermediate_size

    def offload_forward_mask(self, spec) -> int:
        """--offload-activations: Qwen2MoeModel.forward builds both masks whatever layer_types say, and with
        use_sliding_window off (sliding_window 0) create_sliding_window_causal_mask still makes a (1, 1, s, s) bool
        tensor, alive in the model's mask mapping through the forward (no layer takes it: not a checkpoint input;
        measured on the forward's op timeline, Qwen2-MoE V97 h32 b2 s128 / s256 / s512: -s^2 B before)."""
        return spec.seq_len * spec.seq_len

    def offload_alive(self, c, spec, w) -> tuple[int, int, int]:
        cache, rope, point = super().offload_alive(c, spec, w)
        return cache, rope, point + self.offload_forward_mask(spec)

    def offload_forward_points(self, c, spec, w) -> dict[str, int]:
        return {k: v + self.offload_forward_mask(spec) for k, v in super().offload_forward_points(c, spec, w).items()}

    def infer_mask_count(self, c, ispec) -> int:
        """Qwen2MoeModel.forward builds both masks whatever its layer types (causal_mask_mapping: create_causal_mask
        and create_sliding_window_causal_mask, modeling_qwen2_moe.py), as Gemma 2's (planner/arch/gemma2.py): eager,
        a second additive (b, 1, s, kv_len) mask no layer takes, alive through the forward (measured: issue #39's
        fuzz, qwen2_moe h64 L3 b3 p233 n12 bf16 eager dynamic, the prompt's peak one (b, 1, p, p) bf16 mask above
        the estimate before); with a StaticCache generate builds the mapping itself, one mask per layer type."""
        return self.mask_count(c) if ispec.cache == "static" else 2

    def infer_forward_points(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> dict[str, int]:
        """The sparse block's points (moe.py); with SDPA and a cache other than static the prompt's forward also
        holds the unused sliding-window mask, a (1, 1, s, kv_len) bool tensor (offload_forward_mask; measured: issue #39's
        fuzz, qwen2_moe h24 fs240 b1 p282 n15 fp32 SDPA dynamic, -4.37% before)."""
        pts = super().infer_forward_points(c, ispec, e, s, kv_len, masked)
        if c.attention == "sdpa" and ispec.cache != "static":
            pts = {k: v + s * kv_len for k, v in pts.items()}
        return pts

    def infer_decode_points(self, c, ispec, e: int) -> dict[str, int]:
        """A decode step's forward holds the sliding-window mask too, (1, 1, 1, p + n - 1) bool with SDPA (measured:
        qwen2_moe h24 fs240 b1 p282 n15 fp32 SDPA dynamic, the decode peak at the cache concatenation); "the step's"
        points have it from infer_forward_points."""
        pts = super().infer_decode_points(c, ispec, e)
        if c.attention == "sdpa" and ispec.cache != "static":
            pts = {k: v + (0 if k.startswith("the step's ") else ispec.total_len - 1) for k, v in pts.items()}
        return pts

    def presets(self) -> dict:
        # Qwen/Qwen1.5-MoE-A2.7B config.json; 14,315,784,192 parameters (transformers' model on the meta
        # device; the card says 14.3B in total, 2.7B activated).
        return {
            "qwen1.5-moe-a2.7b": Qwen2MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                                                num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                                                max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1e6,
                                                moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                                                num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
                                                torch_dtype="bfloat16"),
        }

    grid_options = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 40,
                    "shared_expert_intermediate_size": 72}

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
                                   num_attention_heads=2, num_key_value_heads=1, moe_intermediate_size=16,
                                   shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2)

    def hf_kwargs(self, cfg) -> dict:
        data = super().hf_kwargs(cfg)
        data.pop("head_dim", None)
        return data


FAMILY = Qwen2Moe()
