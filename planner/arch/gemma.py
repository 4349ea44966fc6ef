"""Gemma (transformers' GemmaForCausalLM, models/gemma/modeling_gemma.py), from its config.json.

Llama's block with GemmaRMSNorm (all in fp32, weight applied as 1 + w), a GeGLU MLP (gelu tanh: a
published "hidden_act": "gelu" is read as gelu_pytorch_tanh, as transformers does), an explicit
head_dim (256), the embeddings scaled by sqrt(hidden_size) (a 0-d buffer in the weights' dtype) and a
tied head by default.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .terms import TensorSpec, Term
from . import parts
from .decoder import DecoderConfigMixin, RMSDecoder, check_zero, normalise_rope


@dataclass(frozen=True)
class GemmaConfig(DecoderConfigMixin):
    """Keys and defaults as transformers' GemmaConfig (configuration_gemma.py)."""
    vocab_size: int = 256000
    hidden_size: int = 3072
    intermediate_size: int = 24576
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 16
    head_dim: int | None = 256
    hidden_act: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    pad_token_id: int | None = 0
    attention: str = "sdpa"
    torch_dtype: str | None = None  # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None  # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="gemma", init=False)

    def __post_init__(self) -> None:
        self._validate()


class Gemma(RMSDecoder):
    offload_finetune = True  # --offload-activations with LoRA / a trainable subset measured (decoder.py)
    arch = "gemma"
    model_types = ("gemma",)
    model_type = "gemma"
    hf_attribute_map: dict = {}  # transformers 5.23 models/gemma/configuration_gemma.py GemmaConfig.attribute_map: none
    config_cls = GemmaConfig
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    description = "transformers GemmaForCausalLM"
    grid_options = {"hidden_act": "gelu_pytorch_tanh", "head_dim": 32}
    lora_supported = subset_supported = True  # fine-tuning terms measured (tests/test_finetune.py, bench finetune)
    qlora_supported = False  # QLoRA (planner/estimate/quantized.py) not measured on the Gemma families yet

    def presets(self) -> dict:
        # tests/data/gemma-2b.config.json; 2,506,172,416 parameters.
        return {"gemma-2b": GemmaConfig(vocab_size=256000, hidden_size=2048, intermediate_size=16384,
                                        num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1,
                                        head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6,
                                        rope_theta=10000.0, hidden_act="gelu_pytorch_tanh", torch_dtype="bfloat16")}

    def normalise(self, data: dict) -> dict:
        data = normalise_rope(data)
        if data.get("hidden_act") == "gelu":  # GemmaConfig.__post_init__: the legacy value means the tanh GELU
            data = {**data, "hidden_act": "gelu_pytorch_tanh"}
        return data

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout",))
        return super().from_dict(data)

    def tiny(self, cfg):
        return dataclasses.replace(cfg, vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=8, pad_token_id=0)

    def inventory(self, c: GemmaConfig) -> list[TensorSpec]:
        specs = super().inventory(c)
        # GemmaTextScaledWordEmbedding.embed_scale: torch.tensor(sqrt(hidden_size)), non-persistent, built in
        # the default (the weights') dtype; registered before the rotary buffers.
        first_buffer = next(i for i, t in enumerate(specs) if t.kind == "buffer")
        specs.insert(first_buffer, TensorSpec("model.embed_tokens.embed_scale", (), "buffer", persistent=False,
                                              role="buffer", trainable=False))
        return specs

    def norm_terms(self, label, b, s, h, w, part="", where="block", per_layer=True) -> list[Term]:
        return parts.gemma_rms_norm(label, b, s, h, w, part=part, where=where, per_layer=per_layer)

    def offload_norm(self, label, b, s, h, w, e_in, e_p, per_layer=True, where="block") -> Term:
        """--offload-activations' host copies of GemmaRMSNorm (all in fp32 whatever the dtypes: x.float(), pow,
        x * rsqrt, normed * (1 + weight.float())): the fp32 input twice (pow, mul), rsqrt's output twice, the fp32
        normed x and the fp32 (1 + weight) (measured: saved_tensors_hooks inventory, fp32, bf16, bf16-AMP)."""
        return Term(f"host: GemmaRMSNorm ({label}): fp32 input x2, rsqrt x2, fp32 normed x, 1 + weight",
                    "12*b*s*h + 8*b*s + 4*h", 12 * b * s * h + 8 * b * s + 4 * h, per_layer, where)

    def infer_forward_points(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> dict[str, int]:
        """Llama's points; the post-attention norm is GemmaRMSNorm: `output * (1.0 + self.weight.float())` makes the
        fp32 (h,) `1 + weight` beside the fp32 normed x and the product (4*h more than Llama's RMSNorm point).
        Measured on the live-bytes op log (issue #39's fuzz: gemma V3926 h232 f232 a2 kv1 d16 L1 b2 p44 n1 bf16
        eager static, the prompt's peak at that product, 928 B = 4*h above the estimate before; gemma2 V7278 h168
        f168 a1 kv1 d16 L1 w233 b4 p271 n6 bf16 eager, the prompt's peak at the post-feedforward norm's mean, its
        input and 4*b*s: Gemma2.infer_norm_input_bytes)."""
        points = super().infer_forward_points(c, ispec, e, s, kv_len, masked)
        # below fp32 the point may instead be _norm's `x.pow(2).mean(-1, keepdim=True)` or its product with the rsqrt,
        # beside the fp32 copy of x: one (b, s, 1) fp32 tensor (4*b*s; _norm is one expression, its variance is not
        # bound as LlamaRMSNorm's, whose 8*b*s Llama's point holds); the higher of the two
        b, h = ispec.batch_size, c.hidden_size
        points["norm"] += 4 * h if e == 4 else max(4 * b * s, 4 * h) - 8 * b * s
        points["norm"] += self.infer_norm_input_bytes(c, ispec, e, s)
        return points

    def infer_norm_input_bytes(self, c, ispec, e: int, s: int) -> int:
        """The norm's input beside the residual at the norm point (none here: Gemma's post-attention norm takes the
        residual sum itself)."""
        return 0

    def offload_embed_extra(self, c, spec, w, e_p) -> list[Term]:
        """inputs_embeds * embed_scale saves the 0-d scale buffer (the weights' dtype)."""
        return [Term("host: embedding scale (0-d, saved by the mul)", "e_p", e_p, where="embed")]

    def restore_buffers(self, model, cfg, device) -> None:
        import torch

        super().restore_buffers(model, cfg, device)
        emb = model.model.embed_tokens
        emb.embed_scale = torch.tensor(emb.scalar_embed_scale, device=device, dtype=emb.weight.dtype)


    def ft_norm(self, label: str, b: int, s: int, h: int, e_r: int, rg_in: bool, trains: bool, part: str = "",
                where: str = "block") -> list[Term]:
        """GemmaRMSNorm (models/gemma/modeling_gemma.py) in the block walk, full training's too:
        self._norm(x.float()) * (1.0 + self.weight.float()), all in fp32, then type_as(x). By what needs grad:
        its fp32 input and rsqrt, and the fp32 (1 + weight) (h wide) when its input needs grad; the fp32 normed
        x (not e_r, as Llama's) when its weight trains."""
        per_layer = where != "head"
        terms = []
        if rg_in:
            terms.append(Term(f"{label}: fp32 input, rsqrt, 1 + weight (input needs grad)", "4*b*s*h + 4*b*s + 4*h",
                              4 * b * s * h + 4 * b * s + 4 * h, per_layer, where, part))
        if trains:
            terms.append(Term(f"{label}: fp32 normed x (weight trains)", "4*b*s*h", 4 * b * s * h, per_layer, where,
                              part))
        return terms

    def host_norm(self, label: str, b: int, s: int, h: int, e_r: int, e_p: int, rg_in: bool, trains: bool,
                  per_layer: bool = True, where: str = "block") -> list[Term]:
        """The walk's host view of GemmaRMSNorm (offload_norm's pieces by what needs grad): when its input needs
        grad the fp32 input twice, rsqrt's output twice and the fp32 (1 + weight) (for the normed x's grad); when
        its weight trains the fp32 normed x."""
        terms = []
        if rg_in:
            terms.append(Term(f"host: GemmaRMSNorm ({label}): fp32 input x2, rsqrt x2, 1 + weight",
                              "8*b*s*h + 8*b*s + 4*h", 8 * b * s * h + 8 * b * s + 4 * h, per_layer, where))
        if trains:
            terms.append(Term(f"host: GemmaRMSNorm ({label}): fp32 normed x (weight trains)", "4*b*s*h",
                              4 * b * s * h, per_layer, where))
        return terms

    def ft_final_norm_released(self, out: list[Term], h: int) -> int:
        """GemmaRMSNorm's last op's backward (the product with 1 + weight) has released what it saved, the fp32
        normed x (weight trains) and 1 + weight, before the rsqrt chain's fp32 temporaries (measured on the op
        timeline: gemma / gemma2 V97 h96 b4 s8 last:1 bf16, 12,672 B of the family's point)."""
        released = sum(t.bytes for t in out if t.name.startswith("final norm: fp32 normed x"))
        return released + (4 * h if any(t.name.startswith("final norm: fp32 input") for t in out) else 0)


FAMILY = Gemma()
