"""Saved activations of one forward pass, term by term (no torch).

Each term is a group of tensors autograd saves for backward, with its formula. The coefficients come
from a saved-tensor inventory (torch.autograd.graph.saved_tensors_hooks, deduplicated by storage) of
the real models in planner.models, at several shapes, for every precision and attention mode; the
accuracy benchmark (`python -m planner bench accuracy`) holds the sum to the measured peak.

Symbols: b batch, s sequence, h hidden, a heads, d head dim, f FFN width, V vocab, c context length,
L layers. Byte widths: e_r residual stream (the weights' dtype: embeddings output it), e_m matmul
inputs/outputs (the autocast dtype under AMP, else e_r), e_ce the loss (fp32 under CPU autocast,
where cross_entropy is on the fp32 list), e_k dropout keep-mask (fp32 noise on CPU, 1-byte bool on CUDA).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import GPT2Config, LlamaConfig, ModelConfig
from ..spec import TrainSpec


@dataclass(frozen=True)
class Term:
    name: str       # what the tensors are
    formula: str    # how the bytes follow from the config (symbols above)
    bytes: int
    per_layer: bool = False  # True: the figure is one block's; the model holds L of them
    where: str = "block"     # "embed" (before the blocks) or "head" (after them): decides when it is freed


@dataclass(frozen=True)
class Widths:
    e_r: int
    e_m: int
    e_ce: int
    e_k: int
    amp: bool

    @classmethod
    def of(cls, spec: TrainSpec) -> "Widths":
        e_r = 2 if spec.precision == "bf16" else 4
        amp = spec.autocast_dtype is not None
        e_m = 2 if amp else e_r
        # CPU autocast lists cross_entropy_loss as fp32 (autocast_mode.cpp); CUDA autocast runs
        # log_softmax in fp32 via fp32_set_opt_dtype. Either way the loss buffers are fp32 under AMP.
        e_ce = 4 if amp else e_r
        # Dropout: CPU multiplies by a saved noise tensor of the input dtype; CUDA's fused
        # native_dropout saves a bool mask (aten/src/ATen/native/Dropout.cpp).
        e_k = 1 if spec.device_type == "cuda" else e_m
        return cls(e_r, e_m, e_ce, e_k, amp)


def gpt2_block_terms(c: GPT2Config, spec: TrainSpec, w: Widths) -> list[Term]:
    b, s, h, a, ctx = spec.batch_size, spec.seq_len, c.emb_dim, c.n_heads, c.context_length
    bsh, bas2 = b * s * h, b * a * s * s
    p = c.drop_rate > 0
    ek_res = 1 if spec.device_type == "cuda" else w.e_m  # residual dropout acts on matmul outputs
    terms = [
        Term("LayerNorm x, x-mean, norm_x (x2 norms)", "2 * 3*b*s*h*e_r", 2 * 3 * bsh * w.e_r, True),
        Term("LayerNorm std (x2 norms)", "2 * b*s*e_r", 2 * b * s * w.e_r, True),
        Term("q/k/v projection input" + (" (3 autocast copies)" if w.amp else ""),
             ("3" if w.amp else "1") + "*b*s*h*e_m", (3 if w.amp else 1) * bsh * w.e_m, True),
        Term("feed-forward input", "b*s*h*e_m", bsh * w.e_m, True, where="mlp"),
        Term("GELU saved tensors (x, 0.5x, tanh, 1+tanh) and its output", "5 * b*s*4h*e_m", 20 * bsh * w.e_m, True,
             where="mlp"),
        Term("GELU sqrt(2/pi) constant", "4 B (0-d fp32)", 4, True),
    ]
    if c.attention == "sdpa" and not (p and spec.device_type == "cpu"):
        terms += [Term("SDPA q, k, v, out", "4*b*s*h*e_m", 4 * bsh * w.e_m, True),
                  Term("SDPA logsumexp", "4*b*a*s (fp32)", 4 * b * a * s, True)]
        if p:  # CUDA flash/efficient kernels regenerate the dropout mask from the RNG seed
            pass
    else:
        # Eager attention, and SDPA's math fallback (CPU with dropout > 0), materialise s x s. The math
        # fallback upcasts q, k, v to fp32 below fp32 (aten attention.cpp, "high precision for accuracy"),
        # so its saved tensors are fp32 whatever the autocast or weight dtype.
        math_path = c.attention == "sdpa"
        e_s = 4 if math_path else w.e_m
        e_ks = 4 if math_path else w.e_k
        terms += [Term("attention q, k^T, v" + (" (fp32 upcasts)" if math_path else ""), "3*b*s*h*" +
                       ("4" if math_path else "e_m"), 3 * bsh * e_s, True),
                  Term("attention context copy (out_proj input)", "b*s*h*e_m", bsh * w.e_m, True),
                  Term("softmax output", "b*a*s^2*" + ("4" if math_path else "e_m"), bas2 * e_s, True)]
        if p:
            terms += [Term("attention dropout keep-mask", "b*a*s^2*" + ("4" if math_path else "e_k"),
                           bas2 * e_ks, True),
                      Term("attention dropout output", "b*a*s^2*" + ("4" if math_path else "e_m"), bas2 * e_s, True)]
        if c.attention == "eager":
            terms.append(Term("causal mask.bool() (full context)", "c^2 * 1 B", ctx * ctx, True))
    if p:
        terms.append(Term("attention residual dropout keep-mask", "b*s*h*e_k", bsh * ek_res, True))
        terms.append(Term("feed-forward residual dropout keep-mask", "b*s*h*e_k", bsh * ek_res, True, where="mlp"))
    return terms


def gpt2_outside_terms(c: GPT2Config, spec: TrainSpec, w: Widths) -> list[Term]:
    b, s, h = spec.batch_size, spec.seq_len, c.emb_dim
    bsh = b * s * h
    terms = [Term("position indices", "8*s (int64)", 8 * s, where="embed"),
             Term("final LayerNorm x, x-mean, norm_x, std", "3*b*s*h*e_r + b*s*e_r",
                  3 * bsh * w.e_r + b * s * w.e_r, where="head"),
             Term("output head input", "b*s*h*e_m", bsh * w.e_m, where="head")]
    if c.drop_rate > 0:
        terms.insert(0, Term("embedding dropout keep-mask", "b*s*h*e_k",
                             bsh * (1 if spec.device_type == "cuda" else w.e_r), where="embed"))
    return terms


def llama_block_terms(c: LlamaConfig, spec: TrainSpec, w: Widths) -> list[Term]:
    b, s, h, a, d, f = spec.batch_size, spec.seq_len, c.hidden_size, c.num_attention_heads, c.head_dim, c.intermediate_size
    bsh, bsf, bsq = b * s * h, b * s * f, b * s * a * d
    terms = [
        Term("RMSNorm fp32 input and normed x (x2 norms)", "2 * (4 + e_r)*b*s*h", 2 * (4 + w.e_r) * bsh, True),
        Term("RMSNorm rsqrt (x2 norms)", "2 * 4*b*s", 2 * 4 * b * s, True),
        Term("q/k/v projection input" + (" (3 autocast copies)" if w.amp else ""),
             ("3" if w.amp else "1") + "*b*s*h*e_m", (3 if w.amp else 1) * bsh * w.e_m, True),
        Term("MLP input" + (" (2 autocast copies)" if w.amp else ""),
             ("2" if w.amp else "1") + "*b*s*h*e_m", (2 if w.amp else 1) * bsh * w.e_m, True, where="mlp"),
        Term("SwiGLU gate, silu, up, product", "4*b*s*f*e_m", 4 * bsf * w.e_m, True, where="mlp"),
    ]
    if c.attention == "sdpa":
        terms += [Term("SDPA q, k, v (k/v repeated to all heads), out", "4*b*a*s*d*e_m", 4 * bsq * w.e_m, True),
                  Term("SDPA logsumexp", "4*b*a*s (fp32)", 4 * b * a * s, True)]
    else:
        terms += [Term("attention q, k^T, v (repeated), output copy", "4*b*a*s*d*e_m", 4 * bsq * w.e_m, True),
                  Term("softmax output (fp32) and, below fp32, its cast", "b*a*s^2*(4 + (e_m if e_m < 4 else 0))",
                       b * a * s * s * (4 + (w.e_m if w.e_m < 4 else 0)), True),
                  Term("causal mask", "s^2 * 1 B", s * s, True)]
    return terms


def llama_outside_terms(c: LlamaConfig, spec: TrainSpec, w: Widths) -> list[Term]:
    b, s, h, d = spec.batch_size, spec.seq_len, c.hidden_size, c.head_dim
    bsh = b * s * h
    return [Term("RoPE cos, sin (shared by all layers)", "2*s*d*e_r", 2 * s * d * w.e_r, where="embed"),
            Term("final RMSNorm fp32 input, normed x, rsqrt", "(4 + e_r)*b*s*h + 4*b*s",
                 (4 + w.e_r) * bsh + 4 * b * s, where="head"),
            Term("lm_head input", "b*s*h*e_m", bsh * w.e_m, where="head")]


def block_terms(cfg: ModelConfig, spec: TrainSpec, w: Widths) -> list[Term]:
    if isinstance(cfg, GPT2Config):
        return gpt2_block_terms(cfg, spec, w)
    return llama_block_terms(cfg, spec, w)


def outside_terms(cfg: ModelConfig, spec: TrainSpec, w: Widths) -> list[Term]:
    if isinstance(cfg, GPT2Config):
        return gpt2_outside_terms(cfg, spec, w)
    return llama_outside_terms(cfg, spec, w)
