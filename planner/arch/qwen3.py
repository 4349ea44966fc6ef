"""Qwen 3 (transformers' Qwen3ForCausalLM, models/qwen3/modeling_qwen3.py), from its config.json.

Llama's block with an explicit head_dim (q_out = heads * head_dim need not equal hidden_size), q/k
RMSNorms over head_dim before RoPE, optional attention biases (attention_bias), tied or untied heads.
Qwen's sliding window is off in every published config; a config that turns it on is refused.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ConfigError
from .decoder import ROPE_POINT, DecoderConfigMixin, RMSDecoder, check_zero, normalise_rope

Q_NORM_POINT = "q norm's fp32 temporaries (before the cache update)"


@dataclass(frozen=True)
class Qwen3Config(DecoderConfigMixin):
    """Keys and defaults as transformers' Qwen3Config (configuration_qwen3.py)."""
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 32
    head_dim: int | None = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    attention: str = "sdpa"
    torch_dtype: str | None = None  # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None  # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="qwen3", init=False)

    def __post_init__(self) -> None:
        if self.use_sliding_window:
            raise ConfigError("use_sliding_window: true is not modelled yet (Qwen's published configs leave it off)")
        self._validate()


class Qwen3(RMSDecoder):
    offload_finetune = True  # --offload-activations with LoRA / a trainable subset measured (decoder.py)
    arch = "qwen3"
    model_types = ("qwen3",)
    model_type = "qwen3"
    hf_attribute_map: dict = {}  # transformers 5.23 models/qwen3/configuration_qwen3.py Qwen3Config.attribute_map: none
    config_cls = Qwen3Config
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    description = "transformers Qwen3ForCausalLM"
    infer_bos_eos, infer_has_eos = 0, False  # Qwen3Config: bos_token_id = eos_token_id = None (generate holds no token tensor)
    qk_norm = True
    lora_supported = subset_supported = True  # fine-tuning terms measured (tests/test_finetune.py, bench finetune)

    grid_options = {"head_dim": 24}  # heads * head_dim != hidden_size

    def presets(self) -> dict:
        # tests/data/Qwen3-{0.6B,8B}.config.json; 596,049,920 and 8,190,735,360 parameters.
        return {
            "qwen3-0.6b": Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                      num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                      head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                                      rope_theta=1000000.0, tie_word_embeddings=True, torch_dtype="bfloat16"),
            "qwen3-8b": Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                                    num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                    head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                                    rope_theta=1000000.0, tie_word_embeddings=False, torch_dtype="bfloat16"),
        }

    def normalise(self, data: dict) -> dict:
        return normalise_rope(data)

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout",))
        return super().from_dict(data)

    def offload_qk_width(self, spec, w) -> int:
        """--offload-activations (planner/arch/decoder.py offload_attention_points): q and k reach RoPE as q_norm's /
        k_norm's outputs, weight * normed.to(input dtype), so the parameters' dtype under autocast (the fp32 weight
        promotes the bf16 product; measured: Qwen 3 V97 h32 a4 kv2 b2 s256 bf16-AMP, forward -12.9% with e_m)."""
        return 2 if spec.precision == "bf16" else 4

    def infer_forward_points(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> dict[str, int]:
        """Llama's points, and the last layer's q norm before its cache update: Qwen3RMSNorm (models/qwen3/
        modeling_qwen3.py) on q_proj's output (b, s, a, d) in the weights' dtype: `hidden_states.to(float32)`
        (a copy below fp32), `variance = pow(2).mean(-1)` and at `hidden_states * rsqrt(variance + eps)` the copy,
        the product, the variance and the rsqrt (b, s, a, 1) fp32 beside q_proj's output:
        b*s*a*d*(e + 4*[e < 4] + 4) + 8*b*s*a, with the context and the input norm's output (RMSDecoder's RoPE
        point without its rotation). Above the RoPE point below fp32 when a >= 2 kv (measured on the live-bytes op
        log: qwen3 V97 h32 a4 kv2 d24 b2 s256 SDPA bf16, the prompt's peak at that product, 16,384 B above the
        RoPE point: the variance and the rsqrt)."""
        return with_q_norm_point(self, c, ispec, e, s, super().infer_forward_points(c, ispec, e, s, kv_len, masked))

    def infer_prefill_unwritten_kv(self, c, ispec, e: int) -> dict[str, int]:
        """The q norm comes before the last layer's cache update too (as its RoPE)."""
        out = super().infer_prefill_unwritten_kv(c, ispec, e)
        return {**out, Q_NORM_POINT: out[ROPE_POINT]}


def with_q_norm_point(fam, c, ispec, e: int, s: int, points: dict[str, int]) -> dict[str, int]:
    """`points` with the last layer's q norm point (Qwen3.infer_forward_points; Qwen3-MoE's attention is the same,
    models/qwen3_moe/modeling_qwen3_moe.py Qwen3MoeAttention), from the family's RoPE point."""
    x = fam.shape(c)
    b = ispec.batch_size
    q = b * s * x.a * x.d
    points[Q_NORM_POINT] = (points[ROPE_POINT] - fam.infer_rope_rotation(c, ispec, e, s)
                            + q * (e + (4 if e < 4 else 0) + 4) + 8 * b * s * x.a)
    return points


FAMILY = Qwen3()
