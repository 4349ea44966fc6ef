"""The book's GPT-2 (LLMs-from-scratch ch04 GPTModel): the seed's model, measured as the book trains it.

Config keys are the book's BASE_CONFIG ({"arch": "gpt2", ...}); the model is planner/models/gpt2.py
(the book's op for op); the loss is the book's calc_loss_batch (cross-entropy over the logits).
Terms: saved-tensor inventories (torch.autograd.graph.saved_tensors_hooks, deduplicated by storage)
of that model at several shapes, every precision and attention mode (research/pytorch-memory-facts.md
2.1), and the backward's high points read off the live-bytes timeline (planner.measure.tracker).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ConfigError, _check_optional, _check_positive, check_attention_kind
from .base import Family, linear
from .terms import TensorSpec, Term


@dataclass(frozen=True)
class GPT2Config:
    """LLMs-from-scratch's GPTModel config, keys exactly as the book's BASE_CONFIG."""
    vocab_size: int = 50257       # GPT-2 BPE vocabulary; the book does not pad it
    context_length: int = 1024    # also sizes each block's persistent fp32 causal-mask buffer (ctx x ctx)
    emb_dim: int = 768
    n_heads: int = 12
    n_layers: int = 12
    drop_rate: float = 0.0        # the loading notebook's BASE_CONFIG uses 0.0; training chapters use 0.1
    qkv_bias: bool = True         # True to match OpenAI's GPT-2 weights (book ch05 loads them this way)
    attention: str = "eager"      # eager: the book's manual attention; sdpa: F.scaled_dot_product_attention
    torch_dtype: str | None = None  # the checkpoint's dtype (None: float32, as the book saves it)
    name: str | None = None       # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="gpt2", init=False)

    def __post_init__(self) -> None:
        _check_positive(self, ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"))
        _check_optional(self)
        if self.emb_dim % self.n_heads:
            raise ConfigError(f"emb_dim {self.emb_dim} is not divisible by n_heads {self.n_heads}")
        if not 0.0 <= self.drop_rate < 1.0:
            raise ConfigError(f"drop_rate must be in [0, 1), got {self.drop_rate}")
        check_attention_kind(self.attention)

    @property
    def max_seq_len(self) -> int:
        return self.context_length

    @property
    def hidden(self) -> int:
        return self.emb_dim

    @property
    def layers(self) -> int:
        return self.n_layers

    @property
    def heads(self) -> int:
        return self.n_heads


# The book's BASE_CONFIG (ch05/08 notebook): context 1024, qkv_bias True, drop_rate 0.0, untied head.
_BASE = dict(vocab_size=50257, context_length=1024, drop_rate=0.0, qkv_bias=True)


class BookGPT2(Family):
    arch = "gpt2"
    model_types = ()  # a Hugging Face gpt2 config.json is transformers' GPT2LMHeadModel (planner/arch/gpt2.py)
    config_cls = GPT2Config
    required = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers")
    source = "book"
    default_loss = "cross-entropy"
    description = "LLMs-from-scratch GPTModel (the book's GPT-2)"
    # Fine-tuning (planner/estimate/finetune_book.py): peft has no default LoRA targets for a custom module
    # (lora_default_targets stays empty: --lora-targets must name them, or "all-linear")
    lora_supported = subset_supported = True

    def presets(self) -> dict:
        return {
            "gpt2-small": GPT2Config(**_BASE, emb_dim=768, n_layers=12, n_heads=12),     # 163,037,184 untied
            "gpt2-medium": GPT2Config(**_BASE, emb_dim=1024, n_layers=24, n_heads=16),
            "gpt2-large": GPT2Config(**_BASE, emb_dim=1280, n_layers=36, n_heads=20),
            "gpt2-xl": GPT2Config(**_BASE, emb_dim=1600, n_layers=48, n_heads=25),       # 1,638,022,400 untied
        }

    def tiny(self, cfg):
        return dataclasses.replace(cfg, vocab_size=64, context_length=16, emb_dim=16, n_heads=2, n_layers=1)

    def with_layers(self, cfg, n: int):
        return dataclasses.replace(cfg, n_layers=n)

    def tied(self, cfg) -> bool:
        return False

    def count_note(self, c) -> str:
        """The book's GPT-2 has its own output head; published GPT-2 counts (124M) tie it to the embedding."""
        from ..units import fmt_count

        n, head = sum(t.numel for t in self.inventory(c) if t.kind == "param"), c.vocab_size * c.emb_dim
        return (f"{fmt_count(n)} here: the book's GPT-2 has its own output head ({head:,}); "
                f"Hugging Face's ties it to the token embedding: {n - head:,} ({fmt_count(n - head)}).")

    def infer_caches(self, cfg) -> tuple[str, ...]:
        """The book's generate_text_simple keeps no cache: it recomputes the whole context per token."""
        return ("none",)

    def infer_estimate(self, cfg, ispec) -> dict:
        """generate_text_simple's peak: the whole context recomputed per token (planner/estimate/inference_book.py)."""
        from ..estimate.inference_book import estimate_book_inference

        return estimate_book_inference(cfg, ispec)

    def inventory(self, c: GPT2Config) -> list[TensorSpec]:
        h, ctx = c.emb_dim, c.context_length
        specs = [TensorSpec("tok_emb.weight", (c.vocab_size, h), "param", role="embed"),
                 TensorSpec("pos_emb.weight", (ctx, h), "param", role="pos_embed")]
        for i in range(c.n_layers):
            p = f"trf_blocks.{i}"
            specs += linear(f"{p}.att.W_query", h, h, c.qkv_bias, i, "attn.in")
            specs += linear(f"{p}.att.W_key", h, h, c.qkv_bias, i, "attn.in")
            specs += linear(f"{p}.att.W_value", h, h, c.qkv_bias, i, "attn.in")
            specs += linear(f"{p}.att.out_proj", h, h, True, i, "attn.out")
            specs += linear(f"{p}.ff.layers.0", h, 4 * h, True, i, "mlp.in")
            specs += linear(f"{p}.ff.layers.2", 4 * h, h, True, i, "mlp.out")
            specs += [TensorSpec(f"{p}.norm1.scale", (h,), "param", block=i, role="norm.attn"),
                      TensorSpec(f"{p}.norm1.shift", (h,), "param", block=i, role="norm.attn"),
                      TensorSpec(f"{p}.norm2.scale", (h,), "param", block=i, role="norm.mlp"),
                      TensorSpec(f"{p}.norm2.shift", (h,), "param", block=i, role="norm.mlp")]
        specs += [TensorSpec("final_norm.scale", (h,), "param", role="norm.final"),
                  TensorSpec("final_norm.shift", (h,), "param", role="norm.final")]
        specs += linear("out_head", h, c.vocab_size, False, None, "head")
        # The book registers the causal mask as a persistent buffer in every block (in the state_dict).
        specs += [TensorSpec(f"trf_blocks.{i}.att.mask", (ctx, ctx), "buffer", block=i, role="buffer",
                             trainable=False) for i in range(c.n_layers)]
        return specs

    def block_terms(self, c: GPT2Config, spec, w) -> list[Term]:
        b, s, h, a, ctx = spec.batch_size, spec.seq_len, c.emb_dim, c.n_heads, c.context_length
        bsh, bas2 = b * s * h, b * a * s * s
        p = c.drop_rate > 0
        ek_res = 1 if spec.device_type == "cuda" else w.e_m  # residual dropout acts on matmul outputs
        terms = [
            Term("LayerNorm x, x-mean, norm_x (norm1)", "3*b*s*h*e_r", 3 * bsh * w.e_r, True),
            Term("LayerNorm x, x-mean, norm_x (norm2)", "3*b*s*h*e_r", 3 * bsh * w.e_r, True, part="norm.mlp"),
            Term("LayerNorm std (norm1)", "b*s*e_r", b * s * w.e_r, True),
            Term("LayerNorm std (norm2)", "b*s*e_r", b * s * w.e_r, True, part="norm.mlp"),
            Term("q/k/v projection input" + (" (3 autocast copies)" if w.amp else ""),
                 ("3" if w.amp else "1") + "*b*s*h*e_m", (3 if w.amp else 1) * bsh * w.e_m, True),
            Term("feed-forward input", "b*s*h*e_m", bsh * w.e_m, True, where="mlp"),
            Term("GELU saved tensors (x, 0.5x, tanh, 1+tanh) and its output", "5 * b*s*4h*e_m", 20 * bsh * w.e_m,
                 True, where="mlp"),
            Term("GELU sqrt(2/pi) constant", "4 B (0-d fp32)", 4, True),
        ]
        if c.attention == "sdpa" and not (p and spec.device_type == "cpu"):
            # CUDA flash/efficient kernels regenerate the dropout mask from the RNG seed: nothing more saved.
            terms += [Term("SDPA q, k, v, out", "4*b*s*h*e_m", 4 * bsh * w.e_m, True),
                      Term("SDPA logsumexp", "4*b*a*s (fp32)", 4 * b * a * s, True)]
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
                          Term("attention dropout output", "b*a*s^2*" + ("4" if math_path else "e_m"), bas2 * e_s,
                               True)]
            if c.attention == "eager":
                terms.append(Term("causal mask.bool() (full context)", "c^2 * 1 B", ctx * ctx, True))
        if p:
            terms.append(Term("attention residual dropout keep-mask", "b*s*h*e_k", bsh * ek_res, True))
            terms.append(Term("feed-forward residual dropout keep-mask", "b*s*h*e_k", bsh * ek_res, True, where="mlp"))
        return terms

    def outside_terms(self, c: GPT2Config, spec, w) -> list[Term]:
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

    def _resid_mask(self, c: GPT2Config, spec, w) -> int:
        if c.drop_rate == 0:
            return 0
        return spec.batch_size * spec.seq_len * c.emb_dim * (1 if spec.device_type == "cuda" else w.e_m)

    def block_points(self, c: GPT2Config, spec, w, x) -> dict[str, int]:
        """In-block high points of the backward, read off the measured op-by-op timeline:
        ffn: the GELU's backward, with the down projection's grad, its input grad (b*s*h*e_r) and two
             b*s*4h gradients alive; autocast's FFN weight copies are already freed.
        mlp_done: the MLP's backward finished (its saved tensors freed, its grads made).
        attention: the softmax backward (eager; SDPA's math fallback on CPU with dropout)."""
        b, s, h = spec.batch_size, spec.seq_len, c.emb_dim
        f = 4 * h
        resid_mask = self._resid_mask(c, spec, w)
        points = {
            "ffn": x.current + x.down_n * x.e_p + x.bsh * w.e_r + 2 * b * s * f * w.e_m - resid_mask
            - (2 * f * h if w.amp else 0),
            "mlp_done": x.current - x.mlp_saved - x.casts_mlp + x.mlp_n * x.g + x.pending
            + x.bsh * (w.e_r + w.e_m) + b * s * f * w.e_m,
        }
        if c.attention == "eager" or (c.drop_rate > 0 and spec.device_type == "cpu"):
            points["attention"] = (x.current - x.mlp_saved - x.casts_mlp - x.norm_mlp_saved - resid_mask
                                   - x.bsh * w.e_m  # the output projection's input copy, freed by its backward
                                   + (x.mlp_n + x.attn_n) * x.g + x.bsh * w.e_r
                                   + self._s2_bytes(c, w) * b * c.n_heads * s * s)
        return points

    @staticmethod
    def _s2_bytes(c: GPT2Config, w) -> int:
        """Net bytes per b*a*s^2 the attention backward adds at its high point (_softmax_backward_data):
        without dropout the probabilities' gradient and the softmax backward's output, both e_m wide;
        with dropout the output and keep-mask die before the softmax backward, which offsets the two
        gradients (measured +0.1..0.35 B, within the bar). SDPA's math fallback below fp32 peaks at the
        matmul backward, where the probabilities' fp32 gradient (4 B) joins the saved set."""
        if c.drop_rate == 0:
            return 2 * w.e_m
        return 4 if (c.attention == "sdpa" and w.e_m < 4) else 0

    # ---- the real model -------------------------------------------------------------------------------
    def selective_ops(self, c: GPT2Config, spec, w) -> list:
        """The book's block (planner/models/gpt2.py): W_query, W_key, W_value (aten.mm without qkv_bias, addmm
        with it), the attention (eager: `@` is bmm; sdpa: the CPU flash kernel unless dropout runs the math path),
        out_proj and the feed-forward's two Linears (biased: addmm)."""
        from .decoder import attention_op, linear_op

        b, s, h = spec.batch_size, spec.seq_len, c.emb_dim
        n, a, d = b * s, c.n_heads, c.emb_dim // c.n_heads
        flash = c.attention == "sdpa" and not (c.drop_rate > 0 and spec.device_type == "cpu")
        return ([linear_op(name, n, h, h, c.qkv_bias, w) for name in ("W_query", "W_key", "W_value")]
                + [attention_op("sdpa" if flash else "eager", b, s, a, d, w), linear_op("out_proj", n, h, h, True, w),
                   linear_op("ff in", n, h, 4 * h, True, w), linear_op("ff out", n, 4 * h, h, True, w)])

    def build(self, cfg, device, dtype: str):
        """Built directly in `dtype` on `device` (under that default dtype, as the research ran pure bf16),
        never an fp32 and a bf16 copy at once."""
        import torch

        from ..models import TORCH_DTYPES
        from ..models.gpt2 import GPTModel

        old = torch.get_default_dtype()
        torch.set_default_dtype(TORCH_DTYPES[dtype])
        try:
            with torch.device(device):
                return GPTModel(cfg)
        finally:
            torch.set_default_dtype(old)

    def enable_checkpointing(self, model) -> None:
        model.gradient_checkpointing = True  # torch.utils.checkpoint(use_reentrant=False) per block

    def loss(self, model, inputs, targets, loss_kind: str, on_phase):
        """LLMs-from-scratch ch05 calc_loss_batch: cross-entropy over the flattened logits; `logits`
        dies on return."""
        from ..losses import is_fused
        from ..models.gpt2 import calc_loss_batch

        if is_fused(loss_kind):  # planner/models/losses.py: the final hidden states and the head weight
            from ..models.losses import fused_loss

            hidden = model.hidden_states(inputs)
            on_phase("loss")
            return fused_loss(hidden, model.out_head.weight, targets, loss_kind)
        return calc_loss_batch(inputs, targets, model, on_phase)


FAMILY = BookGPT2()
