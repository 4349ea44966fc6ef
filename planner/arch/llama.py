"""Llama (transformers' LlamaForCausalLM, models/llama/modeling_llama.py), from its config.json.

Both {"arch": "llama", ...} and a published config.json ({"model_type": "llama", ...}) are read here,
and the model measured is transformers' own, built with AutoModelForCausalLM.from_config: RMSNorm
(fp32 inside), RoPE, a gated MLP with `hidden_act`, grouped-query attention (eager or SDPA), an untied
or tied head. The block's terms are planner/arch/parts.py's; the backward's high points below were read
off the live-bytes timeline (planner.measure.tracker) of this model.
"""
from __future__ import annotations

import dataclasses

from ..accounting import TensorSpec
from ..config import ConfigError, LlamaConfig
from ..estimate.activations import Term
from . import parts
from .base import HFCausalLM, linear


class Llama(HFCausalLM):
    arch = "llama"
    model_types = ("llama",)
    model_type = "llama"
    config_cls = LlamaConfig
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    description = "transformers LlamaForCausalLM"

    def presets(self) -> dict:
        # Shapes copied from each model's published config.json (tests/data); the parameter count in
        # the comment is the model card's, and tests hold the accounting to it.
        return {
            "tinyllama-1.1b": LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                          num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                          max_position_embeddings=2048, rms_norm_eps=1e-5),  # 1,100,048,384
            "llama-3.2-1b": LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                        head_dim=64, max_position_embeddings=131072, tie_word_embeddings=True,
                                        rms_norm_eps=1e-5, rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 8192}),  # 1,235,814,400
            "llama-2-7b": LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                                      max_position_embeddings=4096, rms_norm_eps=1e-5),  # 6,738,415,616
            "llama-3-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      max_position_embeddings=8192, rms_norm_eps=1e-5,
                                      rope_theta=500000.0),  # 8,030,261,248
        }

    def normalise(self, data: dict) -> dict:
        return normalise_rope(data)

    def from_dict(self, data: dict):
        check_no_dropout(data, ("attention_dropout",))
        return super().from_dict(data)

    def tiny(self, cfg):
        return dataclasses.replace(cfg, vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=8)

    def with_layers(self, cfg, n: int):
        return dataclasses.replace(cfg, num_hidden_layers=n)

    def shape(self, c: LlamaConfig) -> parts.Shape:
        return parts.Shape(h=c.hidden_size, a=c.num_attention_heads, kv=c.num_key_value_heads, d=c.head_dim,
                           f=c.intermediate_size, attention=c.attention, act=c.hidden_act)

    def inventory(self, c: LlamaConfig) -> list[TensorSpec]:
        h, hd, f = c.hidden_size, c.head_dim, c.intermediate_size
        q_out, kv_out = c.num_attention_heads * hd, c.num_key_value_heads * hd
        specs = [TensorSpec("model.embed_tokens.weight", (c.vocab_size, h), "param", role="embed")]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}"
            specs += linear(f"{p}.self_attn.q_proj", h, q_out, c.attention_bias, i, "attn.in")
            specs += linear(f"{p}.self_attn.k_proj", h, kv_out, c.attention_bias, i, "attn.in")
            specs += linear(f"{p}.self_attn.v_proj", h, kv_out, c.attention_bias, i, "attn.in")
            specs += linear(f"{p}.self_attn.o_proj", q_out, h, c.attention_bias, i, "attn.out")
            specs += linear(f"{p}.mlp.gate_proj", h, f, c.mlp_bias, i, "mlp.in")
            specs += linear(f"{p}.mlp.up_proj", h, f, c.mlp_bias, i, "mlp.in")
            specs += linear(f"{p}.mlp.down_proj", f, h, c.mlp_bias, i, "mlp.out")
            specs += [TensorSpec(f"{p}.input_layernorm.weight", (h,), "param", block=i, role="norm.attn"),
                      TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), "param", block=i, role="norm.mlp")]
        specs.append(TensorSpec("model.norm.weight", (h,), "param", role="norm.final"))
        if not c.tie_word_embeddings:
            specs += linear("lm_head", h, c.vocab_size, False, None, "head")
        specs += rope_buffers(hd // 2)
        return specs

    def block_terms(self, c: LlamaConfig, spec, w) -> list[Term]:
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        x = self.shape(c)
        return (parts.rms_norm("input_layernorm", b, s, h, w)
                + [parts.projection_inputs("q/k/v projection", 3, b, s, h, w)]
                + parts.attention(x, b, s, w, masked=self.masked(c, spec))
                + parts.rms_norm("post_attention_layernorm", b, s, h, w, part="norm.mlp")
                + [parts.projection_inputs("MLP", 2, b, s, h, w, where="mlp")]
                + parts.glu_mlp(x, b, s, w))

    def masked(self, c, spec) -> bool:
        """A mask tensor exists: always for eager (an additive float mask); for sdpa only when the causal
        mask cannot be skipped (masking_utils.py: a plain causal mask becomes is_causal=True)."""
        return c.attention == "eager"

    def outside_terms(self, c: LlamaConfig, spec, w) -> list[Term]:
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        return ([parts.rope(b, s, c.head_dim, w)]
                + parts.rms_norm("final norm", b, s, h, w, where="head", per_layer=False)
                + [Term("lm_head input", "b*s*h*e_m", b * s * h * w.e_m, where="head")]
                + parts.checkpoint_inputs(self.shape(c), b, s, spec, w, self.masked(c, spec)))

    def forward_terms(self, c: LlamaConfig, spec, w) -> list[Term]:
        return parts.forward_only(self.shape(c), c.num_hidden_layers, spec.batch_size, spec.seq_len, spec, w,
                                  self.masked(c, spec))

    def stash_extra(self, c, spec, w) -> int:
        # Below fp32 the RMSNorm saves an fp32 copy, not the block input: the stashed input is its own tensor.
        return spec.batch_size * spec.seq_len * c.hidden_size * w.e_r if w.e_r < 4 else 0

    def block_points(self, c: LlamaConfig, spec, w, x) -> dict[str, int]:
        return rms_glu_block_points(self.shape(c), spec, w, x)

    def head_point(self, c, spec, w, x) -> int:
        return rms_head_point(spec, w, x)


def rms_glu_block_points(sh: parts.Shape, spec, w, x) -> dict[str, int]:
    """In-block high points of a pre-norm RMSNorm + gated-MLP block's backward (measured timeline):
    ffn: the activation's backward, with the down projection's grad, the MLP output's grad (b*s*h*e_r)
         and two b*s*f gradients alive; autocast's MLP weight copies (2*f*h) already freed.
    mlp_done: the MLP's backward finished: its saved tensors freed, its grads made.
    norm: the post-attention RMSNorm's backward, in fp32: four fp32 b*s*h temporaries (16 B/elem).
    attention (eager): the softmax backward: the probabilities' gradient and the softmax backward's
         output are fp32 (softmax(dtype=float32)); below fp32 the freed cast offsets e_m."""
    b, s, f, h = spec.batch_size, spec.seq_len, sh.f, sh.h
    after_mlp = x.current - x.mlp_saved - x.casts_mlp + x.mlp_n * x.g + x.pending
    points = {
        "ffn": x.current + x.down_n * x.e_p + x.bsh * w.e_r + 2 * b * s * f * w.e_m - (2 * f * h if w.amp else 0),
        "mlp_done": after_mlp + x.bsh * (w.e_r + w.e_m) + b * s * f * w.e_m,
        "norm": after_mlp + x.bsh * w.e_r + 16 * x.bsh,
    }
    if sh.attention == "eager":
        points["attention"] = (after_mlp - x.norm_mlp_saved - x.bsh * w.e_m + x.attn_n * x.g + x.bsh * w.e_r
                               + (8 - (w.e_m if w.e_m < 4 else 0)) * b * sh.a * s * s)
    return points


def rms_head_point(spec, w, x) -> int:
    """The final RMSNorm's backward runs in fp32 and holds four fp32 b*s*h temporaries at once (measured),
    after the head's backward has freed its input (b*s*h*e_m) and autocast's head weight copy."""
    return x.saved_after_loss - x.bsh * w.e_m - x.casts_head + x.grads_last + x.bsh * w.e_m + 16 * x.bsh


def rope_buffers(n: int) -> list[TensorSpec]:
    """RotaryEmbedding's inverse frequencies and their copy (inv_freq, original_inv_freq), non-persistent
    fp32 buffers (modeling_llama.py LlamaRotaryEmbedding)."""
    return [TensorSpec("model.rotary_emb.inv_freq", (n,), "buffer", persistent=False, dtype="float32",
                       role="buffer", trainable=False),
            TensorSpec("model.rotary_emb.original_inv_freq", (n,), "buffer", persistent=False, dtype="float32",
                       role="buffer", trainable=False)]


def normalise_rope(data: dict) -> dict:
    """A config.json saved by transformers 5 carries rope_parameters {rope_theta, rope_type, ...} instead
    of rope_theta / rope_scaling."""
    rp = data.get("rope_parameters")
    if isinstance(rp, dict):
        data = dict(data)
        if "rope_theta" in rp:
            data.setdefault("rope_theta", rp["rope_theta"])
        rest = {k: v for k, v in rp.items() if k != "rope_theta"}
        if rest.get("rope_type", "default") != "default":
            data.setdefault("rope_scaling", rest)
    return data


def check_no_dropout(data: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        value = data.get(key, 0.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        if value:
            raise ConfigError(f"{key} {value} > 0 is not modelled yet (published configs use 0.0)")


FAMILY = Llama()
