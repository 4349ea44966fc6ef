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
from . import parts
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
    # Fine-tuning (finetune_step below, the end of this file): peft has no default LoRA targets for a custom
    # module (lora_default_targets stays empty: --lora-targets must name them, or "all-linear")
    lora_supported = subset_supported = True
    own_finetune_step = True  # its block is not the transformers decoder's: this file walks it
    # --offload-activations with --grad-accum > 1, every:K / selective or --offload-optimizer: its own backward points
    # in a later micro-batch (offload_backward_points' grads_exist; block_points' later ff.layers.2 and GELU points
    # under checkpointing), measured on V1000 h64 a4 p0.1 b2 s64 and V500 h48 L4 b2 s32, fp32 and bf16-AMP
    # (tests/test_offload_mix.py, bench/offload_act.py book_mix_grid)
    offload_combinations = True

    def finetune_check(self, cfg, spec) -> None:
        check_finetune(cfg, spec)

    def finetune_step(self, cfg, spec, w, train, trains: set, adapted: dict) -> dict:
        """The book's fine-tuning step (the walk at the end of this file): its saved terms (the blocks' inputs
        kept by the checkpoints in place of the blocks' saves under checkpointing), the forward's and the
        backward's high points (op timeline), and the 0-d loss, alive at the loss and through the backward."""
        terms, ce_saved, _ = book_activations(cfg, spec, w, trains, adapted)
        blocks = per_block_all(cfg, spec, w, trains, adapted)
        if spec.checkpointing:
            ops = self.finetune_selective_ops(cfg, spec, w, adapted) if spec.checkpoint_policy == "selective" else None
            terms, backward_points, forward_points = _checkpointed(cfg, spec, w, blocks, terms, train, ops)
        else:
            backward_points = _backward_points(cfg, spec, w, blocks, train)
            forward_points = (_forward_mlp_points(cfg, spec, w, blocks)
                              | _forward_head_points(cfg, spec, w, blocks, terms))
        return {"terms": terms, "ce_saved": ce_saved, "forward_points": forward_points,
                "backward_points": backward_points, "loss_bytes": w.e_ce}

    def finetune_selective_ops(self, cfg, spec, w, adapted: dict) -> list:
        """The block's ops as the selective policy sees them with LoRA's two adapter matmuls after each adapted
        Linear (planner/checkpointing.py with_adapters; the adapters fp32: the book fine-tunes without autocast)."""
        from ..checkpointing import with_adapters

        label = {"att.W_query": "W_query", "att.W_key": "W_key", "att.W_value": "W_value", "att.out_proj": "out_proj",
                 "ff.layers.0": "ff in", "ff.layers.2": "ff out"}
        first = min((lin.block for lin in adapted.values() if lin.block is not None), default=None)
        adapters = {label[lin.module.split(".", 2)[2]]: (lin.n_in, lin.n_out)
                    for lin in adapted.values() if lin.block == first}
        return with_adapters(self.selective_ops(cfg, spec, w), adapters, spec.batch_size * spec.seq_len, spec.lora_r,
                             ADAPTER_BYTES)

    def presets(self) -> dict:
        return {
            "gpt2-small": GPT2Config(**_BASE, emb_dim=768, n_layers=12, n_heads=12),     # 163,037,184 untied
            "gpt2-medium": GPT2Config(**_BASE, emb_dim=1024, n_layers=24, n_heads=16),
            "gpt2-large": GPT2Config(**_BASE, emb_dim=1280, n_layers=36, n_heads=20),
            "gpt2-xl": GPT2Config(**_BASE, emb_dim=1600, n_layers=48, n_heads=25),       # 1,638,022,400 untied
        }

    # planner/estimate/compute.py: peft calls no enable_input_require_grads on a module without
    # get_input_embeddings (below, _lora_recompute's note), so block 0's input needs no grad under checkpointing either
    input_grads_with_checkpointing = False
    infer_kv_cache = False  # generate_text_simple: the whole sequence each step (planner/estimate/compute.py)

    def recompute_replays_last(self, c) -> bool:
        """drop_shortcut after the feed-forward saves its noise when drop_rate > 0 (planner/arch/base.py)."""
        return c.drop_rate > 0

    def attention_input(self, short: str) -> str:
        """planner/estimate/compute.py: the three projections (Linear names W_query, W_key, W_value)."""
        return {"W_query": "q", "W_key": "k", "W_value": "v"}.get(short, "qkv")

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
        """generate_text_simple's peak: the whole context recomputed per token (estimate_generate_text_simple below)."""
        return estimate_generate_text_simple(cfg, ispec)

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
            self._gelu_term(spec, w, bsh),
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
                      Term("attention context copy (out_proj input)", "b*s*h*e_m", bsh * w.e_m, True)]
            if self._cuda_amp(spec, w) and not math_path:
                # CUDA autocast's fp32 list has softmax (torch.softmax(x, dim) without dtype: fp32_set_opt_dtype,
                # aten/src/ATen/autocast_mode.cpp; measured on an H200, tests/data/cuda/2026-11-27-h200
                # autocast-dtypes.json): its output is fp32, and `attn_weights @ values` saves autocast's e_m cast
                # of the probabilities (with dropout: of the fp32 dropped probabilities, whose bool keep-mask the
                # fused native_dropout saves; the fp32 dropped copy itself is not saved). Measured: the book's
                # GPT-2 V1000 h120 a5 b3 s200 eager fp16-AMP, trf_blocks.*.att: softmax fp32 + its fp16 cast
                terms += [Term("softmax output (fp32: CUDA autocast)", "b*a*s^2*4", bas2 * 4, True),
                          Term("probabilities' autocast cast (the second matmul's input)", "b*a*s^2*e_m",
                               bas2 * w.e_m, True)]
                if p:
                    terms.append(Term("attention dropout keep-mask (bool)", "b*a*s^2*1", bas2, True))
            else:
                terms.append(Term("softmax output", "b*a*s^2*" + ("4" if math_path else "e_m"), bas2 * e_s, True))
            if p and not (self._cuda_amp(spec, w) and not math_path):
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

    @staticmethod
    def _cuda_amp(spec, w) -> bool:
        """fp16/bf16 autocast on CUDA, whose fp32 list is longer than the CPU's (pow, softmax, layer_norm, ...)."""
        return w.amp and spec.device_type == "cuda"

    def _gelu_term(self, spec, w, bsh: int) -> Term:
        """The written-out tanh GELU's saved tensors, 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))),
        and its output as ff.layers.2 saves it. CPU (every precision): x (pow), 0.5x, tanh's output, 1 + tanh and
        the output, e_m each. CUDA autocast has pow in its fp32 list (aten/src/ATen/autocast_mode.cpp KERNEL_CUDA(pow,
        fp32); measured on an H200, tests/data/cuda/2026-11-27-h200 autocast-dtypes.json: pow -> float32): pow
        saves autocast's fp32 copy of x, and the chain after it is fp32 by type promotion: tanh's output and
        1 + tanh are fp32; 0.5x stays e_m; ff.layers.2 saves its e_m cast of the fp32 output (measured: the book's
        GPT-2 V1000 h120 b3 s200 fp16-AMP, ff.layers.1 = 3 fp32 + 1 fp16 b*s*4h and the 0-d constant)."""
        if self._cuda_amp(spec, w):
            return Term("GELU saved tensors (x's fp32 copy, tanh, 1+tanh: fp32 under CUDA autocast; 0.5x) and its "
                        "output's cast", "4*b*s*h*(12 + 2*e_m)", 4 * bsh * (12 + 2 * w.e_m), True, where="mlp")
        return Term("GELU saved tensors (x, 0.5x, tanh, 1+tanh) and its output", "5 * b*s*4h*e_m", 20 * bsh * w.e_m,
                    True, where="mlp")

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
            # a later micro-batch (x.g == 0) has added ff.layers.2's weight and bias grads to their .grad in
            # place and freed them before the GELU's backward starts (op timeline: V500 h48 L4 b2 s32 fp32 ckpt
            # accum2, the down projection's f*h + h grads freed before the GELU's two b*s*f muls; +37,048 B before)
            "ffn": x.current + (x.down_n * x.e_p if x.g else 0) + x.bsh * w.e_r + 2 * b * s * f * w.e_m
            - resid_mask - (2 * f * h if w.amp else 0),
            # ff.layers.2's backward at its weight grad's matmul (the bias grad's sum not run yet), before it
            # releases its saved input: the residual's grad (b*s*h*e_r), the input grad (b*s*f*e_m) and the
            # weight grad (f*h, in the weight's working dtype: bf16 under autocast); with residual dropout its
            # noise freed and its backward's output (b*s*h*e_m) alive; under autocast the output grad's bf16 cast
            # (b*s*h*e_m, ToCopyBackward: with residual dropout that output is it; measured under
            # --offload-activations, V500 h48 L4 b2 s32 bf16-AMP ckpt accum2, -6,152 B without it). The top in a
            # later micro-batch, where the
            # grads are added in place right after (op timeline: V97 h96 L2 b4 s8 fp32 ckpt accum2, -98,312 B
            # without it). Not checkpointed, the node still holds its saved input at the bias grad's sum, which
            # is then the top (h more in the weight's working dtype; the same shape without checkpointing, -392 B
            # without it); checkpointed, the recomputed input is released by then
            "ff out": x.current - resid_mask + x.bsh * w.e_r + (x.bsh * w.e_m if resid_mask or w.amp else 0)
            + b * s * f * w.e_m + (f * h + (0 if spec.checkpointing else x.down_n - f * h))
            * (w.e_m if w.amp else x.e_p),
            "mlp_done": x.current - x.mlp_saved - x.casts_mlp + x.mlp_n * x.g + x.pending
            + x.bsh * (w.e_r + w.e_m) + b * s * f * w.e_m,
        }
        if self._cuda_amp(spec, w):  # the GELU's fp32 chain (parts.cuda_amp_tanh_gelu_backward) in place of the
            # CPU's two e_m-wide b*s*f grads
            points["ffn"] += (parts.cuda_amp_tanh_gelu_backward(b * s * f, w.e_m, spec.checkpointing)
                              - 2 * b * s * f * w.e_m)
        if w.amp:
            # ff.layers.2's weight grad made in bf16, then copied to fp32 (ToCopyBackward of autocast's cast): its
            # node has released what it saved (its input, offset by its input grad, and the bf16 weight copy, which
            # the bf16 grad replaces); alive are the residual's grad (b*s*h*e_r), the fp32 copy (f*h*e_p) and the
            # bias's grad still bf16 (h*e_m: its fp32 copy comes after the weight's, fresh grads or not; op
            # timeline: V97 h96 L2 b4 s8 bf16-amp ckpt accum2, -49,352 B without the point; transformers' GPT-2 has
            # the same point, planner/arch/gpt2.py mlp_cast, with its Conv1D's bias grad already fp32)
            points["ff out cast"] = (x.current - resid_mask + x.bsh * w.e_r + f * h * x.e_p
                                     + (x.down_n - f * h) * w.e_m)
            if self._cuda_amp(spec, w):  # the input grad is the GELU's fp32 grad by then (parts.cuda_amp_cast_input_grad)
                points["ff out cast"] += parts.cuda_amp_cast_input_grad(b * s * f, w.e_m)
        if c.attention == "eager" or (c.drop_rate > 0 and spec.device_type == "cpu"):
            points["attention"] = (x.current - x.mlp_saved - x.casts_mlp - x.norm_mlp_saved - resid_mask
                                   - x.bsh * w.e_m  # the output projection's input copy, freed by its backward
                                   + (x.mlp_n + x.attn_n) * x.g + x.bsh * w.e_r
                                   + self._s2_bytes(c, w, spec) * b * c.n_heads * s * s)
        if spec.checkpointing and c.attention == "eager":
            # the recompute's forward softmax (the block's first unpack starts it): the block's output grad
            # (b*s*h*e_r) beside norm1's saved x (the stash), x - mean and norm_x (3*b*s*h*e_r) and std (b*s*e_r),
            # the q/k/v input (3 autocast copies under AMP), the queries, keys and values and the bmm's q and k^T
            # copies (5*b*s*h*e_m), the (ctx, ctx) bool mask, and the scores, their scaled copy and the softmax
            # output (with dropout: the softmax output, the noise and the dropped copy beside the scores), b*a*s^2
            # each (measured: the op timeline of the book's GPT-2 V97 h32 a4 ctx256 b2 s256 fp32 checkpointed,
            # -93,188 B at the softmax backward point alone)
            bas2 = b * c.n_heads * s * s
            points["recompute attention"] = (x.bsh * w.e_r + 3 * x.bsh * w.e_r + b * s * w.e_r
                                             + (3 if w.amp else 1) * x.bsh * w.e_m + 5 * x.bsh * w.e_m
                                             + c.context_length ** 2 + (4 if c.drop_rate > 0 else 3) * bas2 * w.e_m)
            if self._cuda_amp(spec, w):
                # CUDA autocast: the scores (e_m), softmax's fp32 output and the second bmm's e_m cast; with dropout
                # native_dropout's bool mask and its fp32 output (a local until forward returns) beside them, in
                # place of the CPU's e_m scores, scaled copy, softmax output (noise and dropped copy)
                points["recompute attention"] += bas2 * ((2 * w.e_m + 9 if c.drop_rate > 0 else 2 * w.e_m + 4)
                                                         - (4 if c.drop_rate > 0 else 3) * w.e_m)
            if c.drop_rate > 0:  # the recompute runs on to the context (its high point there, measured: the same
                # shape with drop_rate 0.1 fp32, -178,052 B before): v's bmm copy, the context and its copy (b*s*h*e_m
                # each) beside the softmax output, the noise, the dropped copy and the scores
                points["recompute attention"] += 3 * x.bsh * w.e_m
            if w.amp:  # norm1's fp32 output (the copies' source), the output grad's bf16 cast for ff.layers.2's
                # backward, and the recompute's own autocast copies of the q/k/v weights and biases (measured:
                # the same shape in bf16-AMP, -104,648 B without them)
                points["recompute attention"] += (x.bsh * w.e_r + x.bsh * w.e_m
                                                  + 3 * (c.emb_dim + (1 if c.qkv_bias else 0)) * c.emb_dim * w.e_m)
        return points

    def _s2_bytes(self, c: GPT2Config, w, spec) -> int:
        """Net bytes per b*a*s^2 the attention backward adds at its high point (_softmax_backward_data):
        without dropout the probabilities' gradient and the softmax backward's output, both e_m wide;
        with dropout the output and keep-mask die before the softmax backward, which offsets the two
        gradients (measured +0.1..0.35 B, within the bar). SDPA's math fallback below fp32 peaks at the
        matmul backward, where the probabilities' fp32 gradient (4 B) joins the saved set.
        CUDA autocast, eager (softmax on the fp32 list: block_terms): the second bmm's backward releases the e_m
        cast it saved, and the grad goes through that cast's ToCopyBackward to fp32 (4); with dropout, the dropout's
        backward makes a second fp32 grad (4) beside it and the bool mask, without dropout the softmax backward's
        fp32 output does (4): 8 - e_m either way (measured to the byte on the op timeline of a CPU run with CUDA's
        list differences, the book's GPT-2 V97 h32 a4 b2 s256 bf16-AMP, drop_rate 0 and 0.1, checkpointed or not;
        the CPU's figure was 2 (resp. 6) b*a*s^2 under)."""
        if self._cuda_amp(spec, w) and c.attention == "eager":
            return 8 - w.e_m
        if c.drop_rate == 0:
            return 2 * w.e_m
        return 4 if (c.attention == "sdpa" and w.e_m < 4) else 0

    # ---- --offload-activations (planner/estimate/offload_act.py) -------------------------------------------
    def offload_copies(self, c: GPT2Config, spec, w) -> list[Term] | None:
        """What save_on_cpu copies to the host, saved variable by saved variable (measured: a saved_tensors_hooks
        inventory of planner/models/gpt2.py's GPTModel under torch 2.13, V1000 h64 a4 b2 s64 dropout 0.1 and
        V500 h48 b2 s48 dropout 0, eager and SDPA, fp32 and bf16-AMP; the sum equals the pack hook's bytes).
        Per block: each written-out LayerNorm saves x (var), x - mean and std (the division; sqrt saves std too),
        norm_x and the scale (the mul); W_query, W_key, W_value each save their input (e_m: one autocast copy each)
        and weight (e_m; a bias is not saved); the attention: eager q and k^T (the first matmul), the (s, s) bool
        mask (masked_fill_; the slice's own numel), softmax's output, the dropout's noise (drop_rate > 0), v and
        the probabilities (the second matmul; with drop_rate 0 the softmax output saved a second time), all e_m;
        SDPA's math kernel (dropout on the CPU) fp32 q, k^T, v, softmax output, noise and dropped probabilities;
        SDPA's flash kernel q, k, v, output (e_m) and an fp32 (b, a, s) logsumexp; out_proj its input and weight;
        the feed-forward's Linears their inputs and weights, the GELU x (pow), the 0-d sqrt(2/pi) constant, tanh's
        output, 0.5*x and 1 + tanh; each residual dropout its noise (e_m). Outside: the token ids and positions
        (int64), the embedding dropout's noise (e_r), the final norm, out_head's weight (V*h*e_m, untied) and
        input, and the loss: log_softmax's output (saved by itself and by nll_loss), the int64 target and the
        0-d total_weight. Under checkpointing each block's input (b*s*h*e_r) is what save_on_cpu copies."""
        b, s, h, a, V = spec.batch_size, spec.seq_len, c.emb_dim, c.n_heads, c.vocab_size
        bsh, bsf, bas2, f = b * s * h, b * s * 4 * h, b * a * s * s, 4 * h
        e_p = 2 if spec.precision == "bf16" else 4
        p = c.drop_rate > 0

        def ln(label, per_layer=True, where="block"):
            return Term(f"host: LayerNorm ({label}): x, x - mean, norm_x, std x2, scale",
                        "3*b*s*h*e_r + 2*b*s*e_r + h*e_p", 3 * bsh * w.e_r + 2 * b * s * w.e_r + h * e_p, per_layer,
                        where)
        blk = [ln("norm1"), Term("host: W_query, W_key, W_value inputs and weights", "3*b*s*h*e_m + 3*h*h*e_m",
                                 3 * bsh * w.e_m + 3 * h * h * w.e_m, True)]
        if c.attention == "sdpa" and not (p and spec.device_type == "cpu"):
            blk.append(Term("host: SDPA q, k, v, output (e_m) and fp32 logsumexp", "4*b*s*h*e_m + 4*b*a*s",
                            4 * bsh * w.e_m + 4 * b * a * s, True))
        elif c.attention == "sdpa":
            blk.append(Term("host: SDPA math kernel (dropout): fp32 q, k^T, v, softmax output, noise, dropped "
                            "probabilities", "3*b*s*h*4 + 3*b*a*s^2*4", 3 * bsh * 4 + 3 * bas2 * 4, True))
        elif self._cuda_amp(spec, w):
            # CUDA autocast (block_terms): softmax's fp32 output (saved by softmax), the second matmul's e_m cast of
            # the (dropped) probabilities, native_dropout's bool keep-mask
            blk.append(Term("host: eager attention q, k^T, v, the (s, s) bool mask, softmax output (fp32: CUDA "
                            "autocast), " + ("the dropout's bool mask, " if p else "") + "the probabilities' e_m cast",
                            f"3*b*s*h*e_m + s^2 + b*a*s^2*(4 + e_m{' + 1' if p else ''})",
                            3 * bsh * w.e_m + s * s + bas2 * (4 + w.e_m + (1 if p else 0)), True))
        else:
            n_s2 = 3 if p else 2
            e_k = w.e_k if spec.device_type == "cuda" else w.e_m  # CUDA's native_dropout saves a bool mask
            blk.append(Term("host: eager attention q, k^T, v, the (s, s) bool mask, softmax output"
                            + (", dropout noise" if p else "") + ", the probabilities",
                            f"3*b*s*h*e_m + s^2 + {n_s2}*b*a*s^2*e_m" + (" (the mask e_k)" if p and e_k != w.e_m else ""),
                            3 * bsh * w.e_m + s * s + n_s2 * bas2 * w.e_m - (bas2 * (w.e_m - e_k) if p else 0), True))
        blk += [Term("host: out_proj input and weight", "b*s*h*e_m + h*h*e_m", bsh * w.e_m + h * h * w.e_m, True),
                ln("norm2"),
                Term("host: feed-forward: Linear inputs and weights, GELU's x, 0.5*x, tanh, 1 + tanh (e_m) and "
                     "sqrt(2/pi) (0-d fp32)", "b*s*h*e_m + 5*b*s*f*e_m + 2*h*f*e_m + 4",
                     bsh * w.e_m + 5 * bsf * w.e_m + 2 * h * f * w.e_m + 4, True, "mlp")
                if not self._cuda_amp(spec, w) else
                # CUDA autocast: pow saves x's fp32 copy, tanh and 1 + tanh are fp32 (_gelu_term)
                Term("host: feed-forward: Linear inputs and weights, GELU's fp32 x copy, 0.5*x (e_m), fp32 tanh and "
                     "1 + tanh (CUDA autocast), sqrt(2/pi) (0-d fp32)", "b*s*h*e_m + b*s*f*(2*e_m + 12) + 2*h*f*e_m + 4",
                     bsh * w.e_m + bsf * (2 * w.e_m + 12) + 2 * h * f * w.e_m + 4, True, "mlp")]
        e_k = w.e_k if spec.device_type == "cuda" else w.e_m  # CUDA's native_dropout saves a bool mask
        if p:
            blk.append(Term("host: residual dropout noise (attention and feed-forward)" + (" (bool masks)" if e_k == 1
                                                                                          else ""), "2*b*s*h*e_k",
                            2 * bsh * e_k, True, "mlp"))
        if spec.checkpointing:
            blk = [parts.offload_checkpointed_input(b, s, h, w)]
        out = [Term("host: token ids and positions (int64)", "8*b*s + 8*s", 8 * b * s + 8 * s, where="embed")]
        if p:
            e_e = 1 if spec.device_type == "cuda" else w.e_r  # (CUDA: native_dropout's bool mask)
            out.append(Term("host: embedding dropout noise", "b*s*h*" + ("1" if e_e == 1 else "e_r"), bsh * e_e,
                            where="embed"))
        loss = parts.offload_loss_copies(b, s, V, w)
        from ..losses import cuda_amp_cross_entropy
        from .base import resolved_loss

        if cuda_amp_cross_entropy(spec, w, resolved_loss(self, spec)):
            # CUDA autocast's cross_entropy composite (planner/losses.py cuda_amp_cross_entropy): log_softmax's
            # e_m output (saved by itself) and nll_loss's fp32 copy of it, the int64 target, the 0-d total_weight
            loss = Term("host: log_softmax output (e_m), nll_loss's fp32 copy, target, total_weight",
                        "b*s*V*(e_m + 4) + 8*b*s + 4", b * s * V * (w.e_m + 4) + 8 * b * s + 4, where="loss")
        out += [ln("final_norm", per_layer=False, where="head"),
                Term("host: out_head input and weight", "b*s*h*e_m + V*h*e_m", bsh * w.e_m + V * h * w.e_m,
                     where="head"),
                loss]
        return blk + out

    def offload_alive(self, c: GPT2Config, spec, w) -> tuple[int, int, int]:
        """--offload-activations' device terms alive but not saved: no KV cache, nothing held per checkpointed
        block (checkpoint is given the block's input only), the forward's points in offload_forward_points."""
        return 0, 0, 0

    def offload_backward_points(self, c: GPT2Config, spec, w, points: dict[str, int],
                                grads_exist: bool = False) -> dict[str, int]:
        """--offload-activations' backward high points beyond the persistent state (planner/estimate/offload_act.py).
        Checkpointed: the generic sweep's points (the recomputed block on the device, the stashed inputs on the
        host) without the saved tensors outside the blocks, host copies now: the positions (8*s int64) and the
        embedding dropout's noise (b*s*h*e_r). Not checkpointed: every saved tensor is a host copy, so a node's
        backward holds the grads made so far (G), the residual stream's grad (b*s*h*e_r), its incoming grad and
        what it makes (measured on the op timelines of V1000 h64 a4 b2 s64 dropout 0.1 and V500 h48 b2 s48
        dropout 0, fp32 and bf16-AMP, each point to the byte; e_w: the weight grad's dtype, bf16 under autocast,
        then copied to the fp32 .grad, the bias's copy after the weight's: the "cast" points; 2*e_ce: the 0-d
        loss's grad and grad_output). The block is transformers' GPT-2's with three q/k/v Linears and a
        written-out LayerNorm, so the points are planner/arch/gpt2.py's:
          head:       logits' grad (b*s*V*e_ce; under autocast its bf16 cast too), out_head's weight grad (V*h*e_w)
                      and input grad (b*s*h*e_m); under autocast the weight grad's fp32 copy beside the bf16 one
          ff out:     its input grad (b*s*f*e_m), weight and bias grads (e_w), the residual dropout's grad
          ffn:        the GELU's backward: its incoming grad and five b*s*f*e_m temporaries (x^2, 3*x^2, ...)
          ff in:      its input grad (b*s*h*e_m), the GELU's grad (b*s*f*e_m), weight and bias grads; under
                      autocast the input grad's fp32 copy (b*s*h*e_r) and the weight grad's
          norm:       the LayerNorm's backward: five b*s*h*e_r (its incoming grad, (x - mean)'s and std's chains)
          attention:  eager: v's grad (b*s*h*e_m) and two b*a*s^2*e_m (the probabilities' grad, then softmax's,
                      the division's and masked_fill's backward one at a time); SDPA's math kernel (dropout on the
                      CPU) in fp32, as transformers' GPT-2's
        grads_exist (a later micro-batch of --grad-accum; every .grad there, counted by the caller): a new grad is
        added in place to its .grad and freed, so the grads "made before" a point are none (the head is untied:
        nothing held apart), and a node's own weight grads (and their fp32 copies under autocast) are the
        transients they were (measured on the op timeline: V1000 h64 a4 p0.1 b2 s64 and V500 h48 L4 b2 s32 accum 2,
        fp32 and bf16-AMP; without it the grads were counted twice, +6.4% / +15.7%). Checkpointed: the generic
        sweep's later points already are."""
        b, s, h, a, V, L = spec.batch_size, spec.seq_len, c.emb_dim, c.n_heads, c.vocab_size, c.n_layers
        f, bsh, bsV = 4 * h, b * s * h, b * s * c.vocab_size
        bsf = b * s * f
        if spec.checkpointing:
            # the embedding dropout's saved noise as the step without offloading counts it (embed_dropout_terms):
            # b*s*h*e_r on the CPU, CUDA's native_dropout a 1-byte mask (measured on an H200,
            # tests/data/cuda/2026-11-27-h200: V1000 h64 a4 p0.1 b2 s64 fp32 checkpointed, the backward 3*b*s*h low
            # with b*s*h*e_r taken off)
            noise = bsh * (1 if spec.device_type == "cuda" else w.e_r)
            outside = 8 * s + (noise if c.drop_rate > 0 else 0)
            return {k: v - outside if "block" in k else v for k, v in points.items()}
        e_p = 2 if spec.precision == "bf16" else 4
        e_w, amp, tail = w.e_m, w.amp, 2 * w.e_ce
        # parameter counts (inventory): norm1/norm2 scale and shift, W_query/W_key/W_value (qkv_bias), out_proj,
        # the feed-forward's two Linears; the head: out_head (untied, no bias) and final_norm
        ln, qkv, out_proj = 2 * h, 3 * (h * h + (h if c.qkv_bias else 0)), h * h + h
        ff_in, ff_out = h * f + f, f * h + h
        block = 2 * ln + qkv + out_proj + ff_in + ff_out
        head = V * h + 2 * h
        out = {"head": max(bsV * (w.e_ce + (w.e_m if amp else 0)),
                           bsV * w.e_m + V * h * e_w + bsh * w.e_m,
                           V * h * (e_w + e_p) + bsh * w.e_r if amp else 0) + tail}
        drop = bsh * w.e_m if c.drop_rate > 0 else 0
        made = 0 if grads_exist else e_p  # bytes per parameter of the grads made before a point (kept apart)
        for where, g0 in (("last block", head), ("first block", head + (L - 1) * block)):
            G = g0 * made + bsh * w.e_r + tail  # the grads made before the block and the residual stream's grad
            mlp = G + (ff_out + ff_in + ln) * made  # the feed-forward's and norm2's grads made
            pts = {"ff out": G + drop + bsf * w.e_m + ff_out * e_w,
                   "ffn": G + ff_out * made + 6 * bsf * w.e_m,
                   "ff in": G + ff_out * made + bsh * w.e_m + bsf * w.e_m + ff_in * e_w,
                   "norm2": mlp + 5 * bsh * w.e_r}
            if amp:
                pts["ff out cast"] = G + bsf * w.e_m + f * h * (e_w + e_p) + h * e_w
                pts["ff in cast"] = G + ff_out * made + bsh * w.e_r + h * f * (e_w + e_p) + f * e_w
            if c.attention == "eager":
                pts["attention"] = mlp + out_proj * made + bsh * w.e_m + 2 * b * a * s * s * w.e_m
            elif c.drop_rate > 0 and spec.device_type == "cpu":
                pts["attention"] = mlp + out_proj * made + bsh * 4 + 2 * b * a * s * s * 4
            out.update({f"{where} {k}": v for k, v in pts.items()})
        return out

    def offload_forward_points(self, c: GPT2Config, spec, w) -> dict[str, int]:
        """--offload-activations' forward high points in the last block beyond the persistent state and autocast's
        cache (planner/estimate/offload_act.py adds those), read off the op timeline (V1000 h64 a4 b2 s64 dropout
        0.1, V500 h48 b2 s48 and V97 h32 a4 b2 s256 dropout 0, fp32 and bf16-AMP). Alive throughout: GPTModel's
        locals tok_embeds (b*s*h*e_r) and pos_embeds (s*h*e_r) and its x, the first block's input (b*s*h*e_r),
        and from the second block on trf_blocks' input, the last block's (b*s*h*e_r).
          attention (eager): norm1's output (b*s*h*e_r), keys, queries, values (3*b*s*h*e_m), the full-context
                 mask.bool() (c^2 bytes, a local until forward returns), and attn_scores, its scaled copy and
                 softmax's output (b*a*s^2*e_m each); with dropout the scaled copy is gone by then and the noise
                 and the dropped probabilities join (four)
          mlp:   the residual (shortcut) and norm2's output (b*s*h*e_r each), the first Linear's output and the
                 GELU's 0.5*x, pow(x, 3) and 0.044715*pow (4*b*s*f*e_m) and the 0-d sqrt(2/pi) (4 B)
          attention (SDPA's math kernel, dropout on the CPU): as transformers' GPT-2's (planner/arch/gpt2.py)
          head:  final_norm's output (b*s*h*e_r; trf_blocks' input is gone), its autocast copy and the logits
        Autocast has not cast the later weights yet: out_proj's and the feed-forward's at the attention, the
        second Linear's at the MLP, and out_head's (V*h) at both: (their numel)*e_m less than its whole cache."""
        b, s, h, a, V, L = spec.batch_size, spec.seq_len, c.emb_dim, c.n_heads, c.vocab_size, c.n_layers
        f, bsh = 4 * h, b * s * h
        e_c = w.e_m if w.amp else 0  # autocast's copies
        # under checkpointing GPTModel's x is reassigned block by block: the first block's input is gone
        held = bsh * w.e_r + s * h * w.e_r + bsh * w.e_r * (2 if L > 1 and not spec.checkpointing else 1)
        points = {"mlp": held + 2 * bsh * w.e_r + 4 * b * s * f * w.e_m + 4 - (f * h + h + V * h) * e_c,
                  "head": bsh * w.e_r + s * h * w.e_r + bsh * w.e_r + bsh * e_c + b * s * V * w.e_m}
        if c.attention == "eager":
            n_s2 = 4 if c.drop_rate > 0 else 3
            points["attention"] = (held + bsh * w.e_r + 3 * bsh * w.e_m + c.context_length ** 2
                                   + n_s2 * b * a * s * s * w.e_m
                                   - (h * h + h + h * f + f + f * h + h + V * h) * e_c)
        elif c.drop_rate > 0 and spec.device_type == "cpu":
            # SDPA's math kernel (dropout on the CPU), as in transformers' GPT-2 (planner/arch/gpt2.py): fp32 copies
            # of q, k, v below fp32, the fp32 (s, s) causal mask, k's contiguous copy (b*s*h*4) and three fp32
            # b*a*s^2 (the probabilities, the dropout's noise and its output)
            points["attention"] = (held + bsh * w.e_r + 3 * bsh * w.e_m + (3 * bsh * 4 if w.e_m < 4 else 0)
                                   + s * s * 4 + bsh * 4 + 3 * b * a * s * s * 4
                                   - (h * h + h + h * f + f + f * h + h + V * h) * e_c)
        return points

    def offload_loss_held(self, c: GPT2Config, spec, w) -> int:
        """Beside the logits in the loss: calc_loss_batch runs the loss after GPTModel.forward returned, so none
        of its locals; the targets are the step's inputs (counted there) and flattened as a view."""
        return 0

    # ---- the real model -------------------------------------------------------------------------------
    def selective_ops(self, c: GPT2Config, spec, w) -> list:
        """The book's block (planner/models/gpt2.py): W_key, W_query, W_value in the book's order (keys first:
        with LoRA's adapter matmuls among them, the order decides which the every-second-mm rule keeps; measured,
        V500 h48 b2 s32 LoRA r8 on W_query, W_value selective: W_key's, W_query's lora_A, W_value's and its lora_B
        outputs kept) (aten.mm without qkv_bias, addmm with it), the attention (eager: `@` is bmm; sdpa: the CPU
        flash kernel unless dropout runs the math path), out_proj and the feed-forward's two Linears (biased:
        addmm)."""
        from .decoder import attention_op, linear_op

        b, s, h = spec.batch_size, spec.seq_len, c.emb_dim
        n, a, d = b * s, c.n_heads, c.emb_dim // c.n_heads
        flash = c.attention == "sdpa" and not (c.drop_rate > 0 and spec.device_type == "cpu")
        return ([linear_op(name, n, h, h, c.qkv_bias, w) for name in ("W_key", "W_query", "W_value")]
                + [attention_op("sdpa" if flash else "eager", b, s, a, d, w, spec=spec), linear_op("out_proj", n, h, h, True, w),
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


# ---- fine-tuning (issue #12; moved here from planner/estimate/finetune_book.py, issue #19) ----------------
# (planner/estimate/finetune.py estimate_own_step builds the step's phases from finetune_step's terms)
# Peak memory of a fine-tuning step on the book's GPT-2 (issue #12; planner/models/gpt2.py, no torch).
#
# The book's block is not transformers' RMSNorm decoder (planner/estimate/finetune.py): its LayerNorm is
# written out (mean, var, (x - mean) / sqrt(var + eps), scale * norm_x + shift), its MLP is Linear, the
# tanh GELU written out, Linear (not gated), its attention is the book's own (q @ k^T, masked_fill_ with the
# block's registered mask buffer .bool(), / sqrt(d), softmax, dropout, @ v), and nn.Dropout(drop_rate)
# follows the embeddings, the attention probabilities and both residual branches.
#
# Autograd saves of an op's inputs only what the grads it must compute need (torch's derivatives.yaml),
# so the saved set follows from what needs grad, walked through the block in order:
#   - var(x) saves x; (x - mean) / std saves x - mean and std; sqrt saves its result (std): when x needs grad;
#     scale * norm_x saves norm_x when the scale trains (the shift's add saves nothing);
#   - a Linear saves its input when its weight trains (a frozen Linear only its weight, a parameter);
#   - a @ b saves b for a's grad and a for b's grad; masked_fill_ its mask (the full context x context
#     bool copy of the buffer, sliced: one c^2-byte storage) and softmax its output, when the scores need
#     grad; CPU dropout is input * noise (aten Dropout.cpp's non-fused path): it saves the noise (input
#     dtype) when the input needs grad, and p = 0 returns the input itself (saves nothing);
#   - the GELU saves x (pow), the sqrt(2/pi) constant (0-d fp32), tanh's output, 0.5 * x and 1 + tanh;
#   - a peft LoRA adapter (peft/tuners/lora/layer.py Linear.forward: result + lora_B(lora_A(dropout(x))) *
#     scaling, x cast to the fp32 adapter dtype first) saves lora_A's input (x itself on an fp32 base at
#     p = 0, an fp32 copy on a bf16 base, the dropout's output with its fp32 noise when x needs grad) and
#     lora_B's input (lora_A's b*s*r fp32 output); each adapter casts and drops out on its own.
# The embeddings never train in a fine-tuning step (--train-layers keeps them frozen, LoRA wraps Linears
# only) and peft calls no enable_input_require_grads on a module without get_input_embeddings, so the
# blocks' input needs no grad until the first trainable weight.
# With checkpointing (GPTModel: `checkpoint(block, x, use_reentrant=False)` per block) a block that saves
# anything keeps its input, and backward recomputes it (the same saved set) before its backward.
# Every count is checked against the saved-tensor inventory and the live-bytes op timeline of the real
# model (planner.measure.tracker) in tests/test_finetune.py and `python -m planner bench finetune`.

ADAPTER_BYTES = parts.ADAPTER_BYTES  # peft autocast_adapter_dtype=True: fp32 adapters (planner/arch/parts.py)


def check_finetune(cfg, spec) -> None:
    if cfg.attention != "eager":
        raise ConfigError("fine-tuning the book's GPT-2 is estimated with its own attention (attention eager) "
                          "so far, not sdpa")
    if spec.autocast_dtype is not None:
        raise ConfigError("fine-tuning under autocast (fp16-amp / bf16-amp) is not modelled yet; use fp32 or a bf16 "
                          "base (--precision bf16: peft keeps the adapters fp32)")
    if spec.grad_accum > 1:
        raise ConfigError("fine-tuning with gradient accumulation is not modelled yet")
    if getattr(spec, "quantize_base", "none") != "none":
        raise ConfigError("a quantized base (QLoRA) is not modelled for the book's GPT-2 yet")


# The block's ops in forward order (Term.part): backward meets them in reverse, freeing each one's saved
# tensors as it runs (torch releases a node's saved variables after its apply, retain_graph=False).
NODES = ("norm1", "attn.in", "scores", "mask", "softmax", "attn.dropout", "context", "attn.out", "resid.dropout1",
         "norm2", "mlp.in", "gelu", "mlp.out", "resid.dropout2")


def _layernorm(label: str, node: str, b: int, s: int, h: int, e: int, rg_in: bool, trains: bool,
               per_layer: bool = True, where: str = "block") -> list[Term]:
    """The book's LayerNorm: var(x) saves x, (x - mean) / std saves x - mean and std (sqrt's result), when
    x needs grad; scale * norm_x saves norm_x when the scale trains."""
    terms = []
    if rg_in:
        terms.append(Term(f"{label}: x, x - mean, std (input needs grad)", "2*b*s*h*e + b*s*e",
                          2 * b * s * h * e + b * s * e, per_layer, where, node))
    if trains:
        terms.append(Term(f"{label}: norm_x (scale trains)", "b*s*h*e", b * s * h * e, per_layer, where, node))
    return terms


def block_saved(cfg, spec, w, i: int, g: bool, trains: set, adapted: dict) -> tuple[list[Term], bool]:
    """Block i's saved tensors (Term.part: its node in NODES), given whether its input needs grad; and
    whether its output needs grad."""
    b, s, h, a = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.n_heads
    e = w.e_r
    bsh, bas2, f = b * s * h, b * a * s * s, 4 * h
    p = cfg.drop_rate > 0
    pre = f"trf_blocks.{i}"
    w_trains = lambda m: f"{pre}.{m}.weight" in trains
    terms: list[Term] = []
    shared: set = set()

    def linear_group(node: str, mods: tuple[str, ...], x_rg: bool, n_in: int, key: str) -> dict[str, bool]:
        """Linears reading one input: the input saved once if a weight trains, and each adapter's tensors;
        returns module -> whether its output needs grad."""
        out = {}
        if any(w_trains(m) for m in mods):
            terms.append(Term(f"{node} input (weights train)", "b*s*in*e", b * s * n_in * e, True, part=node))
            shared.add(key)
        for m in mods:
            lora = f"{pre}.{m}" in adapted
            if lora:
                terms.extend(parts.lora_adapter(m, b, s, n_in, spec, e, x_rg, shared, key, part=node))
            out[m] = x_rg or lora or w_trains(m)
        return out

    terms += _layernorm("norm1", "norm1", b, s, h, e, g, f"{pre}.norm1.scale" in trains)
    n1 = g or f"{pre}.norm1.scale" in trains
    qkv = linear_group("attn.in", ("att.W_query", "att.W_key", "att.W_value"), n1, h, "n1")
    q, k, v = qkv["att.W_query"], qkv["att.W_key"], qkv["att.W_value"]
    scores = q or k
    if scores:
        # queries @ keys.transpose(2, 3): k^T for q's grad, q for k's grad (bmm operands, b*a*s*d each)
        terms.append(Term("attention q / k^T (as the grads need them)", "n*b*s*h*e", (int(q) + int(k)) * bsh * e,
                          True, part="scores"))
        terms.append(Term("causal mask.bool() (full context)", "c^2 * 1 B", cfg.context_length ** 2, True,
                          part="mask"))
        terms.append(Term("softmax output", "b*a*s^2*e", bas2 * e, True, part="softmax"))
    probs_saved_by_softmax = scores
    ek = parts.dropout_mask_bytes(spec, e)  # the dropout's saved noise (e), on CUDA native_dropout's bool mask
    if p and scores:
        terms.append(Term("attention dropout noise", "b*a*s^2*e_k", bas2 * ek, True, part="attn.dropout"))
    if v:
        # attn_weights @ values saves the weights for v's grad: the dropout's output, or (p = 0) the softmax
        # output itself when softmax saved it
        if p or not probs_saved_by_softmax:
            terms.append(Term("attention weights (for v's grad)", "b*a*s^2*e", bas2 * e, True, part="context"))
    if scores:
        terms.append(Term("attention v (for the weights' grad)", "b*s*h*e", bsh * e, True, part="context"))
    ctx_rg = scores or v
    o = linear_group("attn.out", ("att.out_proj",), ctx_rg, h, "ctx")
    o_rg = o["att.out_proj"]
    if p and o_rg:
        terms.append(Term("attention residual dropout noise", "b*s*h*e_k", bsh * ek, True, part="resid.dropout1"))
    r_rg = g or o_rg
    terms += _layernorm("norm2", "norm2", b, s, h, e, r_rg, f"{pre}.norm2.scale" in trains)
    n2 = r_rg or f"{pre}.norm2.scale" in trains
    up = linear_group("mlp.in", ("ff.layers.0",), n2, h, "n2")["ff.layers.0"]
    if up:
        terms.append(Term("GELU x, 0.5*x, tanh, 1 + tanh", "4*b*s*4h*e", 4 * b * s * f * e, True, part="gelu"))
        terms.append(Term("GELU sqrt(2/pi) constant", "4 B (0-d fp32)", 4, True, part="gelu"))
    down = linear_group("mlp.out", ("ff.layers.2",), up, f, "gelu")["ff.layers.2"]
    if p and down:
        terms.append(Term("feed-forward residual dropout noise", "b*s*h*e_k", bsh * ek, True, part="resid.dropout2"))
    return terms, r_rg or down


def book_activations(cfg, spec, w, trains: set, adapted: dict) -> tuple[list[Term], int, list[list[Term]]]:
    """Saved tensors of the forward and the loss, the bytes the loss saved (ce_saved), and each block's
    saved set (empty for a block whose output needs no grad: backward never reaches it)."""
    b, s, h, V = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.vocab_size
    e = w.e_r
    terms: list[Term] = []
    per_block: list[list[Term]] = []
    g = False  # the embeddings are frozen: the embedding dropout saves no noise, the first block's input needs no grad
    for i in range(cfg.n_layers):
        blk, g_out = block_saved(cfg, spec, w, i, g, trains, adapted)
        terms += blk
        per_block.append(blk if g_out else [])
        g = g_out
    terms += _layernorm("final norm", "final_norm", b, s, h, e, g, "final_norm.scale" in trains, False, "head")
    if "out_head.weight" in trains:
        terms.append(Term("out_head input (head trains)", "b*s*h*e", b * s * h * e, where="head", part="head"))
    # calc_loss_batch: F.cross_entropy = log_softmax (saves its output) + nll_loss (saves the target, a view of
    # the batch, and total_weight, 0-d in the logits' dtype)
    ce_saved = b * s * V * w.e_ce + w.e_ce
    terms.append(Term("log_softmax output + nll total_weight", "b*s*V*e + e", ce_saved, where="loss"))
    return terms, ce_saved, per_block


def per_block_all(cfg, spec, w, trains: set, adapted: dict) -> list[list[Term]]:
    """Every block's saved set as the forward makes it (reached by backward or not)."""
    out, g = [], False
    for i in range(cfg.n_layers):
        blk, g = block_saved(cfg, spec, w, i, g, trains, adapted)
        out.append(blk)
    return out


def _upto(blk: list[Term], node: str, inclusive: bool = True) -> int:
    """Bytes block `blk` has saved by the end of `node` (or before it)."""
    k = NODES.index(node)
    return sum(t.bytes for t in blk if NODES.index(t.part) < k or (inclusive and t.part == node))


def _forward_mlp_points(cfg, spec, w, blocks: list[list[Term]], earlier: int | None = None,
                        loop: bool = False) -> dict[str, int]:
    """The forward's high points in the last block's feed-forward (read off the op timeline), above the
    persistent base: everything the earlier blocks saved, what the last one saved before its GELU, and
    alive without being saved: GPTModel.forward's tok_embeds, pos_embeds and x (the embeddings' sum, or
    its dropout), nn.Sequential's `input` (the last block's input, when there are two blocks or more),
    the block's `shortcut` (the residual after attention) and the feed-forward's input.
      gelu: at 0.044715 * pow(x, 3): x, 0.5 * x, pow's output and the product (b*s*4h each), and the
            sqrt(2/pi) constant;
      down: when the GELU's input needs grad, its four saved tensors and its output, and beside them the
            second Linear's output (b*s*h);
      up adapter / down adapter: peft's forward on an adapted ff.layers.0 / ff.layers.2.
    earlier: what the blocks before the last hold (default: their saved sets); loop: GPTModel's checkpointing
    loop runs the blocks (every:K with the last block not checkpointed), not nn.Sequential: GPTModel's x is
    the last block's input (no Sequential `input` beside the embeddings' sum)."""
    b, s, h = spec.batch_size, spec.seq_len, cfg.emb_dim
    e = w.e_r
    bsh, bsf = b * s * h, b * s * 4 * h
    last = blocks[-1]
    if earlier is None:
        earlier = sum(t.bytes for blk in blocks[:-1] for t in blk)
    before_gelu = earlier + _upto(last, "mlp.in")
    block_input_saved = any(t.part == "norm1" and "x, x - mean" in t.name for t in last)
    resid_saved = any(t.part == "norm2" and "x, x - mean" in t.name for t in last)
    n2_saved = any(t.part == "mlp.in" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                   for t in last)
    # tok_embeds and pos_embeds, the embeddings' sum (GPTModel's x) and nn.Sequential's input (the last block's),
    # or in the loop GPTModel's x, the last block's input
    fixed = (bsh * e + s * h * e + (0 if block_input_saved else bsh * e) if loop
             else 2 * bsh * e + s * h * e + (bsh * e if cfg.n_layers > 1 and not block_input_saved else 0))
    alive = fixed + (0 if resid_saved else bsh * e) + (0 if n2_saved else bsh * e)
    points = {"forward gelu": before_gelu + alive + 4 * bsf * e + 4,
              "forward attention": _forward_attention_point(cfg, spec, w, blocks, earlier, fixed)}
    if any(t.part == "gelu" for t in last):
        points["forward down"] = before_gelu + alive + 5 * bsf * e + 4 + bsh * e
    lora = lambda node: any(t.part == node and "lora_A output" in t.name for t in last)
    # on a bf16 base with lora_dropout > 0 the fp32 copy of x (peft's _cast_input_dtype, its local `x`) is
    # alive, not saved, until the adapter's forward returns (at p = 0 it is saved: counted already)
    fp32_x = lambda n: n * ADAPTER_BYTES if e != ADAPTER_BYTES and spec.lora_dropout > 0 else 0
    if lora("mlp.in"):
        # peft's Linear.forward on ff.layers.0, at `result + lora_B(...) * scaling`: the base result (e), the
        # scaled lora_B output and the sum (fp32: the adapter dtype wins the promotion), b*s*4h each
        points["forward up adapter"] = before_gelu + alive + bsf * (e + 2 * ADAPTER_BYTES) + fp32_x(bsh)
    if lora("mlp.out"):
        # the same on ff.layers.2 (b*s*h each), beside the GELU's saved tensors and output and the adapter's
        # saved tensors
        gelu_out_saved = any(t.part == "mlp.out" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                             for t in last)  # counted once: among the GELU's five, and saved
        points["forward down adapter"] = (before_gelu + alive + (5 if any(t.part == "gelu" for t in last) else 1)
                                          * bsf * e + 4 + _upto(last, "mlp.out") - _upto(last, "gelu")
                                          - (bsf * e if gelu_out_saved else 0)
                                          + bsh * (e + 2 * ADAPTER_BYTES) + fp32_x(bsf))
    return points


def _forward_attention_point(cfg, spec, w, blocks: list[list[Term]], held: int, fixed: int) -> int:
    """The forward's high point in the last block's attention (op timeline), above the persistent base:
    `held` (what the earlier blocks keep: their saved sets, or their stashed inputs under checkpointing),
    `fixed` (GPTModel.forward's and nn.Sequential's locals: tok_embeds, pos_embeds, the embeddings' sum,
    the block's input), what the block saved before its attention (its norm1, the q/k/v adapters; none
    under checkpointing), norm1's output unless saved, the locals queries, keys, values (b*s*h each) and
    mask_bool (the c x c bool copy), the bmm operands q and k^T when saved, and the s x s tensors alive:
    at the softmax the scores, their scaled copy and the softmax output; with dropout after it the scores,
    the softmax output, the dropout's noise and its output (b*a*s^2 each; on CUDA native_dropout's bool mask in
    place of the noise, b*a*s^2 bytes: measured on an H200, tests/data/cuda/2026-11-27-h200 explain.jsonl.gz,
    V97 h32 a4 s128 p0.1 head fp32, alive at the peak: bmm's scores, _softmax's and native_dropout's fp32
    [2, 4, 128, 128] and its bool mask)."""
    b, s, h, a = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.n_heads
    e = w.e_r
    bsh, bas2 = b * s * h, b * a * s * s
    last = blocks[-1]
    n1_saved = any(t.part == "attn.in" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                   for t in last)
    qk = sum(t.bytes for t in last if t.part == "scores")
    drop = bas2 * parts.dropout_mask_bytes(spec, e) if cfg.drop_rate > 0 else 0
    return (held + fixed + _upto(last, "attn.in") + (0 if n1_saved else bsh * e) + 3 * bsh * e + qk
            + cfg.context_length ** 2 + 3 * bas2 * e + drop)


def _forward_head_points(cfg, spec, w, blocks: list[list[Term]], terms: list[Term]) -> dict[str, int]:
    """The forward's high points after the blocks (op timeline), above the persistent base: every block's
    saved tensors, GPTModel.forward's tok_embeds and pos_embeds (x, the embeddings' sum, is rebound to the
    blocks' output), and
      final norm: at `scale * norm_x + shift`: its input x (the blocks' output), the locals mean and var
                  (b*s each), norm_x, the product and the sum (b*s*h each; a saved one counts once);
      logits: the final norm's output and the logits (b*s*V)."""
    b, s, h, V = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.vocab_size
    e = w.e_r
    bsh = b * s * h
    blocks_saved = sum(t.bytes for blk in blocks for t in blk)
    head_terms = [t for t in terms if t.where == "head"]
    rg = any("x, x - mean" in t.name for t in head_terms)
    norm_x_saved = any("norm_x" in t.name for t in head_terms)
    head_input_saved = any(t.part == "head" for t in head_terms)
    norm_saved = sum(t.bytes for t in head_terms if t.part == "final_norm")
    fixed = blocks_saved + bsh * e + s * h * e
    return {
        "forward final norm": fixed + norm_saved + (0 if rg else bsh * e) + 2 * b * s * e
        + (0 if norm_x_saved else bsh * e) + 2 * bsh * e,
        "forward logits": fixed + sum(t.bytes for t in head_terms) + (0 if head_input_saved else bsh * e)
        + b * s * V * w.e_m,
    }


def _stashes(cfg, spec, w, blocks: list[list[Term]]) -> list[int]:
    """Each block's input kept by its checkpoint (torch.utils.checkpoint use_reentrant=False: the recompute
    closure holds the block's args while a saved-tensor holder of the block is alive; a block that saves
    nothing, frozen with an input that needs no grad, keeps none)."""
    bsh = spec.batch_size * spec.seq_len * cfg.emb_dim
    return [bsh * w.e_r if blk else 0 for blk in blocks]


def _checkpointed(cfg, spec, w, blocks: list[list[Term]], terms: list[Term], train, ops: list | None = None):
    """GPTModel with gradient_checkpointing: `x = checkpoint(block, x, use_reentrant=False)` per block
    (every:K: blocks 0, K, 2K, ...; the others `x = block(x)` in the same loop, keeping their saved sets).
    The forward keeps only the checkpointed blocks' stashed inputs; backward recomputes each such block it
    reaches (saving the same set as without checkpointing: the recompute runs on the same inputs) and then
    runs its backward; an uncheckpointed block's points are _backward_points' on its saved set. selective
    (`ops`: the block's ops, BookGPT2.finetune_selective_ops): every block checkpointed, and each block whose
    backward runs (one with an autograd graph) keeps the outputs the policy saves (planner/checkpointing.py
    selective_saved) from its forward to its recompute, which takes them over (the same tensors full
    checkpointing's recompute makes); when the block's last op is one of them it stays beside the recompute
    through the block's backward (planner/estimate/finetune.py selective_tail says why). Returns the saved
    terms, the backward's and the forward's high points (read off the op timeline)."""
    from ..checkpointing import checkpointed_blocks, saved_ops, selective_saved

    b, s, h = spec.batch_size, spec.seq_len, cfg.emb_dim
    e = w.e_r
    bsh, bsf = b * s * h, b * s * 4 * h
    L = cfg.n_layers
    ckpt = set(checkpointed_blocks(spec.checkpoint_policy, L))
    stash = [x if i in ckpt else 0 for i, x in enumerate(_stashes(cfg, spec, w, blocks))]
    cache = [selective_saved(ops) if ops is not None and blocks[i] else 0 for i in range(L)]
    cached_last = ops[-1][2] if ops and saved_ops(ops) and saved_ops(ops)[-1] is ops[-1] else 0
    kept = [stash[i] + cache[i] if i in ckpt else sum(t.bytes for t in blocks[i]) for i in range(L)]  # to backward
    out = [Term("checkpointed block inputs (blocks that save)", "n*b*s*h*e", sum(stash), where="ckpt")]
    if any(cache):
        out.append(Term("selective checkpointing: the outputs the policy saves (every second mm)",
                        "blocks with a graph * odd aten.mm outputs", sum(cache), where="ckpt"))
    out += [dataclasses.replace(t, name=f"block {i} (not checkpointed: {spec.checkpoint_policy}): {t.name}",
                                per_layer=False, where="ckpt")
            for i, blk in enumerate(blocks) if i not in ckpt for t in blk]
    out += [t for t in terms if not t.per_layer]
    last = blocks[-1]
    lora = lambda blk, node: any(t.part == node and "lora_A output" in t.name for t in blk)
    # forward: GPTModel.forward's tok_embeds and pos_embeds, the stashes, the last block's input (its
    # loop variable x), the residual after attention and the feed-forward's input, and the GELU at
    # 0.044715 * pow(x, 3) (x, 0.5 * x, pow and the product, b*s*4h each; nothing is saved inside)
    # the last block's own cached outputs made before a point: before its attention, before ff.layers.2
    saved = saved_ops(ops) if ops and cache[-1] else []
    made_before = lambda k: sum(op[2] for op in saved if ops.index(op) < k)
    at_attention = made_before(next((k for k, op in enumerate(ops) if op[1] in ("bmm", "sdpa", "sdpa-recomputed")), 0)) if saved else 0
    at_gelu = made_before(next((k for k, op in enumerate(ops) if op[0] == "ff out"), 0)) if saved else 0
    alive = bsh * e + s * h * e + sum(kept[:-1]) + at_gelu + 3 * bsh * e
    forward = {"forward gelu": alive + 4 * bsf * e + 4,
               "forward attention": _forward_attention_point(cfg, spec, w, [[]], sum(kept[:-1]) + at_attention,
                                                             bsh * e + s * h * e + bsh * e)}
    if L - 1 not in ckpt:  # the last block runs on its own saved set (its points as without checkpointing)
        forward = _forward_mlp_points(cfg, spec, w, blocks, earlier=sum(kept[:-1]), loop=True)
    elif lora(last, "mlp.in"):
        # peft's forward on ff.layers.0: the base result, the scaled lora_B output and their fp32 sum, and
        # (bf16 base) the fp32 copy of the input
        forward["forward up adapter"] = alive + bsf * (e + 2 * ADAPTER_BYTES) + (
            bsh * ADAPTER_BYTES if e != ADAPTER_BYTES else 0)
    forward |= _forward_head_points(cfg, spec, w, [[Term("kept", "", sum(kept))]], terms)
    grads_by_block, head = _block_grads(cfg, train)
    points = {}
    grads = head
    for i in range(cfg.n_layers - 1, -1, -1):
        blk = blocks[i]
        if not blk:
            continue
        if i not in ckpt:
            points.update(_saved_block_points(cfg, spec, w, blk, i, sum(kept[:i]), grads, grads_by_block[i]))
            grads += grads_by_block[i]["mlp.out"] + grads_by_block[i]["rest"]
            continue
        # the block's input is its stash: norm1 saves that very tensor when it needs grad
        dup = bsh * e if any(t.part == "norm1" and "x, x - mean" in t.name for t in blk) else 0
        held = sum(kept[:i]) + stash[i] - dup + (cached_last if cache[i] else 0)
        made = grads + grads_by_block[i]["mlp.out"]
        if lora(blk, "mlp.out"):
            # the recompute (started by the first unpack of the block's saved tensors; early stop ends it at
            # the last one saved) at ff.layers.2's adapter, beside the block's input (stash), the block
            # output's grad and: without residual dropout, the grad scaled for lora_B (fp32) made before
            # lora_B's backward unpacks, and on a bf16 base AddBackward's grad cast back for the base
            # result (the recompute is at lora_A); with residual dropout,
            # the dropout's noise is the first unpack, and the recompute runs through the adapter to
            # `result + lora_B(...) * scaling` (lora_B's output and its scaled copy, fp32). Alive unsaved:
            # the feed-forward's input, the GELU's output, the fp32 copy of it on a bf16 base with
            # lora_dropout, and the base layer's result (measured on the op timeline)
            n2_saved = any(t.part == "mlp.in" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                           for t in blk)
            out_saved = any(t.part == "mlp.out" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                            for t in blk)
            tail = (2 * bsh * ADAPTER_BYTES if cfg.drop_rate > 0
                    else bsh * ADAPTER_BYTES + (bsh * e if e != ADAPTER_BYTES else 0))
            points[f"block {i} recompute down adapter"] = (
                held + _upto(blk, "mlp.out") + grads + bsh * e + tail + (0 if n2_saved else bsh * e)
                + (0 if out_saved else bsf * e) + bsh * e
                + (bsf * ADAPTER_BYTES if e != ADAPTER_BYTES and spec.lora_dropout > 0 else 0))
        # the recompute's attention (the forward's attention point on the block's own saved set), beside
        # what backward made before the block's first unpack started it: the block output's grad, and with
        # an adapter on ff.layers.2 and no residual dropout the grads made before lora_B's backward (as at
        # the down adapter point). Otherwise the first node unpacks at once: the residual dropout's noise,
        # or ff.layers.2's saved input or weight (a frozen weight is saved through the checkpoint's hooks too)
        pre = (bsh * ADAPTER_BYTES + (bsh * e if e != ADAPTER_BYTES else 0)
               if cfg.drop_rate == 0 and lora(blk, "mlp.out") else 0)
        points[f"block {i} recompute attention"] = _forward_attention_point(cfg, spec, w, [blk],
                                                                            held + grads + bsh * e + pre, 0)
        if any(t.part == "gelu" for t in blk):
            points[f"block {i} gelu backward"] = held + _upto(blk, "gelu") + made + bsh * e + 3 * bsf * e
            points[f"block {i} softmax backward"] = held + _attention_backward(blk, spec, cfg, w, grads_by_block[i],
                                                                               grads)
            if e != ADAPTER_BYTES and lora(blk, "mlp.out"):
                points[f"block {i} down adapter backward"] = (held + _upto(blk, "mlp.out") + made
                                                              + bsh * ADAPTER_BYTES + bsf * ADAPTER_BYTES)
        grads += grads_by_block[i]["mlp.out"] + grads_by_block[i]["rest"]
    return out, points, forward


def _attention_backward(blk: list[Term], spec, cfg, w, block_grads: dict[str, int], grads: int) -> int:
    """At the softmax's backward (op timeline), on top of what the blocks before keep: the block's saved set
    up to the softmax (the weights' and v's saved tensors are freed by the bmm's backward), the grads made
    (the later blocks', the head's, this block's but norm1's and q/k/v's), the residual stream's grad and
    v's grad (b*s*h each), the attention weights' grad and the softmax's input grad (b*a*s^2 each)."""
    b, s, h, a = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.n_heads
    e = w.e_r
    made = grads + block_grads["mlp.out"] + block_grads["rest"] - block_grads["before attention"]
    return _upto(blk, "softmax") + made + 2 * b * s * h * e + 2 * b * a * s * s * e


def _block_grads(cfg, train) -> tuple[list[dict[str, int]], int]:
    """Bytes of the grads each block's backward makes, by node (mlp.out: the second Linear's weight,
    bias or adapters; the rest), and the head's (out_head, final_norm)."""
    per = [{"mlp.out": 0, "rest": 0, "before attention": 0} for _ in range(cfg.n_layers)]
    head = 0
    for name, n, eb in train:
        if name.startswith("trf_blocks."):
            i = int(name.split(".")[1])
            per[i]["mlp.out" if ".ff.layers.2." in name else "rest"] += n * eb
            if any(f".{m}." in name for m in ("norm1", "W_query", "W_key", "W_value")):
                per[i]["before attention"] += n * eb  # made after the attention's backward
        else:
            head += n * eb
    return per, head


def _backward_points(cfg, spec, w, blocks: list[list[Term]], train) -> dict[str, int]:
    """The backward's high points in each block it reaches, above the persistent base (read off the op
    timeline): what the earlier blocks saved, what this block saved up to its GELU (the second Linear's
    saved tensors are freed by its backward), the grads made so far (the head's, the later blocks', this
    block's second Linear's), the residual stream's grad (b*s*h), and
      gelu: in the backward of 0.5 * x * (1 + tanh): the GELU output's grad and both factors' grads
            (b*s*4h each)."""
    grads_by_block, head = _block_grads(cfg, train)
    points = {}
    grads = head
    for i in range(cfg.n_layers - 1, -1, -1):
        points.update(_saved_block_points(cfg, spec, w, blocks[i], i, sum(t.bytes for bl in blocks[:i] for t in bl),
                                          grads, grads_by_block[i]))
        grads += grads_by_block[i]["mlp.out"] + grads_by_block[i]["rest"]
    return points


def _saved_block_points(cfg, spec, w, blk: list[Term], i: int, earlier: int, grads: int,
                        block_grads: dict[str, int]) -> dict[str, int]:
    """_backward_points' points in block i, which backward runs on its saved set (not recomputed), above
    `earlier` (what the blocks before it hold) and `grads` (the grads made before it)."""
    b, s, h = spec.batch_size, spec.seq_len, cfg.emb_dim
    e = w.e_r
    bsh, bsf = b * s * h, b * s * 4 * h
    points = {}
    if not any(t.part == "gelu" for t in blk):
        return points
    made = grads + block_grads["mlp.out"]
    points[f"block {i} gelu backward"] = earlier + _upto(blk, "gelu") + made + bsh * e + 3 * bsf * e
    points[f"block {i} softmax backward"] = earlier + _attention_backward(blk, spec, cfg, w, block_grads, grads)
    if e != ADAPTER_BYTES and any(t.part == "mlp.out" and "lora_A output" in t.name for t in blk):
        # ff.layers.2's adapter backward on a bf16 base, at lora_A's input grad (fp32, b*s*4h; measured
        # on the op timeline): the block's saved set still whole, the grads made (lora_A's and lora_B's
        # included) and one b*s*h fp32 grad (the output grad's copy, ToCopyBackward)
        points[f"block {i} down adapter backward"] = (earlier + _upto(blk, "mlp.out") + made
                                                      + bsh * ADAPTER_BYTES + bsf * ADAPTER_BYTES)
    return points


# ---- inference: the book's generate_text_simple (planner/estimate/inference.py asks infer_estimate) ----
_GENERATE_TEXT_SIMPLE = """Peak memory of the book's `generate_text_simple` (LLMs-from-scratch ch04) on its GPTModel: no cache, the whole
context recomputed for every new token (no torch here).

    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]
        with torch.no_grad():
            logits = model(idx_cond)
        logits = logits[:, -1, :]
        probas = torch.softmax(logits, dim=-1)
        idx_next = torch.argmax(probas, dim=-1, keepdim=True)
        idx = torch.cat((idx, idx_next), dim=1)

What is alive (planner/models/gpt2.py, the book's code; every term below measured op by op on the live-bytes
tracker, planner/measure/tracker.py, fp32 and bf16, eager and sdpa):
  - while a forward runs, the previous iteration's `logits` is a view (`logits[:, -1, :]`) of its whole
    (b, t-1, V) output, so that output, `probas` (b, V), `idx_next` (b, 1) int64 and `idx` (b, t) int64 live
    beside it (decode only: in the first forward, the prefill, `idx` is the prompt and nothing else lives);
  - GPTModel.forward keeps its locals to the end: tok_embeds (b,t,h), pos_embeds (t,h) and the embedding sum
    (b,t,h) through the blocks; nn.Sequential holds the current block's input (a tensor of its own from the
    second block on);
  - in a block (its last one is the largest): norm1's output and q, k, v (b,t,h each), then
      eager: attn_scores, the scaled scores and the softmax (b,a,t,t each) and `self.mask.bool()` (a (ctx, ctx)
             bool copy), or later two score tensors and the context's contiguous copy and out_proj's output;
      sdpa:  the fused kernel's output and out_proj's output (b,t,h each: the CPU kernel's output is already
             laid out (b,t,a,d), so `.contiguous()` copies nothing);
      MLP:   the block's x after attention, norm2's output, and the book's tanh GELU at its high point: fc1's
             output, 0.5*x, x**3 and 0.044715*x**3 (b,t,4h each) and the 0-d fp32 sqrt(2/pi);
  - the final LayerNorm (mean, var: (b,t,1); x - mean is freed by the division; norm_x, scale*norm_x and the
    output: (b,t,h)), then the head's (b,t,V) logits beside tok_embeds, pos_embeds and the normed x;
  - after the forward: softmax's probas beside the previous one, then the cat's new idx beside the old one.
The forward's points grow with t, so the last forward (t = p + n - 1) is the decode peak; the first (t = p) is
the prefill's.
"""


def _generate_text_simple_points(cfg, ispec, t: int, decode: bool) -> dict[str, tuple[int, int]]:
    """name -> (bytes above weights, buffers and prompt, of which logits / probas) in the forward over t tokens."""
    from .terms import DTYPE_BYTES

    e = DTYPE_BYTES[ispec.param_dtype]
    b, h, a, V, ctx, L = ispec.batch_size, cfg.emb_dim, cfg.n_heads, cfg.vocab_size, cfg.context_length, cfg.n_layers
    f = 4 * h  # the book's FeedForward: emb_dim -> 4 * emb_dim -> emb_dim
    bth = b * t * h * e
    # decode: the previous iteration's logits storage, probas, idx_next and the grown idx
    prev_logits = b * (t - 1) * V * e if decode else 0
    prev = prev_logits + (b * V * e + 8 * b + 8 * b * t if decode else 0)
    prev_lg = prev_logits + (b * V * e if decode else 0)
    emb = bth + t * h * e + bth                      # tok_embeds, pos_embeds, their sum
    blk_in = bth if L >= 2 else 0                    # the last block's input, its own tensor from block 2 on
    if cfg.attention == "sdpa":
        attn = bth + 3 * bth + 2 * bth               # norm1 out, q k v, the kernel's output and out_proj's
    else:
        s2 = b * a * t * t * e
        attn = bth + 3 * bth + ctx * ctx + max(3 * s2, 2 * s2 + 2 * bth)
    mlp = bth + bth + 4 * b * t * f * e + 4          # x after attention, norm2 out, the GELU's four, sqrt(2/pi)
    final_norm = t * h * e + bth + bth + 3 * bth + 2 * b * t * e   # tok, pos, blocks' out, norm's (b,t,h) x3, mean, var
    logits = b * t * V * e
    head = bth + t * h * e + bth + logits            # tok, pos, the normed x and the logits
    probas = b * V * e
    idx_old = 8 * b * t if decode else 0
    return {"attention": (prev + emb + blk_in + attn, prev_lg),
            "MLP (GELU)": (prev + emb + blk_in + mlp, prev_lg),
            "final norm": (prev + final_norm, prev_lg),
            "head (logits)": (prev + head, prev_lg + logits),
            "softmax (probas)": (logits + probas + (probas + 8 * b + idx_old if decode else 0),
                                 logits + probas + (probas if decode else 0)),
            "cat (idx)": (logits + probas + 8 * b + idx_old + 8 * b * (t + 1), logits + probas)}


def estimate_generate_text_simple(cfg, ispec) -> dict:
    """The record planner.estimate.inference.estimate_inference gives, for generate_text_simple (module note
    above: _GENERATE_TEXT_SIMPLE)."""
    from .terms import DTYPE_BYTES

    e = DTYPE_BYTES[ispec.param_dtype]
    b, p, n = ispec.batch_size, ispec.prompt_len, ispec.new_tokens
    inventory = FAMILY.inventory(cfg)
    weights = sum(t.numel for t in inventory if t.kind == "param") * e
    buffers = sum(t.numel * DTYPE_BYTES[t.dtype or ispec.param_dtype] for t in inventory if t.kind == "buffer")
    inputs = 8 * b * p  # the prompt's input_ids (int64); the book passes no attention mask
    base = weights + buffers + inputs
    phases = {"prefill": (p, False)}
    if n > 1:
        phases["decode"] = (p + n - 1, True)
    phase, parts, points = {}, {}, {}
    for name, (t, decode) in phases.items():
        pts = _generate_text_simple_points(cfg, ispec, t, decode)
        key = max(pts, key=lambda k: pts[k][0])
        phase[name], parts[name], points[name] = base + pts[key][0], (key, *pts[key]), pts
    peak_phase = max(phase, key=phase.get)
    key, above, lg = parts[peak_phase]
    terms = [Term("weights", "P*e", weights, where="kept"), Term("buffers (the causal masks)", "L*ctx^2*e", buffers,
                                                                  where="kept"),
             Term("prompt ids", "8*b*p", inputs, where="kept")]
    for name, pts in points.items():
        t = phases[name][0]
        terms += [Term(f"{name} (t = {t}): {k}", "planner/arch/gpt2_book.py generate_text_simple", v[0], where=name)
                  for k, v in pts.items()]
    return {
        "kind": "estimate",
        "peak_bytes": phase[peak_phase], "peak_phase": peak_phase, "phase_peak_bytes": phase,
        "persistent_bytes": base,
        "components": {"weights": weights, "buffers": buffers, "inputs": inputs, "kv_cache": 0,
                       "activations": above - lg, "logits": lg},
        "kv_cache_bytes_per_token": 0, "prefill_high_point": parts["prefill"][0],
        "terms": [dict(vars(t)) for t in terms],
        "notes": [f"the book's GPT-2: generate_text_simple({n} new tokens), no cache: the whole context (up to "
                  f"{p + n - 1} tokens) recomputed for every token; the peak is at its {key} ({peak_phase}), "
                  f"{cfg.attention} attention"],
    }
