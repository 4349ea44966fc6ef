"""Hugging Face GPT-2 (transformers' GPT2LMHeadModel, models/gpt2/modeling_gpt2.py), from its config.json.

A published gpt2 config.json ({"model_type": "gpt2", "n_embd", "n_layer", "n_head", "n_positions"})
is this family; the book's GPT-2 ({"arch": "gpt2", "emb_dim", ...}) is planner/arch/gpt2_book.py.
Conv1D projections (fused c_attn), nn.LayerNorm, learned position embeddings, the tied head, the
gelu_new MLP and dropout everywhere (embd/attn/resid_pdrop, 0.1 as published: on the CPU each dropout
saves an input-sized noise tensor, and SDPA with dropout falls back to the math kernel).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ACTIVATION_SAVED, ConfigError, _check_optional, _check_positive, check_activation, check_attention_kind
from . import parts
from .terms import TensorSpec, Term
from .base import HFCausalLM, linear


@dataclass(frozen=True)
class HFGPT2Config:
    """Keys and defaults as transformers' GPT2Config (configuration_gpt2.py)."""
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    attention: str = "sdpa"
    torch_dtype: str | None = None  # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None  # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="gpt2-hf", init=False)

    def __post_init__(self) -> None:
        _check_optional(self)
        _check_positive(self, ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"))
        if self.n_inner is not None:
            _check_positive(self, ("n_inner",))
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
            p = getattr(self, key)
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
                raise ConfigError(f"{key} must be in [0, 1), got {p!r}")
        if not self.layer_norm_epsilon > 0:
            raise ConfigError(f"layer_norm_epsilon must be positive, got {self.layer_norm_epsilon}")
        check_attention_kind(self.attention)
        check_activation(self.activation_function)

    @property
    def max_seq_len(self) -> int:
        return self.n_positions

    @property
    def hidden(self) -> int:
        return self.n_embd

    @property
    def layers(self) -> int:
        return self.n_layer

    @property
    def heads(self) -> int:
        return self.n_head

    @property
    def inner(self) -> int:
        return self.n_inner or 4 * self.n_embd


class HFGPT2(HFCausalLM):
    arch = "gpt2-hf"
    model_types = ("gpt2",)
    model_type = "gpt2"
    # transformers 5.23 models/gpt2/configuration_gpt2.py GPT2Config.attribute_map
    hf_attribute_map = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions",
                        "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}
    config_cls = HFGPT2Config
    required = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions")
    description = "transformers GPT2LMHeadModel"
    # --offload-activations with --grad-accum > 1, every:K / selective or --offload-optimizer: its own backward
    # points in a later micro-batch (offload_backward_points' grads_exist) and the tied wte's later accumulation
    # (planner/estimate/offload_act.py tied_later), measured on the four grid shapes (tests/test_offload_mix.py)
    offload_combinations = True

    def presets(self) -> dict:
        # tests/data/gpt2.config.json and gpt2-xl.config.json, as Hugging Face ships them (tied head):
        # 124,439,808 and 1,557,611,200 parameters.
        return {"hf-gpt2": HFGPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
                "hf-gpt2-xl": HFGPT2Config(vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48, n_head=25)}

    def normalise(self, data: dict) -> dict:
        if data.get("scale_attn_by_inverse_layer_idx") or data.get("reorder_and_upcast_attn"):
            raise ConfigError("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not modelled yet "
                              "(GPT-2's published configs leave them off)")
        if data.get("add_cross_attention"):
            raise ConfigError("add_cross_attention is not supported: a causal LM has no encoder states")
        if data.get("tie_word_embeddings") is False:
            raise ConfigError("an untied GPT-2 head is not modelled yet (GPT2LMHeadModel ties it by default)")
        return data

    def grid_configs(self):
        """GPT-2 has plain heads and a tied head only; the published dropout (0.1) and none."""
        return [
            ("V1000 h64 a4 p0.1 b2 s64", HFGPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4),
             2, 64),
            ("V2000 h48 a6 p0 b2 s48", HFGPT2Config(vocab_size=2000, n_positions=128, n_embd=48, n_layer=3, n_head=6,
                                                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), 2, 48),
            ("V97 h96 a3 p0.1 b4 s8", HFGPT2Config(vocab_size=97, n_positions=128, n_embd=96, n_layer=2, n_head=3),
             4, 8),
            ("V97 h32 a4 p0 b2 s256", HFGPT2Config(vocab_size=97, n_positions=512, n_embd=32, n_layer=2, n_head=4,
                                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), 2, 256),
        ]

    def tied(self, cfg) -> bool:
        return True

    def tiny(self, cfg):
        return dataclasses.replace(cfg, vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)

    def with_layers(self, cfg, n: int):
        return dataclasses.replace(cfg, n_layer=n)

    def hf_kwargs(self, cfg) -> dict:
        data = super().hf_kwargs(cfg)
        # The published files' bos/eos id 50256 is outside a tiny vocabulary; transformers only warns.
        data.update(bos_token_id=min(50256, cfg.vocab_size - 1), eos_token_id=min(50256, cfg.vocab_size - 1))
        return data

    def inventory(self, c: HFGPT2Config) -> list[TensorSpec]:
        h, f = c.n_embd, c.inner
        specs = [TensorSpec("transformer.wte.weight", (c.vocab_size, h), "param", role="embed"),
                 TensorSpec("transformer.wpe.weight", (c.n_positions, h), "param", role="pos_embed")]
        for i in range(c.n_layer):
            p = f"transformer.h.{i}"
            specs += [TensorSpec(f"{p}.ln_1.weight", (h,), "param", block=i, role="norm.attn"),
                      TensorSpec(f"{p}.ln_1.bias", (h,), "param", block=i, role="norm.attn")]
            specs += linear(f"{p}.attn.c_attn", h, 3 * h, True, i, "attn.in", conv1d=True)
            specs += linear(f"{p}.attn.c_proj", h, h, True, i, "attn.out", conv1d=True)
            specs += [TensorSpec(f"{p}.ln_2.weight", (h,), "param", block=i, role="norm.mlp"),
                      TensorSpec(f"{p}.ln_2.bias", (h,), "param", block=i, role="norm.mlp")]
            specs += linear(f"{p}.mlp.c_fc", h, f, True, i, "mlp.in", conv1d=True)
            specs += linear(f"{p}.mlp.c_proj", f, h, True, i, "mlp.out", conv1d=True)
        specs += [TensorSpec("transformer.ln_f.weight", (h,), "param", role="norm.final"),
                  TensorSpec("transformer.ln_f.bias", (h,), "param", role="norm.final")]
        return specs

    def restore_buffers(self, model, cfg, device) -> None:
        """GPT2LMHeadModel has no buffers."""

    # ---- saved tensors (saved-tensor inventories of GPT2LMHeadModel on the CPU, every precision) ---------
    def block_terms(self, c: HFGPT2Config, spec, w) -> list[Term]:
        b, s, h, f = spec.batch_size, spec.seq_len, c.n_embd, c.inner
        bsh, bsf = b * s * h, b * s * f
        e_k = 1 if spec.device_type == "cuda" else w.e_m  # CPU dropout saves an input-sized noise tensor
        ln = lambda name, part="": [  # noqa: E731 - nn.LayerNorm: native_layer_norm saves input, mean, rstd
            Term(f"LayerNorm input ({name})", "b*s*h*e_r", bsh * w.e_r, True, part=part),
            Term(f"LayerNorm mean, rstd ({name})", "2*b*s*e_r", 2 * b * s * w.e_r, True, part=part)]
        terms = ln("ln_1", "norm.attn") + [
            Term("c_attn input" + (" (autocast copy)" if w.amp else ""), "b*s*h*e_m", bsh * w.e_m, True,
                 part="attn.in")]
        terms += self.attention_terms(c, spec, w)
        if not self._flash(c, spec):  # the CPU flash kernel's output is laid out as c_proj's input already
            terms += [Term("c_proj input (attention output, transposed copy)", "b*s*h*e_m", bsh * w.e_m, True)]
        if c.resid_pdrop > 0:
            terms.append(Term("attention residual dropout noise", "b*s*h*e_k", bsh * e_k, True))
        terms += ln("ln_2", "norm.mlp")
        terms += [Term("c_fc input" + (" (autocast copy)" if w.amp else ""), "b*s*h*e_m", bsh * w.e_m, True,
                       where="mlp"),
                  self._act_term(c, spec, w, bsf),
                  Term("MLP c_proj input (activation output)", "b*s*f*e_m", bsf * w.e_m, True, where="mlp")]
        if c.resid_pdrop > 0:
            terms.append(Term("MLP residual dropout noise", "b*s*h*e_k", bsh * e_k, True, where="mlp"))
        return terms

    # transformers' Python tanh GELUs (activations.py NewGELUActivation, GELUTanh(use_gelu_tanh_python)):
    # 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))
    TANH_GELUS = ("gelu_new", "gelu_python_tanh")

    @staticmethod
    def _cuda_amp(spec, w) -> bool:
        """fp16/bf16 autocast on CUDA, whose fp32 list is longer than the CPU's (pow, softmax, layer_norm, ...)."""
        return w.amp and spec.device_type == "cuda"

    def _act_term(self, c: HFGPT2Config, spec, w, bsf: int) -> Term:
        """The activation's saved tensors besides its output (ACTIVATION_SAVED). Under CUDA autocast a Python tanh
        GELU's pow is on the fp32 list (aten/src/ATen/autocast_mode.cpp KERNEL_CUDA(pow, fp32); measured on an H200,
        tests/data/cuda/2026-11-27-h200 autocast-dtypes.json: pow -> float32), so pow saves autocast's fp32 copy of x
        and the chain after it is fp32 by type promotion: tanh's output and 1 + tanh are fp32, 0.5 * x stays e_m
        (the output, fp32, is cast by c_proj, which saves the e_m cast: the term after this one)."""
        act = c.activation_function
        if act in self.TANH_GELUS and self._cuda_amp(spec, w):
            return Term(f"{act} saved tensors (x's fp32 copy, tanh, 1+tanh: fp32 under CUDA autocast; 0.5x)",
                        "b*s*f*(12 + e_m)", bsf * (12 + w.e_m), True, where="mlp")
        return Term(f"{act} saved tensors", f"{ACTIVATION_SAVED[act]}*b*s*f*e_m", ACTIVATION_SAVED[act] * bsf * w.e_m,
                    True, where="mlp")

    def attention_terms(self, c: HFGPT2Config, spec, w) -> list[Term]:
        """GPT2Attention: q, k, v split from c_attn's output; k and v go through the DynamicCache (torch.cat
        copies, which attention then uses).
        eager (eager_attention_forward): matmul saves a contiguous copy of q, the cached k (k^T a view)
          and v; softmax runs in the input dtype (in fp32 under CPU autocast, whose fp32 list has
          softmax) and saves its output; with attn_pdrop the dropout saves its noise (e_m) and the
          second matmul its output, else that matmul saves the probabilities cast to v's dtype.
        sdpa with dropout on the CPU: the math kernel, which upcasts q, k, v to fp32 below fp32 and saves
          fp32 q, k, v, probabilities, noise and output (aten attention.cpp)."""
        b, s, h, a = spec.batch_size, spec.seq_len, c.n_embd, c.n_head
        bsh, bas2 = b * s * h, b * a * s * s
        p = c.attn_pdrop > 0
        if c.attention == "sdpa" and p and spec.device_type == "cpu":
            return [Term("SDPA math kernel q, k, v (fp32 upcasts)", "3*b*s*h*4", 3 * bsh * 4, True),
                    Term("SDPA math kernel probabilities, dropout noise, dropout output (fp32)", "3*b*a*s^2*4",
                         3 * bas2 * 4, True)]
        if c.attention == "sdpa":
            # The CPU flash kernel: q is a view of c_attn's output (b*s*3h, all of it kept), k and v the
            # cache's; its output, laid out (b, s, a, d), is c_proj's input as is.
            if spec.checkpointing:  # no DynamicCache under checkpointing: k and v stay views of c_attn's output
                return [Term("c_attn output (q, k, v are views of it)", "3*b*s*h*e_m", 3 * bsh * w.e_m, True),
                        Term("SDPA output (= c_proj input)", "b*s*h*e_m", bsh * w.e_m, True),
                        Term("SDPA logsumexp", "4*b*a*s (fp32)", 4 * b * a * s, True)]
            return [Term("c_attn output (q is a view of it)", "3*b*s*h*e_m", 3 * bsh * w.e_m, True),
                    Term("SDPA k, v (cache copies), output (= c_proj input)", "3*b*s*h*e_m", 3 * bsh * w.e_m, True),
                    Term("SDPA logsumexp", "4*b*a*s (fp32)", 4 * b * a * s, True)]
        e_soft = 4 if w.amp else w.e_m
        terms = [Term("attention q copy, cached k and v", "3*b*s*h*e_m", 3 * bsh * w.e_m, True),
                 Term("softmax output" + (" (fp32 under autocast)" if w.amp else ""),
                      "b*a*s^2*" + ("4" if w.amp else "e_m"), bas2 * e_soft, True)]
        if p:
            e_k = 1 if spec.device_type == "cuda" else w.e_m
            terms += [Term("attention dropout noise", "b*a*s^2*e_k", bas2 * e_k, True),
                      Term("attention dropout output", "b*a*s^2*e_m", bas2 * w.e_m, True)]
        elif w.amp:
            terms.append(Term("probabilities cast to v's dtype", "b*a*s^2*e_m", bas2 * w.e_m, True))
        return terms

    def forward_terms(self, c: HFGPT2Config, spec, w) -> list[Term]:
        """Alive at the end of the forward but not saved: ln_f's output under autocast (the model output
        keeps it; lm_head saves a cast); the DynamicCache's k, v copies when the SDPA math kernel saves
        fp32 upcasts of them instead."""
        b, s, h, L = spec.batch_size, spec.seq_len, c.n_embd, c.n_layer
        terms = []
        # (the math kernel is the CPU's with dropout; CUDA's SDPA kernels save the cache's k, v themselves, counted in
        # attention_terms: measured on an H200, tests/data/cuda/2026-11-27-h200, V1000 h64 a4 p0.1 b2 s64 and V97
        # h96 a3 p0.1 b4 s8 SDPA bf16/fp16-AMP, the loss phase +1.2..1.7% with these copies counted twice)
        if c.attention == "sdpa" and not self._flash(c, spec) and w.e_m < 4 and not spec.checkpointing:
            terms.append(Term("DynamicCache k, v copies (use_cache)", "2*L*b*s*h*e_m", 2 * L * b * s * h * w.e_m,
                              where="forward"))
        if w.amp:
            terms.append(Term("ln_f output kept by the model output (autocast casts it for lm_head)", "b*s*h*e_r",
                              b * s * h * w.e_r, where="forward"))
        return terms

    def block_points(self, c: HFGPT2Config, spec, w, x) -> dict[str, int]:
        """In-block high points of the backward (book GPT-2's, whose block has the same ops but LayerNorm):
        ffn: the GELU's backward, with the MLP c_proj's grad, its input grad (b*s*h*e_r) and two b*s*f
             gradients alive; autocast's MLP weight copies freed.
        c_proj: the MLP c_proj's backward, its grads made, its saved input not yet released.
        mlp_done: the MLP's backward finished.
        mlp_cast (autocast): the MLP c_proj's weight grad in bf16 and in fp32 at once.
        attention (eager; SDPA's math kernel): see _attention_backward_bytes."""
        b, s, h, f = spec.batch_size, spec.seq_len, c.n_embd, c.inner
        resid = b * s * h * (1 if spec.device_type == "cuda" else w.e_m) if c.resid_pdrop > 0 else 0
        points = {
            # a later micro-batch (x.g == 0) has added c_proj's grad to its .grad in place and freed it
            # before the GELU's backward starts
            "ffn": x.current + (x.down_n * x.e_p if x.g else 0) + x.bsh * w.e_r + 2 * b * s * f * w.e_m - resid
            - (2 * f * h if w.amp else 0),
            # c_proj's backward (its input grad, then its weight and bias grads, computed in the weight's
            # working dtype: bf16 under autocast), before it releases its saved input: the MLP output's grad
            # (the residual dropout's backward output, a tensor of its own when there is dropout) and the
            # residual's grad are alive. The top in a later micro-batch, where the grads are added in place
            # right after (measured: GPT-2 V97 h96 b4 s8 sdpa fp32 accum2, 587,648 B in the block).
            "c_proj": x.current - resid + x.bsh * w.e_r + (x.bsh * w.e_m if resid else 0) + b * s * f * w.e_m
            + x.down_n * (2 if w.amp else x.e_p),
            "mlp_done": x.current - x.mlp_saved - x.casts_mlp + x.mlp_n * x.g + x.pending
            + x.bsh * (w.e_r + w.e_m) + b * s * f * w.e_m,
        }
        if c.activation_function in self.TANH_GELUS and self._cuda_amp(spec, w):
            # the GELU's fp32 chain (parts.cuda_amp_tanh_gelu_backward) in place of the CPU's two e_m-wide b*s*f grads
            points["ffn"] += (parts.cuda_amp_tanh_gelu_backward(b * s * f, w.e_m, spec.checkpointing)
                              - 2 * b * s * f * w.e_m)
        if c.attention == "eager" or not self._flash(c, spec):
            points["attention"] = (x.current - x.mlp_saved - x.casts_mlp - x.norm_mlp_saved - resid
                                   - x.bsh * w.e_m  # c_proj's input copy, freed by its backward
                                   + (x.mlp_n + x.attn_n) * x.g + x.bsh * w.e_r
                                   + self._attention_backward_bytes(c, spec, w))
        if w.amp:
            # The MLP c_proj's weight grad is made in bf16, then copied to fp32 (ToCopyBackward of autocast's
            # cast), checkpointed or not. At that copy c_proj's node has run and released what it saved (its
            # input, the GELU output, b*s*f*e_m, and the bf16 weight copy, 2*f*h, which the bf16 grad
            # replaces); alive are its input grad (b*s*f*e_m, which offsets the freed input), the residual's
            # grad (b*s*h*e_r) and the fp32 copy (f*h*e_p; fresh grads: with c_proj's fp32 bias grad, made
            # just before). The residual dropout's noise is freed. Measured: GPT-2 V97 h96 b4 s8 bf16-amp
            # ckpt accum2, last block: 578,048 B in the block (the step's peak); V1000 h64 b2 s64 bf16-amp:
            # 2,145,544 B, below the GELU point (the former ffn + b*s*f*e_m matched only where
            # 3*b*s*f*e_m = 2*f*h*2).
            points["mlp_cast"] = (x.current - resid + x.bsh * w.e_r + f * h * x.e_p
                                  + (x.down_n - f * h) * x.g)
            if c.activation_function in self.TANH_GELUS and self._cuda_amp(spec, w):
                # the input grad is the GELU's fp32 grad by then (parts.cuda_amp_cast_input_grad)
                points["mlp_cast"] += parts.cuda_amp_cast_input_grad(b * s * f, w.e_m)
        return points

    @staticmethod
    def _attention_backward_bytes(c: HFGPT2Config, spec, w) -> int:
        """What the attention's backward holds at its high point beyond the block's saved set (measured on
        the op timeline at s = 256, where it is the step's peak):
        eager without dropout, the softmax backward: the probabilities' grad and the softmax backward's
          output, (e_soft + e_m) per b*a*s^2 (softmax in fp32 under autocast, then cast to v's dtype);
        eager with dropout: the dropout's backward (its output is freed, its grad and the new one alive):
          e_m per b*a*s^2; under autocast the grad's fp32 copy for the fp32 softmax wins: 4;
        SDPA's math kernel (dropout on the CPU), all in fp32: 4 per b*a*s^2 and two fp32 b*s*h grads."""
        b, s, a, h = spec.batch_size, spec.seq_len, c.n_head, c.n_embd
        bas2 = b * a * s * s
        if c.attention == "sdpa":
            return 4 * bas2 + 2 * 4 * b * s * h
        e_soft = 4 if w.amp else w.e_m
        if c.attn_pdrop == 0:
            return (e_soft + w.e_m) * bas2
        if HFGPT2._cuda_amp(spec, w):
            # CUDA's native_dropout saves a bool mask: its backward releases the mask (1) and the second matmul's
            # backward the e_m dropped probabilities it saved; the e_m grad goes through .type(value.dtype)'s
            # ToCopyBackward to fp32 (4) and softmax's backward makes its fp32 output (4) beside the saved fp32
            # softmax output (measured to the byte on the op timeline of a CPU run with CUDA's list differences and
            # native_dropout's bool mask: V97 h32 a4 b2 s256 eager p0.1 bf16-AMP, b*a*s^2 under before)
            return (4 + 4 - 1 - w.e_m) * bas2
        return (4 if w.amp else w.e_m) * bas2

    def selective_ops(self, c: HFGPT2Config, spec, w) -> list:
        """Conv1D is addmm (c_attn, c_proj, c_fc, mlp c_proj): none is in torchtitan's list; SDPA's flash kernel
        is (its output and fp32 logsumexp), the math path under dropout on the CPU and eager are bmm."""
        from .decoder import attention_op

        b, s, h = spec.batch_size, spec.seq_len, c.n_embd
        n, a, d, f = b * s, c.n_head, h // c.n_head, c.inner
        att = attention_op("sdpa" if self._flash(c, spec) else "eager", b, s, a, d, w, spec=spec)
        return [("c_attn", "addmm", n * 3 * h * w.e_m, 2 * n * h * 3 * h), att, ("attn c_proj", "addmm", n * h * w.e_m, 2 * n * h * h),
                ("c_fc", "addmm", n * f * w.e_m, 2 * n * h * f), ("mlp c_proj", "addmm", n * h * w.e_m, 2 * n * f * h)]

    def recompute_replays_last(self, c) -> bool:
        """The residual dropout after the MLP's c_proj saves its noise when resid_pdrop > 0 (planner/arch/base.py):
        then the checkpointed block replays c_proj too (measured with FlopCounterMode: tests/test_flops.py)."""
        return c.resid_pdrop > 0

    def attention_fused(self, c, spec) -> bool:
        """FLOPs (planner/estimate/compute.py): with dropout on the CPU SDPA's math kernel runs bmm (eager's count)."""
        return self._flash(c, spec)

    @staticmethod
    def _flash(c: HFGPT2Config, spec) -> bool:
        """SDPA takes its flash kernel (no dropout, or a CUDA device); with dropout on the CPU, the math one."""
        return c.attention == "sdpa" and not (c.attn_pdrop > 0 and spec.device_type == "cpu")

    def outside_terms(self, c: HFGPT2Config, spec, w) -> list[Term]:
        b, s, h = spec.batch_size, spec.seq_len, c.n_embd
        bsh = b * s * h
        terms = [Term("position_ids (saved by wpe)", "8*s (int64)", 8 * s, where="embed")]
        if c.embd_pdrop > 0:
            terms.append(Term("embedding dropout noise", "b*s*h*e_r",
                              bsh * (1 if spec.device_type == "cuda" else w.e_r), where="embed"))
        terms += [Term("ln_f input", "b*s*h*e_r", bsh * w.e_r, where="head"),
                  Term("ln_f mean, rstd", "2*b*s*e_r", 2 * b * s * w.e_r, where="head"),
                  Term("lm_head input", "b*s*h*e_m", bsh * w.e_m, where="head")]
        if spec.checkpointing and c.attention == "eager":  # SDPA runs is_causal: no mask tensor
            terms.append(Term("additive causal mask (checkpoint input)", "b*s^2*e_r", b * s * s * w.e_r,
                              where="kept"))
        return terms

    # ---- --offload-activations (planner/estimate/offload_act.py) -------------------------------------
    def offload_copies(self, c: HFGPT2Config, spec, w) -> list[Term] | None:
        """What save_on_cpu copies to the host, saved variable by saved variable (measured: a saved_tensors_hooks
        inventory of transformers 5.23's GPT2LMHeadModel under torch 2.13, fp32, bf16 and bf16-AMP, dropout 0.1
        and 0; the sum equals the pack hook's bytes). Per block: each LayerNorm (native_layer_norm) saves its
        input (e_r), mean and rstd (b*s each, e_r) and its weight and bias (e_p); each Conv1D is addmm, saving its
        input (e_m) and weight (e_m: the autocast copy under AMP; the bias is not saved); the activation its
        tensors (gelu_new: pow's input, two muls' operands and tanh's output, four b*s*f; an aten GELU one), and the
        MLP's c_proj its input; CPU dropout saves an input-sized noise (e_m; the embedding's e_r). Attention: SDPA
        without dropout takes the flash kernel: q (a view of c_attn's output, its own numel), k and v (the
        DynamicCache's copies; under checkpointing no cache, views too), its output (e_m) and an fp32 logsumexp;
        with dropout on the CPU the math kernel: q, k^T, v upcast to fp32, the fp32 softmax output, dropout noise and
        dropped probabilities (3*b*a*s^2*4). Outside: the token ids and position ids (int64), ln_f, the head's
        input and weight (mm: the tied wte), log_softmax's output twice, the target and total_weight. Python scalars
        (the math kernel's scale, gelu_new's constants) are wrapped numbers, never packed. Under checkpointing
        each block's input (b*s*h*e_r) is what save_on_cpu copies."""
        if self.offload_host_why_not(c, spec):
            return None
        b, s, h, a, f, V = spec.batch_size, spec.seq_len, c.n_embd, c.n_head, c.inner, c.vocab_size
        bsh, bsf, bas2 = b * s * h, b * s * f, b * a * s * s
        e_p = 2 if spec.precision == "bf16" else 4

        def ln(label, per_layer=True, where="block"):
            return Term(f"host: LayerNorm ({label}): input, mean, rstd, weight, bias", "b*s*h*e_r + 2*b*s*e_r + 2*h*e_p",
                        bsh * w.e_r + 2 * b * s * w.e_r + 2 * h * e_p, per_layer, where)
        blk = [ln("ln_1"), Term("host: c_attn input and weight", "b*s*h*e_m + 3*h*h*e_m", bsh * w.e_m + 3 * h * h * w.e_m,
                                True)]
        if self._flash(c, spec):
            blk.append(Term("host: SDPA q, k, v, output (e_m) and fp32 logsumexp", "4*b*s*h*e_m + 4*b*a*s",
                            4 * bsh * w.e_m + 4 * b * a * s, True))
        else:
            blk.append(Term("host: SDPA math kernel (dropout): fp32 q, k^T, v, softmax output, noise, dropped "
                            "probabilities", "3*b*s*h*4 + 3*b*a*s^2*4", 3 * bsh * 4 + 3 * bas2 * 4, True))
        blk.append(Term("host: attention c_proj input and weight", "b*s*h*e_m + h*h*e_m", bsh * w.e_m + h * h * w.e_m,
                        True))
        n_act = ACTIVATION_SAVED[c.activation_function]
        act = self._act_term(c, spec, w, bsf)  # (CUDA autocast: the tanh GELU's fp32 chain)
        mlp = [ln("ln_2"),
               Term(f"host: c_fc input and weight, {c.activation_function}'s {n_act} tensors, c_proj input and weight",
                    f"b*s*h*e_m + {act.formula} + b*s*f*e_m + 2*h*f*e_m",
                    bsh * w.e_m + act.bytes + bsf * w.e_m + 2 * h * f * w.e_m, True, "mlp")]
        if c.resid_pdrop > 0:
            mlp.append(Term("host: residual dropout noise (attention and MLP)", "2*b*s*h*e_m", 2 * bsh * w.e_m, True,
                            "mlp"))
        blk += mlp
        if spec.checkpointing:
            blk = [parts.offload_checkpointed_input(b, s, h, w)]
        out = [Term("host: token ids and position ids (int64)", "8*b*s + 8*s", 8 * b * s + 8 * s, where="embed")]
        if c.embd_pdrop > 0:
            out.append(Term("host: embedding dropout noise", "b*s*h*e_r", bsh * w.e_r, where="embed"))
        out += [ln("ln_f", per_layer=False, where="head"),
                Term("host: lm_head input and weight (tied wte)", "b*s*h*e_m + V*h*e_m", bsh * w.e_m + V * h * w.e_m,
                     where="head"),
                parts.offload_loss_copies(b, s, V, w)]
        return blk + out

    def offload_why_not(self, c: HFGPT2Config, spec) -> str | None:
        """What --offload-activations does not model for GPT-2 (one line for the CLI): the host copies'
        limits (offload_host_why_not) and, without checkpointing, an activation whose backward is not measured
        (OFFLOAD_ACT_BACKWARD_LIVE)."""
        why = self.offload_host_why_not(c, spec)
        if why is None and not spec.checkpointing and c.activation_function not in self.OFFLOAD_ACT_BACKWARD_LIVE:
            why = (f"GPT-2 (HF) with --offload-activations and {c.activation_function}: its backward's live tensors "
                   "are measured for gelu_new only (use --checkpointing)")
        return why

    def offload_host_why_not(self, c: HFGPT2Config, spec) -> str | None:
        """Where the host copies (offload_copies) are not measured: eager attention, CUDA's dropout kernels, an
        activation outside ACTIVATION_SAVED."""
        if c.attention != "sdpa":
            return "GPT-2 (HF) with --offload-activations is modelled with SDPA attention only"
        if spec.device_type != "cpu" and (c.attn_pdrop > 0 or c.resid_pdrop > 0 or c.embd_pdrop > 0):
            return "GPT-2 (HF) with --offload-activations and dropout is measured on the CPU only (CUDA's fused dropout)"
        if ACTIVATION_SAVED.get(c.activation_function) is None:
            return f"GPT-2 (HF) with --offload-activations: activation {c.activation_function} not measured"
        return None

    def offload_alive(self, c: HFGPT2Config, spec, w) -> tuple[int, int, int]:
        """--offload-activations' device terms alive but not saved: the DynamicCache's k and v copies (c_attn's
        dtype, 2*L*b*s*h*e_m; off under checkpointing), under checkpointing the position_ids every checkpointed
        block is given (8*s int64, held by checkpoint's recompute closure while wpe's saved copy is on the host:
        measured, 384 B missing from every phase of V2000 h48 b2 s48 without it); the forward's MLP point is
        offload_forward_points'."""
        b, s, h = spec.batch_size, spec.seq_len, c.n_embd
        cache = 0 if spec.checkpointing else 2 * c.n_layer * b * s * h * w.e_m
        held = 8 * s if spec.checkpointing else 0
        return cache, held, 0  # the MLP point: offload_forward_points

    def offload_forward_points(self, c: HFGPT2Config, spec, w) -> dict[str, int]:
        """--offload-activations' forward high point in the last block beyond the persistent state, autocast's
        cache and the KV cache (planner/estimate/offload_act.py adds those): the activation inside the MLP. Alive:
        GPT2Model.forward's locals inputs_embeds (b*s*h*e_r), position_embeds (s*h*e_r) and position_ids (8*s;
        under checkpointing counted as held by the checkpoint), the block's input (its caller's), attn_output
        (b*s*h*e_m, c_proj's or its dropout's output), the residual and ln_2's output (b*s*h*e_r each) and the
        activation's live b*s*f tensors (INFER_ACT_LIVE); autocast has not cast the MLP c_proj's weight and bias
        nor the tied head's wte yet, (f*h + h + V*h)*e_m less than its whole cache (measured on the op timeline:
        GPT-2 V97 h32 b2 s256 fp32, 1,861,248 B, and V1000 h64 b2 s64 bf16-AMP)."""
        b, s, h, f, V, a = spec.batch_size, spec.seq_len, c.n_embd, c.inner, c.vocab_size, c.n_head
        bsh = b * s * h
        live = self.INFER_ACT_LIVE.get(c.activation_function, 2)
        locals_ = bsh * w.e_r + s * h * w.e_r + (0 if spec.checkpointing else 8 * s)
        e_c = w.e_m if w.amp else 0  # autocast's copies
        points = {"mlp": locals_ + 3 * bsh * w.e_r + bsh * w.e_m + live * b * s * f * w.e_m - (f * h + h + V * h) * e_c,
                  # the MLP's c_proj: the activation's output and c_proj's (b*s*h*e_m), its weight and bias cast
                  # now (measured: V97 h96 b4 s8 bf16-AMP, 6,336 B above the activation's point)
                  "mlp c_proj": locals_ + 3 * bsh * w.e_r + 2 * bsh * w.e_m + b * s * f * w.e_m - V * h * e_c}
        if not self._flash(c, spec):
            # SDPA's math kernel (dropout on the CPU), beside the block's input, ln_1's output, c_attn's output
            # (3*b*s*h*e_m): fp32 copies of q, k, v below fp32, the fp32 (s, s) causal mask built by where(), k's
            # contiguous copy for the bmm (b*s*h*4) and three fp32 b*a*s^2: the probabilities, the dropout's noise
            # and its output (measured: V1000 h64 a4 b2 s64 fp32, bf16 and bf16-AMP, 442,368 / 540,672 B over
            # the level after c_attn); autocast has not cast the attention's c_proj nor the MLP's weights, nor wte
            points["attention"] = (locals_ + 2 * bsh * w.e_r + 3 * bsh * w.e_m + (3 * bsh * 4 if w.e_m < 4 else 0)
                                   + s * s * 4 + bsh * 4 + 3 * b * a * s * s * 4
                                   - (h * h + h + h * f + f + f * h + h + V * h) * e_c)
        return points

    # live b*s*f tensors at gelu_new's backward high point with its saved tensors on the host: the incoming grad
    # and five temporaries of the tanh-formula's chain rule (pow's backward: x^2, 3*x^2, grad*3*x^2 while the tanh
    # branch's two products are alive; measured on the op timeline, GPT-2 V1000 h64 b2 s64 and V97 h32 b2 s256,
    # fp32 and bf16-AMP)
    OFFLOAD_ACT_BACKWARD_LIVE = {"gelu_new": 6}

    def offload_backward_points(self, c: HFGPT2Config, spec, w, points: dict[str, int],
                                grads_exist: bool = False) -> dict[str, int]:
        """--offload-activations' backward high points beyond the persistent state (planner/estimate/offload_act.py).
        Checkpointed: the generic sweep's points (the recomputed block on the device, the stashed inputs on the
        host) without the saved tensors outside the blocks, which are host copies now: wpe's position_ids (8*s)
        and the embedding dropout's noise (b*s*h*e_r). Not checkpointed: every saved tensor is a host copy, so a
        node's backward holds the grads made so far (G), the residual stream's grad (b*s*h*e_r), its incoming
        grad and what it makes (measured on the op timelines of GPT-2 V1000 h64 a4 p0.1 b2 s64, V2000 h48 p0 b2
        s48 and V97 h32 a4 p0 b2 s256, fp32, bf16 and bf16-AMP, each point to the byte; e_w: the weight grad's
        dtype, bf16 under autocast, then copied to the fp32 .grad: the "cast" points). The 2*e_ce is the 0-d
        loss's grad and grad_output.
          head:       logits' grad (b*s*V*e_ce; under autocast its bf16 cast too), lm_head's weight grad (V*h*e_w) and
                      input grad (b*s*h*e_m); under autocast the weight grad's fp32 copy (V*h*e_p) beside the bf16 one
          c_proj:     the MLP c_proj's input grad (b*s*f*e_m), weight and bias grads (e_w), the residual dropout's
                      grad (b*s*h*e_m, with resid_pdrop); under autocast the fp32 copy of the weight grad
          ffn:        the MLP c_proj's grads made, the activation's backward (OFFLOAD_ACT_BACKWARD_LIVE b*s*f*e_m)
          c_fc:       c_fc's input grad (b*s*h*e_m), the activation's grad (b*s*f*e_m), its weight and bias grads;
                      under autocast the fp32 copies: the input grad's (b*s*h*e_r, for ln_2's fp32 output) and the
                      weight grad's
          attention:  SDPA's math kernel (dropout on the CPU) in fp32: v's grad (b*s*h*4) and two b*a*s^2*4 (the
                      dropped probabilities' grad and the dropout backward's output, then softmax's backward)
          c_attn:     the q, k, v grads concatenated (3*b*s*h*e_m) and c_attn's input grad (b*s*h*e_m), its weight
                      and bias grads; under autocast the input grad's fp32 copy and the weight grad's
        The tied wte's accumulation at the end (every grad and two V*h, the step's backward peak at full size:
        hf-gpt2-xl b1 s1024 bf16-AMP SGD checkpointed was -1.51% without it) is planner/estimate/offload_act.py's.
        grads_exist (a later micro-batch of --grad-accum; every .grad there, counted by the caller): a new grad is
        added in place to its .grad (AccumulateGrad, grad mode off) and freed, so the grads "made before" are none
        but the tied wte's head part (V*h*e_p, held by the engine until the embedding's backward: planner/estimate/
        training.py _backward_sweep's tied_pending), and a node's own weight grads (and their fp32 copies under
        autocast) are the transients they were (measured on the op timeline: V1000 h64 a4 p0.1 b2 s64 accum 2, fp32
        and bf16-AMP, each point to the byte). Checkpointed: the generic sweep's later points already are."""
        b, s, h, f, V, L, a = spec.batch_size, spec.seq_len, c.n_embd, c.inner, c.vocab_size, c.n_layer, c.n_head
        bsh, bsf, bsV = b * s * h, b * s * f, b * s * V
        e_p = 2 if spec.precision == "bf16" else 4
        e_w, amp, tail = w.e_m, w.amp, 2 * w.e_ce
        # parameter counts: GPT2Block's ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj; the head (tied wte, ln_f)
        ln, c_attn, attn_proj, c_fc, mlp_proj = 2 * h, 3 * h * h + 3 * h, h * h + h, h * f + f, f * h + h
        block = 2 * ln + c_attn + attn_proj + c_fc + mlp_proj
        head = V * h + 2 * h
        if spec.checkpointing:
            bsh_saved = b * s * h * w.e_r if c.embd_pdrop > 0 else 0
            return {k: v - bsh_saved if "block" in k else v for k, v in points.items()}
        out = {"head": max(bsV * (w.e_ce + (w.e_m if amp else 0)),
                           bsV * w.e_m + V * h * e_w + bsh * w.e_m,
                           V * h * (e_w + e_p) + bsh * w.e_r if amp else 0) + tail}
        drop = bsh * w.e_m if c.resid_pdrop > 0 else 0
        n_act = self.OFFLOAD_ACT_BACKWARD_LIVE[c.activation_function]
        made = 0 if grads_exist else e_p  # bytes per parameter of the grads made before a point (kept apart)
        for where, g0 in (("last block", head), ("first block", head + (L - 1) * block)):
            # the grads made before the block (a later micro-batch: the tied wte's head part only) and the residual
            # stream's grad
            G = (V * h * e_p if grads_exist else g0 * e_p) + bsh * w.e_r + tail
            pts = {"c_proj": G + drop + bsf * w.e_m + mlp_proj * e_w,
                   "ffn": G + mlp_proj * made + n_act * bsf * w.e_m,
                   "c_fc": G + mlp_proj * made + bsh * w.e_m + bsf * w.e_m + c_fc * e_w,
                   "c_attn": G + (ln + c_fc + mlp_proj + attn_proj) * made + 4 * bsh * w.e_m
                   + c_attn * e_w}
            if amp:
                pts["c_proj cast"] = G + h * made + bsf * w.e_m + f * h * (e_w + e_p)
                pts["c_fc cast"] = G + (mlp_proj + f) * made + bsh * w.e_r + h * f * (e_w + e_p)
                pts["c_attn cast"] = (G + (ln + c_fc + mlp_proj + attn_proj + 3 * h) * made + bsh * w.e_r
                                      + 3 * h * h * (e_w + e_p))
            if not self._flash(c, spec):
                pts["attention"] = G + (ln + c_fc + mlp_proj + attn_proj) * made + bsh * 4 + 2 * b * a * s * s * 4
            out.update({f"{where} {k}": v for k, v in pts.items()})
        return out

    # ---- inference (planner/estimate/inference.py) ------------------------------------------------
    # live b*s*f tensors at the activation's high point under inference_mode (transformers activations.py):
    # NewGELUActivation (gelu_new) computes 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))), and
    # Python evaluates 0.5 * x first: x, 0.5*x, pow(x, 3) and 0.044715 * pow at once (measured); an aten kernel
    # (gelu, gelu_pytorch_tanh, relu, silu) holds its input and output
    INFER_ACT_LIVE = {"gelu_new": 4, "gelu": 2, "gelu_pytorch_tanh": 2, "relu": 2, "silu": 2, "swish": 2}

    def kv_bytes_per_token(self, c: HFGPT2Config, e: int) -> int:
        """K and V of every layer, n_embd each (GPT2Attention: n_head x head_dim = n_embd)."""
        return 2 * c.n_layer * c.n_embd * e

    def _act_live(self, c: HFGPT2Config) -> int:
        n = self.INFER_ACT_LIVE.get(c.activation_function)
        if n is None:
            raise NotImplementedError(f"gpt2-hf: activation {c.activation_function} in generate() not measured yet")
        return n

    def infer_prefill_points(self, c: HFGPT2Config, ispec, e: int) -> dict[str, int]:
        """The last block of the prompt's forward under inference_mode (measured op by op, GPT2Model / GPT2Block):
        always alive: inputs_embeds and position_embeds (the model forward's locals) and the block's input.
        attention: ln_1's output and c_attn's (b, s, 3h) output (q is a view; k, v go to the cache); eager
        (eager_attention_forward): the additive mask and matmul * scaling beside the matmul, or the sum with the
        mask beside it, 2*b*a*s*kv_len*e; sdpa: its output.
        mlp: the attention's c_proj output, the residual sum, ln_2's output and the activation's live b*s*f
        tensors (INFER_ACT_LIVE); eager: the mask and the attention weights the block keeps (`_`) through it."""
        kv_len = ispec.total_len - 1 if ispec.cache == "static" else ispec.prompt_len
        return self.infer_forward_points(c, ispec, e, ispec.prompt_len, kv_len)

    def infer_forward_points(self, c: HFGPT2Config, ispec, e: int, s: int, kv_len: int) -> dict[str, int]:
        """The last block's high points (infer_prefill_points) of one forward of s queries over kv_len keys: the
        prompt's (s = p) or a decode step's (s = 1, kv_len = the cache)."""
        b, h, a, f = ispec.batch_size, c.n_embd, c.n_head, c.inner
        bsh = b * s * h
        ctx = 3 * bsh * e
        if c.attention == "eager":
            attn = 4 * bsh * e + b * s * kv_len * e + 2 * b * a * s * kv_len * e
            after = b * s * kv_len * e + b * a * s * kv_len * e
        else:
            # ln_1's and c_attn's outputs, SDPA's output and c_proj's: the attention's c_proj runs while c_attn's
            # (b, s, 3h) output (q is a view of it) and SDPA's output (reshaped as a view) are alive. Measured on the
            # live-bytes op log (issue #39's fuzz: gpt2-hf V2803 h96 f32 a3 L2 b3 p251 n10 bf16 SDPA, the prompt's
            # peak at the last block's c_proj addmm, b*s*h*e above the estimate before, -5.38%)
            attn, after = 6 * bsh * e, 0
        mlp = 3 * bsh * e + self._act_live(c) * b * s * f * e + after
        return {"attention": ctx + attn, "mlp": ctx + mlp}

    def infer_decode_points(self, c: HFGPT2Config, ispec, e: int) -> dict[str, int]:
        """The last decode forward (one token): generate's input_ids and mask at p + n - 1, the previous step's
        scores (as planner/arch/decoder.py), the step's embeddings, block input, ln_1 and c_attn outputs;
        attention over the cache (eager: the mask and two score tensors; sdpa: its output) or the last layer's
        torch.cat of its values (the old values beside the new)."""
        b, h, a = ispec.batch_size, c.n_embd, c.n_head
        kv_len = ispec.total_len - 1
        ids = 16 * b * kv_len
        prev = 4 * b * c.vocab_size * (2 if self.infer_has_eos else 1)
        step = 7 * b * h * e
        # (eager: its mask; a StaticCache's is counted by infer_cache_state_bytes)
        mask = b * kv_len * e if ispec.cache != "static" else 0
        att = (mask + 2 * b * a * kv_len * e) if c.attention == "eager" else b * h * e
        points = {"attention over the cache": ids + prev + step + att}
        # the step's MLP in the last block (infer_forward_points at one query over the cache; eager: the mask and
        # the attention weights the block keeps; a StaticCache's mask is counted by infer_cache_state_bytes).
        # Measured: gpt2-hf V97 h96 a3 b4 s8 eager fp32, the decode peak at gelu_new's products, 8,384 B above the
        # cache concatenation point
        points["the step's mlp"] = (ids + prev + self.infer_forward_points(c, ispec, e, 1, kv_len)["mlp"]
                                    - (b * kv_len * e if ispec.cache == "static" and c.attention == "eager" else 0))
        if ispec.cache != "static":
            # eager: the model's additive mask is alive at the cat too (measured: gpt2-hf V97 h32 a4 b2 s256)
            points["cache concatenation (the last layer's old values)"] = (
                b * h * (ispec.total_len - 2) * e + ids + prev + step + (mask if c.attention == "eager" else 0))
        return points

    def infer_logits_terms(self, c: HFGPT2Config, ispec, e: int) -> list[Term]:
        """The token selection, as every transformers decoder's (planner/arch/decoder.py)."""
        from .decoder import RMSDecoder

        return RMSDecoder.infer_logits_terms(self, c, ispec, e)

    def infer_cache_state_bytes(self, c: HFGPT2Config, ispec, phase: str) -> int:
        """As planner/arch/decoder.py: StaticLayer.cumulative_length per layer and the static SDPA bool mask."""
        if ispec.cache == "static":
            mask = 0
            if phase == "decode":  # the 4-D mask over the cache length, alive through the step (measured)
                mask = ispec.batch_size * (ispec.total_len - 1) * (1 if c.attention == "sdpa" else
                                                                   self.infer_static_mask_bytes(c, ispec))
            return 8 * c.n_layer + mask
        return 0


FAMILY = HFGPT2()
