"""What transformers' Llama-style decoders share (no torch): pre-norm blocks of RMSNorm, RoPE attention
with grouped K/V heads and a gated MLP, an untied or tied head. A family file (llama, mistral, qwen2,
qwen3, phi3) subclasses RMSDecoder with its config class, presets, parameter names and the options it
has (q/k/v biases, q/k norms, fused projections, sliding windows); the terms and the backward's high
points here follow what those options change.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..validation import ConfigError, _check_optional, _check_positive, check_activation, check_attention_kind
from . import parts
from .memo import params_of
from .base import HFCausalLM, linear
from .infer_windows import ROPE_POINT  # (re-exported: qwen3.py and tests name it from here)
from .terms import TensorSpec, Term




class DecoderConfigMixin:
    """Properties the planner reads from every config, and the checks transformers' decoders share."""

    @property
    def max_seq_len(self) -> int:
        return self.max_position_embeddings

    @property
    def hidden(self) -> int:
        return self.hidden_size

    @property
    def layers(self) -> int:
        return self.num_hidden_layers

    @property
    def heads(self) -> int:
        return self.num_attention_heads

    def _validate(self) -> None:
        _check_optional(self)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        _check_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "max_position_embeddings"))
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by "
                                  f"num_attention_heads {self.num_attention_heads}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _check_positive(self, ("head_dim",))
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_key_value_heads {self.num_key_value_heads} does not divide "
                              f"num_attention_heads {self.num_attention_heads}")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        sw = getattr(self, "sliding_window", None)
        if sw is not None:
            _check_positive(self, ("sliding_window",))
        check_attention_kind(self.attention)
        check_activation(self.hidden_act)


class RMSDecoder(HFCausalLM):
    """A transformers decoder of Llama's shape. Subclasses set the names and options below."""

    q_bias: ClassVar[bool | None] = None   # None: the config's attention_bias decides (Llama, Qwen 3)
    o_bias: ClassVar[bool | None] = None
    mlp_bias_key: ClassVar[str | None] = None  # the config key for MLP biases (Llama's mlp_bias)
    qk_norm: ClassVar[bool] = False        # Qwen 3: RMSNorm over head_dim on q and k
    fused_qkv: ClassVar[bool] = False      # Phi-3: one qkv_proj
    fused_gate_up: ClassVar[bool] = False  # Phi-3: one gate_up_proj
    lora_default_targets: ClassVar[tuple[str, ...]] = ("q_proj", "v_proj")  # peft's mapping for llama, mistral,
    # qwen2, qwen3, gemma, gemma2 (peft/utils/constants.py); Phi-3 has none there
    # Fine-tuning terms are measured for the plain RMSNorm decoders (Llama, Mistral, Qwen 2, Qwen 3), which
    # set these, and so do Gemma and Gemma 2 (GemmaRMSNorm, sandwich norms, soft-capping: planner/estimate/finetune.py),
    # Phi-3 (fused projections, walked by planner/arch/saved.py) and the MoE families that set them (planner/arch/moe.py).
    lora_supported: ClassVar[bool] = False
    subset_supported: ClassVar[bool] = False
    # --offload-activations' host copies (offload_copies below) were first measured for the plain Llama-shaped
    # decoders (Llama, Mistral, Qwen 2 set it); every RMSDecoder family is now modelled (offload_modelled narrows)
    offload_plain: ClassVar[bool] = False
    # --offload-activations with accumulation, a checkpointing policy or --offload-optimizer: measured on Llama,
    # Qwen 3 and Gemma 2 (bench/offload_act.py); the MoE families with their own backward points (moe.py)
    offload_combinations: ClassVar[bool] = True
    # --offload-activations with fine-tuning (LoRA, a trainable subset): the walk's host view (offload_walk) and
    # the device figure measured per family (bench/offload_act.py finetune_rows); a family sets it
    offload_finetune: ClassVar[bool] = False
    # SDPA's output, laid out (b, s, a, d) by the transpose back (a view), is o_proj's input: saved once
    # (Phi-3: False, planner/arch/phi3.py)
    sdpa_output_is_o_input: ClassVar[bool] = True

    # ---- options read from the config ------------------------------------------------------------
    def biases(self, c) -> tuple[bool, bool, bool]:
        """(q/k/v bias, o bias, MLP bias)."""
        qkv = self.q_bias if self.q_bias is not None else bool(getattr(c, "attention_bias", False))
        o = self.o_bias if self.o_bias is not None else bool(getattr(c, "attention_bias", False))
        mlp = bool(getattr(c, self.mlp_bias_key)) if self.mlp_bias_key else False
        return qkv, o, mlp

    def sliding_window(self, c) -> int | None:
        return getattr(c, "sliding_window", None)

    def masked(self, c, spec) -> bool:
        """A mask tensor exists: always for eager (an additive float mask); for sdpa when the causal mask
        cannot be skipped (masking_utils.py _ignore_causal_mask_sdpa: a sliding window no longer than the
        sequence needs one; a plain causal mask becomes SDPA's is_causal=True)."""
        sw = self.sliding_window(c)
        return c.attention == "eager" or (sw is not None and spec.seq_len >= sw)

    def shape(self, c) -> parts.Shape:
        return parts.Shape(h=c.hidden_size, a=c.num_attention_heads, kv=c.num_key_value_heads, d=c.head_dim,
                           f=c.intermediate_size, attention=c.attention, act=c.hidden_act)

    def gated_mlp_width(self, c) -> int:
        """The width of the block's dense gated MLP (act(gate) * up), which fine-tuning's backward points walk."""
        return c.intermediate_size

    def rope_dim(self, c) -> int:
        return c.head_dim

    grid_options: ClassVar[dict] = {}  # config keys every grid shape of the family sets

    def grid_configs(self) -> list[tuple[str, object, int, int]]:
        shapes = [
            ("V1000 h64 a4 kv2 untied b2 s64", dict(vocab_size=1000, hidden_size=64, intermediate_size=160,
                                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                    tie_word_embeddings=False), 2, 64),
            ("V2000 h48 a6 kv6 tied b2 s48", dict(vocab_size=2000, hidden_size=48, intermediate_size=96,
                                                  num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=6,
                                                  tie_word_embeddings=True), 2, 48),
            ("V97 h96 a3 kv1 untied b4 s8", dict(vocab_size=97, hidden_size=96, intermediate_size=256,
                                                 num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                                                 tie_word_embeddings=False), 4, 8),
            ("V97 h32 a4 kv2 tied b2 s256", dict(vocab_size=97, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 tie_word_embeddings=True), 2, 256),
        ]
        return [(label, self.config_cls(**{**kw, "max_position_embeddings": 512, **self.grid_options}), b, s)
                for label, kw, b, s in shapes]

    def tiny(self, cfg):
        kw = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8)
        return dataclasses.replace(cfg, **kw)

    def with_layers(self, cfg, n: int):
        return dataclasses.replace(cfg, num_hidden_layers=n)

    # ---- inventory ------------------------------------------------------------------------------------
    def inventory(self, c) -> list[TensorSpec]:
        h, hd, f = c.hidden_size, c.head_dim, c.intermediate_size
        q_out, kv_out = c.num_attention_heads * hd, c.num_key_value_heads * hd
        qkv_b, o_b, mlp_b = self.biases(c)
        specs = [TensorSpec("model.embed_tokens.weight", (c.vocab_size, h), "param", role="embed")]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}"
            if self.fused_qkv:  # Phi-3 registers o_proj first, then qkv_proj
                specs += linear(f"{p}.self_attn.o_proj", q_out, h, o_b, i, "attn.out")
                specs += linear(f"{p}.self_attn.qkv_proj", h, q_out + 2 * kv_out, qkv_b, i, "attn.in")
            else:
                specs += linear(f"{p}.self_attn.q_proj", h, q_out, qkv_b, i, "attn.in")
                specs += linear(f"{p}.self_attn.k_proj", h, kv_out, qkv_b, i, "attn.in")
                specs += linear(f"{p}.self_attn.v_proj", h, kv_out, qkv_b, i, "attn.in")
                specs += linear(f"{p}.self_attn.o_proj", q_out, h, o_b, i, "attn.out")
            if self.qk_norm:
                specs += [TensorSpec(f"{p}.self_attn.q_norm.weight", (hd,), "param", block=i, role="norm.other"),
                          TensorSpec(f"{p}.self_attn.k_norm.weight", (hd,), "param", block=i, role="norm.other")]
            if self.fused_gate_up:
                specs += linear(f"{p}.mlp.gate_up_proj", h, 2 * f, mlp_b, i, "mlp.in")
            else:
                specs += linear(f"{p}.mlp.gate_proj", h, f, mlp_b, i, "mlp.in")
                specs += linear(f"{p}.mlp.up_proj", h, f, mlp_b, i, "mlp.in")
            specs += linear(f"{p}.mlp.down_proj", f, h, mlp_b, i, "mlp.out")
            specs += [TensorSpec(f"{p}.input_layernorm.weight", (h,), "param", block=i, role="norm.attn"),
                      TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), "param", block=i, role="norm.mlp")]
        specs.append(TensorSpec("model.norm.weight", (h,), "param", role="norm.final"))
        if not c.tie_word_embeddings:
            specs += linear("lm_head", h, c.vocab_size, False, None, "head")
        specs += rope_buffers(self.rope_dim(c) // 2)
        return specs

    # ---- saved tensors --------------------------------------------------------------------------------
    def block_terms(self, c, spec, w) -> list[Term]:
        """One block's saved tensors in full training: the walk (saved) with every tensor training, its input
        needing grad, and autocast's weight copies counted once outside the blocks (planner/estimate/training.py
        autocast_weight_bytes)."""
        return self.saved(c, spec, w, 0, True, None, {}, weights_cached=True)[0]

    def norm_terms(self, label, b, s, h, w, part="", where="block", per_layer=True) -> list[Term]:
        return parts.rms_norm(label, b, s, h, w, part=part, where=where, per_layer=per_layer)

    def attention_fused(self, c, spec) -> bool:
        """FLOPs (planner/estimate/compute.py): CUDA runs pure-fp32 grouped-head SDPA on the math kernel, a composite
        of bmm that autograd differentiates op by op (parts.sdpa_math): eager's count, not the fused kernel's."""
        from .terms import Widths

        return c.attention == "sdpa" and not parts.sdpa_math(self.shape(c), self.masked(c, spec), spec, Widths.of(spec))

    def selective_ops(self, c, spec, w) -> list:
        """q, k, v (or Phi-3's qkv), the attention, o, then the MLP's (selective_mlp_ops). A Linear without bias
        on a 3-D input is aten.mm (ATen linear: matmul folds the batch into the rows), with a bias aten.addmm
        (_flatten_nd_linear); SDPA on the CPU runs _scaled_dot_product_flash_attention_for_cpu, mask or not
        (output b*s*a*d*e_m and an fp32 (b, a, s) logsumexp); eager attention is bmm (measured: the op
        sequence under a TorchDispatchMode, transformers 5.23, torch 2.13)."""
        b, s = spec.batch_size, spec.seq_len
        x = self.shape(c)
        qkv_b, o_b, _ = self.biases(c)
        ops = ([linear_op("qkv_proj", b * s, x.h, (x.a + 2 * x.kv) * x.d, qkv_b, w)] if self.fused_qkv else
               [linear_op("q_proj", b * s, x.h, x.a * x.d, qkv_b, w), linear_op("k_proj", b * s, x.h, x.kv * x.d, qkv_b, w),
                linear_op("v_proj", b * s, x.h, x.kv * x.d, qkv_b, w)])
        # (CUDA's SDPA math kernel, parts.sdpa_math: a composite of bmm, _safe_softmax and pointwise ops, none in
        # torchtitan's _save_list (planner/routines/checkpointing.py _SAVE): recomputed, as eager's bmm pair;
        # CUDA's cuDNN kernel (bf16 / fp16): attention_op's spec)
        masked = self.masked(c, spec)
        math = parts.sdpa_math(x, masked, spec, w)
        ops.append(attention_op("eager" if math else c.attention, b, s, x.a, x.d, w,
                                lse_len=parts.sdpa_lse_len(x, masked, spec, w, s), spec=spec))
        ops.append(linear_op("o_proj", b * s, x.a * x.d, x.h, o_b, w))
        return ops + self.selective_mlp_ops(c, spec, w)

    def selective_mlp_ops(self, c, spec, w) -> list:
        """The gated MLP: gate and up (Phi-3: one gate_up), then down."""
        n, x, bias = spec.batch_size * spec.seq_len, self.shape(c), self.biases(c)[2]
        up = ([linear_op("gate_up_proj", n, x.h, 2 * x.f, bias, w)] if self.fused_gate_up else
              [linear_op("gate_proj", n, x.h, x.f, bias, w), linear_op("up_proj", n, x.h, x.f, bias, w)])
        return up + [linear_op("down_proj", n, x.f, x.h, bias, w)]

    def offload_copies(self, c, spec, w) -> list[Term] | None:
        """What save_on_cpu copies to the host in full training, saved variable by saved variable: the block walk's
        host view (offload_walk) with every tensor training (measured: a saved_tensors_hooks inventory of
        transformers 5.23's Llama / Qwen 2 / Qwen 3 / Phi-3 / Gemma / Gemma 2 under torch 2.13, fp32, bf16 and
        bf16-AMP; the sum equals the host bytes the tracker counts, to the byte). Per block: each norm (host_norm:
        its fp32 input twice, rsqrt twice, the normed x and the weight); every Linear (mm or addmm: a bias is not
        saved) saves its input (e_m) and its weight (e_m: the autocast copy under AMP, else the parameter's t()
        view), so q, k, v save the same input three times and a fused qkv / gate_up once; Qwen 3's q/k norms
        (host_qk_norm); RoPE's q*cos, k*cos, rotate_half(q)*sin, rotate_half(k)*sin save cos and sin ((1, 1, s, d)
        in the residual dtype) four times; the attention (offload_attention); the activation saves its input
        (SiLU, the exact or tanh GELU), the gated product both operands. Outside: offload_outside. A Python scalar
        an op saves is a wrapped number, not packed. Under checkpointing the blocks' own saves go to checkpoint's
        hooks (innermost), and each block's input (b*s*h*e_r) is what save_on_cpu copies."""
        from ..validation import ACTIVATION_SAVED

        if ACTIVATION_SAVED.get(c.hidden_act) != 1 or self.rope_dim(c) != c.head_dim or not self.offload_modelled(c):
            return None
        return self.offload_walk(c, spec, w, None, {})  # per_layer terms are one block's: the model holds L of them

    def offload_walk(self, c, spec, w, trains: set | None, adapted: dict, quantized: bool = False) -> list[Term]:
        """save_on_cpu's copies from the block walk's host view (planner/arch/saved.py walk_block: one copy per saved
        variable, by what needs grad). trains None: full training, where every block saves alike: one block's
        copies as per_layer Terms. Fine-tuning (trains: the trainable names, adapted: the LoRA-wrapped linears):
        each block's own, from the first block whose input or weights need grad (a frozen prefix saves nothing);
        under checkpointing each block's input, every block's (enable_input_require_grads makes every block's
        input need grad, so every checkpoint records it; its own saves go to checkpoint's hooks). quantized: QLoRA,
        walked on its fp32 twin (planner/arch/saved.py BlockWalk)."""
        from .saved import block_host, block_signature

        walks: dict = {}

        def host(sp, i, g_in):
            # blocks that walk alike (block_signature) are walked once: the same host copies and needs-grad answer
            key = (sp is spec, g_in, block_signature(self, c, i, trains, adapted))
            got = walks.get(key)
            if got is None:
                got = walks[key] = block_host(self, c, sp, w, i, g_in, trains, adapted, quantized)
            return got

        b, s, h, L = spec.batch_size, spec.seq_len, c.hidden_size, c.num_hidden_layers
        params = params_of(self, c)

        def role_trains(role: str) -> bool:
            return any(trains is None or t.name in trains for t in params if t.role == role)

        g = trains is None or spec.checkpointing or role_trains("embed")
        every = spec.checkpointing and trains is not None and getattr(spec, "checkpoint_policy", "full") not in (
            "full", "selective")
        if every:
            # fine-tuning under every:K: a checkpointed block copies its input, one not checkpointed saves through
            # save_on_cpu's hook, its input needing grad (enable_input_require_grads): its whole walk (measured:
            # every dense RMSNorm decoder's grid shape, LoRA r8 / last:1 every:2, host bytes exact;
            # bench/offload_act.py finetune_mix_rows)
            from ..checkpointing import checkpointed_blocks

            ckpt = set(checkpointed_blocks(spec.checkpoint_policy, L))
            none = dataclasses.replace(spec, checkpointing=False, checkpoint_policy="full")
            blk = []
            for i in range(L):
                got = ([parts.offload_checkpointed_input(b, s, h, w)] if i in ckpt
                       else host(none, i, True)[0])
                blk += [dataclasses.replace(t, name=f"{t.name} (block {i})", per_layer=False) for t in got]
        elif spec.checkpointing:
            blk = [parts.offload_checkpointed_input(b, s, h, w)]
            if trains is not None:
                blk = [dataclasses.replace(blk[0], bytes=L * blk[0].bytes, per_layer=False, formula="L*b*s*h*e_r",
                                           name=blk[0].name + "s (every block's)")]
        elif trains is None:
            blk, g = block_host(self, c, spec, w, 0, g, None, {})
        else:
            blk = []
            for i in range(L):
                got, g = host(spec, i, g)
                blk += [dataclasses.replace(t, name=f"{t.name} (block {i})", per_layer=False) for t in got]
        return blk + self.offload_outside(c, spec, w, role_trains("embed"), g, role_trains("norm.final"),
                                          role_trains("head") or (self.tied(c) and role_trains("embed")))

    def offload_outside(self, c, spec, w, embed_trains: bool, g: bool, final_trains: bool,
                        head_trains: bool) -> list[Term]:
        """The host copies outside the blocks, by what needs grad (g: the last block's output): the embedding's int64
        ids and offload_embed_extra when the embedding trains (Gemma's scale is applied inside the embedding module,
        before enable_input_require_grads' hook marks its output: measured, Gemma 2 LoRA checkpointed), the final
        norm (host_norm), the head's input (e_m) when it trains (a tied head: the embedding) and its weight (e_m:
        autocast's copy, or the parameter's t() view) when its input needs grad, offload_head_extra (Gemma 2's
        soft-capping) and the loss: log_softmax's output saved by itself and by nll_loss (two copies of b*s*V
        e_ce), its int64 target and 0-d total_weight (parts.offload_loss_copies)."""
        b, s, h, V = spec.batch_size, spec.seq_len, c.hidden_size, c.vocab_size
        e_p = 2 if spec.precision == "bf16" else 4  # the parameters' dtype (norm weights are saved as they are)
        out = []
        if embed_trains:
            out += [Term("host: embedding ids (int64)", "8*b*s", 8 * b * s, where="embed")]
            out += self.offload_embed_extra(c, spec, w, e_p)
        out += self.host_norm("final norm", b, s, h, w.e_r, e_p, g, final_trains, per_layer=False, where="head")
        if head_trains:
            out.append(Term("host: lm_head input (head trains)", "b*s*h*e_m", b * s * h * w.e_m, where="head"))
        if g or final_trains:
            out.append(Term("host: lm_head weight (its input needs grad)", "V*h*e_m", V * h * w.e_m, where="head"))
        return out + self.offload_head_extra(c, spec, w) + [parts.offload_loss_copies(b, s, V, w)]

    def offload_alive(self, c, spec, w) -> tuple[int, int, int]:
        """--offload-activations' device terms alive but not saved (planner/estimate/offload_act.py):
        the DynamicCache K/V (2*L*b*kv*s*d*e_r, planner/arch/parts.py forward_only; off under checkpointing;
        without offloading the cache shares its storage with the saved k, v, which now are host copies); under
        checkpointing the RoPE cos and sin every block is given (2*s*d*e_r, measured); and the forward's MLP point,
        the last block's gated product (down_proj(act(gate(x)) * up(x)): act's output, up's output and their product,
        b*s*f*e_m each, beside the residual and the normed x; the gate's output is already freed, its saved copy on
        the host)."""
        b, s, L = spec.batch_size, spec.seq_len, c.num_hidden_layers
        cache = 0 if spec.checkpointing else 2 * L * b * c.num_key_value_heads * s * c.head_dim * w.e_r
        rope = 2 * s * c.head_dim * w.e_r if spec.checkpointing else 0
        mlp = 3 * b * s * c.intermediate_size * w.e_m + 2 * b * s * c.hidden_size * w.e_r
        if w.amp:  # autocast's copies of down_proj's and lm_head's weights: not made yet (checkpointed or not:
            # measured, Llama V97 h32 f128 b4 s64 bf16-AMP checkpointed, +14,400 B = h*(f + V)*2 before)
            mlp -= c.hidden_size * (c.intermediate_size + c.vocab_size) * w.e_m
        if c.attention == "eager":
            # the decoder layer's `hidden_states, _ = self.self_attn(...)`: `_` is eager attention's returned
            # probabilities (softmax's fp32 output .to(q's dtype), q after RoPE: e_r), alive to the layer's
            # return; without checkpointing the model's masks too (mask_count * b*s^2*e_r; under checkpointing
            # they are checkpoint inputs, counted held) (measured: the forward's op timeline of Gemma 2 V97 h64
            # f512 a4 kv2 b2 s128 fp32, 786,440 B low before = b*a*s^2*4 + 2*b*s^2*4 + 8)
            mlp += b * c.num_attention_heads * s * s * w.e_r
            mlp += 0 if spec.checkpointing else self.mask_count(c) * b * s * s * w.e_r
        return cache, rope, mlp + self.offload_forward_held(c, spec, w)

    def offload_adapter_extra(self, c, spec, w, adapted: set) -> int:
        """--offload-activations with LoRA on the last block's MLP input projection(s) (adapted: the short names of
        that block's LoRA-wrapped linears): peft's lora.Linear.forward (peft/tuners/lora/layer.py) runs
        `result = self.base_layer(x)`, then `result = result + lora_B(lora_A(dropout(x))) * scaling`, so at the
        scaling's mul the base output, lora_B's output and their scaled copy are alive, three of the projection's
        width (e_m: the matmul dtype). Beyond the gated product point (offload_alive's: act, up and their product,
        or the fused gate_up output, act and product): a fused gate_up (Phi-3) 3 * 2f against 2f + f + f, 2f more;
        gate and up apart, up's adapter beside act(gate), f more (gate's own adapter: 3f, the point's). Measured:
        the forward's op timeline of Phi-3 V1000 h64 f160 b2 s64 LoRA r8 all-linear fp32 checkpointed, the mul's
        moment 1,673,088 B, 45,056 B above the logits' before (-2.7%; -5.2% without checkpointing)."""
        n = spec.batch_size * spec.seq_len * c.intermediate_size * w.e_m
        if self.fused_gate_up:
            return 2 * n if "gate_up_proj" in adapted else 0
        return n if "up_proj" in adapted else 0

    def offload_forward_held(self, c, spec, w) -> int:
        """Without checkpointing, what the model's forward still references beside the last block's MLP: the
        embedding output (the model's `inputs_embeds`), the last block's input (the model's loop variable; the
        embedding output itself when L = 1), RoPE's cos and sin ((1, s, d) each, e_r) and position_ids ((1, s)
        int64) (measured: the forward phase's op timeline of Llama and Qwen 2 V97 h32 a4 kv2 b2 s256, fp32 and
        bf16-AMP, -149,504 B before = 2*b*s*h*4 + 2*s*d*4 + 8*s). Under checkpointing offload_act.py counts cos,
        sin and position_ids as held (the checkpoint's inputs) and the embedding output and the last block's input
        are held here as without it: what the checkpoint stashes of them is save_on_cpu's host copy, the device
        tensors are the model's locals (measured: the forward's op timeline of Llama V97 h48 f96 a6 kv2 b1 s512
        fp32 checkpointed, -196,608 B = 2*b*s*h*4 before, -16.3%)."""
        b, s = spec.batch_size, spec.seq_len
        n_res = 2 if c.num_hidden_layers > 1 else 1
        if spec.checkpointing:  # the two b*s*h*e_r are still referenced: their checkpoint copies are host copies
            return n_res * b * s * c.hidden_size * w.e_r
        # SDPA under a sliding window shorter than s: the model's (1, 1, s, s) bool mask and the two 0-d int64
        # tensors its creation lifts (measured: the forward's op timeline of Mistral V97 h64 f192 a8 kv2 b2 s256
        # and Phi-3 V97 h64 f512 a4 kv2 b2 s128, fp32: s^2 + 16 B under the MLP point before)
        mask = s * s + 16 if c.attention == "sdpa" and self.masked(c, spec) else 0
        return n_res * b * s * c.hidden_size * w.e_r + 2 * s * c.head_dim * w.e_r + 8 * s + mask

    def offload_forward_points(self, c, spec, w) -> dict[str, int]:
        """--offload-activations' forward high points inside the last block beyond the persistent state, autocast's
        cache, the KV cache and the checkpoint-held inputs (planner/estimate/offload_act.py adds those). With the
        saved tensors on the host, a block holds on the device only what it still references. Eager attention: the
        block's input, its normed x and one more b*s*h*e_r (3*b*s*h*e_r, measured), RoPE's cos and sin (2*s*d*e_r), q after RoPE, k and v (the cache's
        own under no checkpointing, then repeat_kv's copies when kv < a; e_r: RoPE promotes to fp32 under autocast
        and the cache keeps the keys' dtype), the model's masks (mask_count * b*s^2*e_r), and two b*a*s^2 tensors:
        the scores and their scaled copy (e_m each), or at the softmax the masked scores (promoted to the mask's
        dtype), softmax's fp32 copy of a bf16 input and its fp32 output (measured: the op timeline of Gemma 2 V97 h32 b2 s256 fp32, 6,815,744 of
        6,817,800 B over the persistent state)."""
        points = self.offload_attention_points(c, spec, w)
        if c.attention != "eager":
            return points
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        x = self.shape(c)
        bas2 = b * x.a * s * s
        # k after RoPE (e_r) and v: under checkpointing v as v_proj made it (e_m: no cache to promote it), else the
        # cache's (e_r), and repeat_kv's copies of both (measured: the forward's op timeline of Gemma 2 V1000 h64 a4
        # kv2 b2 s64 LoRA r8 bf16-AMP checkpointed, v_proj's bf16 output and repeat_kv's bf16 copy of it at the
        # softmax, 49,152 B = b*s*kv*d*2 + b*s*a*d*2 high before; as SDPA's e_v, offload_attention_points)
        e_v = w.e_m if spec.checkpointing else w.e_r
        kv_own = b * s * x.kv * x.d * (w.e_r + e_v) if spec.checkpointing else 0  # else in the KV cache already
        kv_rep = b * s * x.a * x.d * (w.e_r + e_v) if x.kv < x.a else 0
        # RoPE's cos and sin and position_ids (under checkpointing: counted as held)
        rope = 0 if spec.checkpointing else 2 * s * x.d * w.e_r + 8 * s
        # under autocast o_proj's, the MLP's and lm_head's weight copies are not made yet (measured: Gemma 2 V97 h32
        # b2 s128 bf16-AMP eager, +25,656 B before = h*(a*d + 3*f + V)*2 - 8*s)
        pending = c.hidden_size * (x.a * x.d + 3 * x.f + c.vocab_size) * w.e_m if w.amp else 0
        e_ms = max(w.e_m, w.e_r)  # the masked scores: the mask's dtype wins
        softmax = e_ms + 4 + (4 if e_ms < 4 else 0)  # softmax(dtype=float32) casts a bf16 input first (a copy)
        return {**points, "attention": (3 * b * s * h * w.e_r + rope - pending + b * s * x.a * x.d * w.e_r + kv_own + kv_rep
                              # the masks (under checkpointing checkpoint inputs, counted held: measured, Gemma 2
                              # V97 h48 f96 a6 kv2 b1 s512 fp32 checkpointed, +2*b*s^2*4 before)
                              + (0 if spec.checkpointing else self.mask_count(c) * b * s * s * w.e_r)
                              + bas2 * max(2 * w.e_m, softmax))}

    def plain_attention_saved(self, c, spec, w, blk: list[Term]) -> int | None:
        """Without offloading or checkpointing, what the last block has saved on the device at eager attention's
        softmax (offload_forward_points' "attention" point) that the point does not count as alive already: its
        saved tensors in walk order before the softmax output (the input norm's, the projections' input, RoPE's
        and the q / k norms', the scores' q and k^T; not v, saved by the matmul after it), less the ones that are the point's own tensors: the block's
        input (the input norm saves it as it is in fp32; below fp32 it saves an fp32 copy: stash_extra), the
        scores' q and k^T and, without autocast, the projections' input (the normed x; under autocast each
        projection saves its own bf16 copy of it, which the point does not hold) (measured: the simulated forward phase of Llama V97 h32 a4 kv2 b2 s256 eager, fp32 / bf16 / bf16-AMP, the
        plain step over the offloaded one by (L-1) blocks' saved set and this, to the byte). None: not modelled
        (sdpa: its saved output and logsumexp outlive the point, the end of the forward covers it)."""
        if c.attention != "eager":
            return None
        if not any(term.part == "attn.softmax" for term in blk):
            return None
        before, after = [], False
        for term in blk:
            after = after or term.part == "attn.softmax"
            # v is saved by the matmul after the softmax (the point holds it); a term of the scores' part listed
            # after it is made before it (Gemma 2's soft-capping tanh output: planner/arch/gemma2.py)
            if (not after and term.part != "attn.probs") or (after and term.part == "attn.scores"):
                before.append(term)
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        own = 0 if self.stash_extra(c, spec, w) else b * s * h * w.e_r
        x = self.shape(c)
        own += 2 * b * s * x.a * x.d * w.e_m  # the scores' q and k^T (repeated to a heads)
        own += 0 if w.amp else sum(t.bytes for t in before if t.part == "attn.in")
        return sum(t.bytes for t in before) - own

    def offload_attention_points(self, c, spec, w) -> dict[str, int]:
        """--offload-activations' high points in the last block's attention, beside the forward's held tensors
        (offload_forward_held; the normed x, b*s*h*e_r, too), the KV cache of the blocks before (offload_alive
        counts all L: the last block's is not made yet at RoPE) and, under autocast, the cached weight copies
        made so far (o_proj's, the MLP's and lm_head's not yet: h*(a*d + 3*f + V)*e_m fewer):
          rope  q's RoPE at q_embed = q * cos + rotate_half(q) * sin: q (offload_qk_width: the projection's
                output), q * cos and rotate_half(q) * sin (promoted to e_r: cos and sin are e_r) and their sum (e_r;
                rotate_half's cat is a host copy by then), with k (offload_qk_width) and v (e_m) beside them
          sdpa  SDPA's output (e_m) and fp32 logsumexp beside q after RoPE (e_r), k and v (the cache's under no
                checkpointing, else their own), repeat_kv's copies (e_r) when enable_gqa is off, with a mask the
                model's (1, 1, s, s) bool mask (a checkpoint input under checkpointing: counted held) and SDPA's
                b*s^2*e_m conversion, and under autocast SDPA's bf16 copies of q, k and v
        (measured: the forward phase's op timelines of Llama / Qwen 2 / Qwen 3 / Mistral V97 h32 a4 kv2 b2 s256,
        fp32 and bf16-AMP)."""
        b, s, h, V = spec.batch_size, spec.seq_len, c.hidden_size, c.vocab_size
        x = self.shape(c)
        q, kv = b * s * x.a * x.d, b * s * x.kv * x.d
        held = self.offload_forward_held(c, spec, w) + b * s * h * w.e_r  # (+ the normed x)
        last_cache = 0 if spec.checkpointing else 2 * kv * w.e_r
        pending = h * (x.a * x.d + 3 * x.f + V) * w.e_m if w.amp else 0
        e_q = self.offload_qk_width(spec, w)
        # k's RoPE runs next, q (e_q) and q_embed (e_r) alive: k's three temporaries beside them, the higher moment
        # when kv > 2a/3 (measured: the op timeline of Llama V97 h32 a4 kv4 d32 b2 s256 fp32, k's rotate_half * sin,
        # one q (262,144 B) above q's moment: -8.2% before)
        q_moment = q * e_q + 3 * q * w.e_r + kv * e_q + kv * w.e_m
        k_moment = q * e_q + q * w.e_r + kv * e_q + kv * w.e_m + 3 * kv * w.e_r
        rope = held - last_cache - pending + max(q_moment, k_moment)
        points = {"rope": rope}
        if c.attention == "sdpa":
            masked = self.masked(c, spec)
            gqa = x.kv == x.a or parts.sdpa_enable_gqa(x, masked)
            own = 0 if not spec.checkpointing else kv * w.e_r + kv * w.e_m
            # repeat_kv's copies: k after RoPE (e_r) and v, under checkpointing as v_proj made it (e_m: the cache is
            # off), else the cache's (e_r: its cat promotes); autocast casts q, k and an e_r v to bf16 (measured:
            # Mistral V97 h48 f96 a6 kv2 b1 s512 bf16-AMP checkpointed, the SDPA point 98,304 B above the
            # simulation with v at e_r and cast; without checkpointing the cache's v is fp32, to the byte)
            e_v = w.e_m if spec.checkpointing else w.e_r
            rep = 0 if gqa else q * (w.e_r + e_v)
            mask = b * s * s * w.e_m if masked else 0  # (the model's bool mask: held, offload_forward_held)
            kvs = kv if gqa else q
            casts = (q + kvs + (kvs if e_v > w.e_m else 0)) * w.e_m if w.amp else 0
            points["sdpa"] = (held - pending + q * w.e_r + own + rep + mask + casts + q * w.e_m
                              + 4 * b * x.a * parts.sdpa_lse_len(x, masked, spec, w, s))  # (CUDA pads it)
        return points

    def offload_backward_points(self, c, spec, w, points: dict[str, int], grads_exist: bool = False) -> dict[str, int]:
        """--offload-activations without checkpointing (planner/estimate/offload_act.py runs the generic sweep with
        empty saved sets in the step's widths, autocast's copies gone): at the gated product's backward the down
        projection's input grad and MulBackward's two grads (d act, d up) are alive at once, 3*b*s*f*e_m (bf16
        under autocast), where the sweep's ffn point counts 2*b*s*f*e_m beside the saved operands, which are host
        copies here (measured: the backward's op timeline of Llama V97 h64 f512 b2 s128, fp32 -524,296 B before;
        Llama V97 h32 f128 b4 s64 bf16-AMP, the ffn point G + 4*b*s*h + 3*b*s*f*2 to the byte). A correction to the
        sweep's own points, so the same in a later micro-batch (grads_exist: the sweep's points already hold only the
        new grads)."""
        if spec.checkpointing:
            return points
        b, s, x = spec.batch_size, spec.seq_len, self.shape(c)
        bsf = b * s * c.intermediate_size
        # eager attention's softmax backward: its two fp32 b*a*s^2 tensors with nothing freed beside them (the
        # sweep's point offsets the probabilities' saved cast, e_m below fp32, and o_proj's saved input, both host
        # copies here), and v's grad alive (measured: the backward's op timelines of Gemma 2 V97 h32 f128 a4 kv4 b4
        # s64 fp32 and bf16, SoftmaxBackward's point, -3.4% / -2.4% before). v's grad is in the cache's v dtype, e_r
        # (the cache holds v in the residual dtype without checkpointing: offload_attention_points): under autocast
        # the probabilities @ v matmul's bf16 grad of v is cast back to fp32 (ToCopyBackward) before the softmax
        # backward (measured: the op timelines of Llama eager V97 h32 a4 kv2 b2 s256 and Gemma 2 V97 h32 a4 kv2 b2
        # s256 bf16-AMP, a (b, a, s, d) fp32 tensor at SoftmaxBackward's point; b*s*a*d*2 = -0.70% / -2.55% before)
        eager = (b * x.a * s * s * (w.e_m if w.e_m < 4 else 0) + b * s * x.a * x.d * (w.e_m + w.e_r)
                 if c.attention == "eager" else 0)
        if eager and grads_exist:
            # a later micro-batch: the sweep's points after the MLP hold one MLP weight's new grad before its in-place
            # add (training.py _backward_sweep's pending); by the softmax backward every MLP grad has been added and
            # freed (measured: the op timeline of Gemma 2 V97 h32 f64 a4 kv2 b2 s256 fp32 accum 2, the later
            # micro-batch's SoftmaxBackward point, f*h*e_p = 8,192 B over before: +0.16%)
            e_p = 2 if spec.precision == "bf16" else 4
            eager -= e_p * max((t.numel for t in self.inventory(c) if t.kind == "param" and t.block == 0
                                and t.role in ("mlp.in", "mlp.out") and not t.is_bias), default=0)
        out = {k: v + (bsf * w.e_m if k.endswith(" ffn") else eager if k.endswith(" attention") else 0)
               for k, v in points.items()}
        qk = self.offload_qk_norm_points(c, spec, w, out, grads_exist)  # (read from the sweep's own rope point)
        rope = self.offload_rope_backward(c, spec, w)
        return {**{k: v + (rope if k.endswith(" rope") else 0) for k, v in out.items()}, **qk}

    def offload_rope_backward(self, c, spec, w) -> int:
        """--offload-activations without checkpointing: what RoPE's backward holds beyond the sweep's rope point (three
        q grads and the k and v grads, all in the sweep's widths: e_m, autocast off). q_embed = q * cos +
        rotate_half(q) * sin (transformers' apply_rotary_pos_emb), k's the same, in RoPE's output dtype e_rope (fp32
        under autocast: q * cos promotes), q and k as RoPE gets them in e_in (offload_qk_width: the projections'
        outputs, Qwen 3's head norms'); each MulBackward casts its grad to e_in. For one of q, k (n elements) with
        its incoming grad g (e_rope) alive throughout, two high moments:
          rotate_half's backward: g * sin (e_in), then the two slice_backward outputs (e_in each) before their add:
              n*(e_rope + 3*e_in);
          the cos branch: the rotate_half grad summed (e_in), g * cos (e_rope) and, below e_rope, its cast (e_in):
              n*(2*e_rope + e_in + [e_in < e_rope]*e_in).
        k's runs first, with q's incoming grad (q*e_rope) and v's grad (kv*e_m: back in v_proj's dtype) waiting;
        then q's, with k's finished grad (kv*e_in) and v's. Measured on the backward's op timeline (a*d = 4h, so
        RoPE is the block's top): Gemma V97 h32 a4 kv2 d32 b2 s256, fp32 q's slice moment (16*q; -12.9% before),
        bf16-AMP q's cos moment (12*q; -24.6% before); kv4 (= a) bf16-AMP k's cos moment, 2*q above q's (-26.5%
        before); each to 8 B."""
        b, s, x = spec.batch_size, spec.seq_len, self.shape(c)
        q, kv = b * s * x.a * x.d, b * s * x.kv * x.d
        e_rope = 4 if w.amp else w.e_m
        e_in = self.offload_qk_width(spec, w)
        top = max(e_rope + 3 * e_in, 2 * e_rope + e_in + (e_in if e_in < e_rope else 0))  # per element
        q_moment = q * top + kv * e_in + kv * w.e_m
        k_moment = q * e_rope + kv * w.e_m + kv * top
        return max(q_moment, k_moment) - 3 * q * w.e_m - 2 * kv * w.e_m

    def offload_bound_note(self, c, spec) -> str | None:
        """--offload-activations' measured bound where the points still miss (planner/estimate/offload_act.py adds
        it to the notes): none for the RMS decoders without checkpointing (eager attention under bf16-AMP, low by up
        to 2.6% before v's fp32 grad was modelled, is now to 8 B: offload_backward_points); a family names its own."""
        return None

    def offload_qk_norm_points(self, c, spec, w, points: dict[str, int], grads_exist: bool = False) -> dict[str, int]:
        """Qwen 3's q_norm backward without checkpointing (every saved tensor a host copy): the RMSNorm over
        head_dim runs in fp32, and at its pow's backward five fp32 q-sized tensors are alive (the normed x's grad
        waiting for its sum, mean's, pow's and its two muls' outputs: 5*b*s*a*d*4), beside the residual's grad and
        the k and v projections' summed input grad (b*s*h*e_r each) and every grad of the block but q_proj's and
        the input norm's (k_proj's, v_proj's and both head norms' made). Read from the sweep's rope point (the
        same grads less k/v's, with RoPE's three q grads and the k and v grads in the sweep's e_m: autocast off).
        Measured: the backward's op timeline of Qwen 3 V97 h48 f96 a6 kv2 b1 s512 bf16-AMP, the step's backward
        peak (-16.3% before). k_norm's backward runs first, with v_proj's input grad and q's grad out of RoPE
        alive and five kv-sized fp32 tensors (measured: Qwen 3 V97 h32 f128 a4 kv4 b4 s64 bf16-AMP, -3.4% before;
        the higher one when kv = a).
        grads_exist (a later micro-batch of --grad-accum): the projections' and head norms' new grads are added in
        place to their .grad (counted by the caller) and freed, so neither point holds one (measured: Qwen 3 V97 h32
        a4 kv2 d24 b2 s256 accum 2, fp32 and bf16-AMP, the later micro-batch's q_norm point 2*kv*d*h*e_p = 12,288 B
        over before: +0.73%)."""
        if not self.qk_norm:
            return {}
        b, s, x = spec.batch_size, spec.seq_len, self.shape(c)
        q, kv = b * s * x.a * x.d, b * s * x.kv * x.d
        e_p = 2 if spec.precision == "bf16" else 4
        made = 0 if grads_exist else e_p  # bytes per parameter of a grad made and kept apart from .grad
        e_rope = 4 if w.amp else w.e_m  # RoPE's output dtype (q * cos promotes to fp32 under autocast)
        out = {}
        for k, v in points.items():
            if k.endswith(" rope"):
                # the rope point's grads (the head norms' weights' counted made) and the residual's grad, with the
                # summed (v, then k and v) projections' input grad in place of RoPE's q, k and v grads
                at = v - 3 * q * w.e_m - 2 * kv * w.e_m + b * s * x.h * w.e_r
                out[k[:-len("rope")] + "q_norm"] = at + 2 * x.kv * x.d * x.h * made + 5 * q * 4
                # k_norm's, first: v_proj's grad made, q_norm's weight grad not yet, q's grad out of RoPE waiting
                out[k[:-len("rope")] + "k_norm"] = (at + (x.kv * x.d * x.h - x.d) * made + q * e_rope
                                                    + 5 * kv * 4)
        return out

    def offload_qk_width(self, spec, w) -> int:
        """The width of q and k as RoPE gets them: the projections' outputs (e_m)."""
        return w.e_m

    def offload_modelled(self, c) -> bool:
        """The configurations offload_copies is measured for (a family narrows it)."""
        return True

    def offload_norm(self, label, b, s, h, w, e_in, e_p, per_layer=True, where="block") -> Term:
        """transformers' RMSNorm (x.to(float32), pow, mean, rsqrt, x * rsqrt, weight * normed.to(input dtype)):
        its fp32 input twice (pow, mul), rsqrt's b*s output twice (rsqrt, mul), the normed x in the input dtype
        (e_in) and the weight (e_p)."""
        return Term(f"host: RMSNorm ({label}): fp32 input x2, rsqrt x2, normed x, weight",
                    f"b*s*h*(8 + {'e_r' if e_in == w.e_r else 'e_m'}) + 8*b*s + h*e_p",
                    b * s * h * (8 + e_in) + 8 * b * s + h * e_p, per_layer, where)

    def offload_block_norms(self, c, spec, w, e_p) -> list[Term]:
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        return [self.offload_norm("input_layernorm", b, s, h, w, w.e_r, e_p),
                self.offload_norm("post_attention_layernorm", b, s, h, w, w.e_r, e_p)]

    def offload_attention(self, c, spec, w) -> list[Term]:
        """SDPA (the CPU flash kernel, mask or not): q, k, v (un-repeated with enable_gqa, else repeat_kv's
        copies), its output (e_m), an fp32 (b, a, s) logsumexp, and with a mask the (b, 1, s, s) mask converted to
        the query's dtype. Eager (eager_attention_forward): q @ k^T saves q and the repeated k^T, softmax(fp32)
        its output, the probabilities' cast (below fp32; in fp32 the same tensor saved again, one more copy) and
        the repeated v are saved by the second matmul; the additive mask is added, not saved (measured)."""
        b, s = spec.batch_size, spec.seq_len
        x = self.shape(c)
        q, kv = x.a * x.d, x.kv * x.d
        if c.attention == "sdpa":
            masked = self.masked(c, spec)
            kvs = kv if parts.sdpa_enable_gqa(x, masked) else q
            lse = parts.sdpa_lse_len(x, masked, spec, w, s)  # (CUDA's memory-efficient kernel pads it)
            terms = [Term("host: SDPA q, k, v, output and fp32 logsumexp",
                          "b*s*(2*a*d + 2*kv*d)*e_m + 4*b*a*s" if kvs == kv else "4*b*s*a*d*e_m + 4*b*a*s",
                          b * s * (2 * q + 2 * kvs) * w.e_m + 4 * b * x.a * lse, True)]
            efficient = parts.sdpa_efficient(x, masked, spec, w)
            if masked:
                # CUDA's memory-efficient kernel saves the mask as preprocess_mask leaves it, expanded to
                # (b, a, s, s) (aten/src/ATen/native/transformers/attention.cpp: a view of the (b, 1, s, s) mask),
                # and the pack hook copies the view's own numel: a heads (measured on an H200,
                # tests/data/cuda/2026-11-27-h200: Mistral and Phi-3 V1000 h64 a4 b2 s64 fp32, the host bytes
                # (a - 1)*b*s^2*4 + 16 a block above with one head's)
                heads = x.a if efficient else 1
                terms.append(Term("host: SDPA's mask in the query's dtype" + (" (expanded to the heads)" if efficient
                                                                              else ""),
                                  "b*a*s^2*e_m" if efficient else "b*s^2*e_m", b * heads * s * s * w.e_m, True))
            if efficient or (spec.device_type == "cuda" and cuda_sdpa_kernel(w, False) == "cuDNN"
                             and not parts.sdpa_math(x, masked, spec, w)):
                # CUDA's fused kernels (cuDNN, memory-efficient) also save their philox seed and offset, two
                # one-element int64 tensors (ScaledDotProduct{Cudnn,Efficient}AttentionBackward0's philox_seed /
                # philox_offset; measured on an H200, tests/data/cuda/2026-11-27-h200: every bf16-AMP offload
                # row's host bytes 16 B a block above without them)
                terms.append(Term("host: SDPA philox seed and offset (int64)", "2*8", 16, True))
            return terms
        return [Term("host: eager attention q, k^T, v (repeated)", "3*b*a*s*d*e_m", 3 * b * s * q * w.e_m, True),
                Term("host: softmax output (fp32) and the probabilities the second matmul saves",
                     "b*a*s^2*(4 + e_m)", b * x.a * s * s * (4 + w.e_m), True)] + self.offload_attention_extra(c, spec, w)

    def offload_attention_extra(self, c, spec, w) -> list[Term]:
        return []

    def offload_embed_extra(self, c, spec, w, e_p) -> list[Term]:
        return []

    def offload_head_extra(self, c, spec, w) -> list[Term]:
        return []

    def mask_terms(self, c, spec, w) -> list[Term]:
        """SDPA given a mask (a sliding window no longer than the sequence): the CPU flash kernel converts
        the (b, 1, s, s) bool mask to the query's dtype and saves that copy, in every layer (measured)."""
        if c.attention == "sdpa" and self.masked(c, spec):
            b, s = spec.batch_size, spec.seq_len
            return [Term("sliding-window mask as SDPA saves it (in the attention dtype)", "b*s^2*e_m",
                         b * s * s * w.e_m, True)]
        return []

    def outside_terms(self, c, spec, w) -> list[Term]:
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        terms = ([parts.rope(b, s, self.rope_dim(c), w)]
                 + self.norm_terms("final norm", b, s, h, w, where="head", per_layer=False)
                 + [Term("lm_head input", "b*s*h*e_m", b * s * h * w.e_m, where="head")])
        masked = self.masked(c, spec)
        # eager: the additive float mask, materialised per batch row; sdpa (a sliding window <= s): the bool
        # mask, built once and broadcast over the batch (measured: s^2 bytes)
        mask_bytes = b * s * s * w.e_r if c.attention == "eager" else s * s
        return terms + parts.checkpoint_inputs(self.shape(c), b, s, spec, w, masked, mask_bytes)

    def forward_terms(self, c, spec, w) -> list[Term]:
        return parts.forward_only(self.shape(c), c.num_hidden_layers, spec.batch_size, spec.seq_len, spec, w,
                                  self.masked(c, spec))

    def stash_extra(self, c, spec, w) -> int:
        """Below fp32 the RMSNorm saves an fp32 copy, not the block input: the stashed input is its own
        tensor."""
        return spec.batch_size * spec.seq_len * c.hidden_size * w.e_r if w.e_r < 4 else 0

    # ---- fine-tuning: what the block saves when only some tensors need grad ----------------------------
    # planner/arch/saved.py walks the block in order and asks these for the family's own pieces; torch
    # saves an op's input only for the grads it must compute (a mul saves each operand for the other's grad).
    def saved(self, c, spec, w, i: int, rg_in: bool, trains: set | None, adapted: dict,
              weights_cached: bool = False) -> tuple[list[Term], bool, bool]:
        """Block i's saved tensors given whether its input needs grad, the trainable tensors' names (None: all)
        and the LoRA-adapted linears (planner/arch/saved.py); returns them, whether the block's output needs grad
        and whether RoPE's cos/sin are saved in it. Full training (block_terms) is the case where everything
        trains, with autocast's weight copies left to its cache term (weights_cached)."""
        from .saved import block_saved

        return block_saved(self, c, spec, w, i, rg_in, trains, adapted, weights_cached)

    def saved_mlp(self, wk, rg_in: bool) -> bool:
        """The gated MLP in the walk (planner/arch/saved.py BlockWalk), its input the post-attention norm's
        output (rg_in: it needs grad); returns whether its output needs grad."""
        mlp = wk.linear_group("mlp.in", rg_in, wk.h, "n2")
        if self.fused_gate_up:
            gate = up = mlp.get("gate_up_proj", False)
        else:
            gate, up = mlp.get("gate_proj", False), mlp.get("up_proj", False)
        prod_rg = wk.gated_mlp(gate, up, wk.sh.f, fused=self.fused_gate_up)
        return any(wk.linear_group("mlp.out", prod_rg, wk.sh.f, "prod").values())

    def ft_norm(self, label: str, b: int, s: int, h: int, e_r: int, rg_in: bool, trains: bool, part: str = "",
                where: str = "block") -> list[Term]:
        """transformers' RMSNorm: x.float() (a copy below fp32), x * rsqrt(mean(x^2) + eps), weight * normed:
        its fp32 input and rsqrt when its input needs grad, its normed x when its weight trains."""
        per_layer = where == "block"
        terms = []
        if rg_in:
            terms.append(Term(f"{label}: fp32 input, rsqrt (input needs grad)", "4*b*s*h + 4*b*s",
                              4 * b * s * h + 4 * b * s, per_layer, where, part))
        if trains:
            terms.append(Term(f"{label}: normed x (weight trains)", "b*s*h*e_r", b * s * h * e_r, per_layer, where, part))
        return terms

    def ft_post_norm(self, label: str, b: int, s: int, h: int, e_r: int, rg_in: bool, trains: bool, part: str,
                     where: str = "block") -> tuple[list[Term], bool]:
        """A norm on a sublayer's output before its residual add (Gemma 2's sandwich norms): its saves and whether
        its output needs grad. Llama-shaped blocks have none: the sublayer's output passes as it is."""
        return [], rg_in

    def ft_qk_norm(self, x: parts.Shape, b: int, s: int, e: int, q: bool, k: bool,
                   qk_trains: bool) -> tuple[list[Term], bool, bool]:
        """Qwen 3's q_norm / k_norm (RMSNorm over head_dim, models/qwen3/modeling_qwen3.py) in the block
        walk, full training's too: each saves its fp32 input and an fp32 rsqrt per head when its input (the
        projection's output) needs grad, and its normed x (e_m) when its weight trains; a training norm weight
        makes its output need grad. Returns the terms and whether q and k then need grad."""
        if not self.qk_norm:
            return [], q, k
        terms = []
        for name, rg, heads in (("q_norm", q, x.a), ("k_norm", k, x.kv)):
            if rg:
                terms.append(Term(f"{name}: fp32 input, rsqrt (input needs grad)", "4*b*s*heads*d + 4*b*s*heads",
                                  4 * b * s * heads * x.d + 4 * b * s * heads, True))
            if qk_trains:
                terms.append(Term(f"{name}: normed x (weight trains)", "b*s*heads*d*e_m", b * s * heads * x.d * e, True))
        return terms, q or qk_trains, k or qk_trains

    def host_norm(self, label: str, b: int, s: int, h: int, e_r: int, e_p: int, rg_in: bool, trains: bool,
                  per_layer: bool = True, where: str = "block") -> list[Term]:
        """The walk's host view of transformers' RMSNorm (planner/arch/saved.py; offload_norm's pieces by what
        needs grad): when its input needs grad the fp32 input twice (pow, mul), rsqrt's output twice (rsqrt, mul)
        and the weight (weight * normed, for the normed x's grad); when its weight trains the normed x (e_r)."""
        terms = []
        if rg_in:
            terms.append(Term(f"host: RMSNorm ({label}): fp32 input x2, rsqrt x2, weight", "8*b*s*h + 8*b*s + h*e_p",
                              8 * b * s * h + 8 * b * s + h * e_p, per_layer, where))
        if trains:
            terms.append(Term(f"host: RMSNorm ({label}): normed x (weight trains)", "b*s*h*e_r", b * s * h * e_r,
                              per_layer, where))
        return terms

    def host_qk_norm(self, x: parts.Shape, b: int, s: int, w, e_p: int, q: bool, k: bool,
                     qk_trains: bool) -> list[Term]:
        """The walk's host view of Qwen 3's q_norm / k_norm (offload_copies' term by what needs grad): per norm,
        when its input (the projection's output) needs grad its fp32 input twice, rsqrt's (b, s, heads, 1) output
        twice and its weight (e_p); when its weight trains the normed x in the input's dtype (e_m)."""
        if not self.qk_norm:
            return []
        terms = []
        for name, rg, heads in (("q_norm", q, x.a), ("k_norm", k, x.kv)):
            if rg:
                terms.append(Term(f"host: {name}: fp32 input x2, rsqrt x2, weight", "8*b*s*heads*d + 8*b*s*heads + d*e_p",
                                  8 * b * s * heads * x.d + 8 * b * s * heads + x.d * e_p, True))
            if qk_trains:
                terms.append(Term(f"host: {name}: normed x (weight trains)", "b*s*heads*d*e_m",
                                  b * s * heads * x.d * w.e_m, True))
        return terms

    def ft_attention_extra(self, c, x: parts.Shape, b: int, s: int, e: int, q: bool, k: bool) -> list[Term]:
        """Saves of the family's own eager-attention ops beyond the scores, softmax and values (none here)."""
        return []

    def ft_head_extra(self, c, b: int, s: int, e: int) -> list[Term]:
        """Saves after the output head beyond its input (none here)."""
        return []

    def ft_final_norm_released(self, out: list[Term], h: int) -> int:
        """Bytes the final norm's backward has released before its high point (none for Llama's RMSNorm)."""
        return 0

    def ft_post_norm_released(self, blk: list[Term], b: int, s: int, h: int, g: int) -> int:
        """Bytes a norm after the MLP (ft_post_norm: none here) has released before its rsqrt chain's high point."""
        return 0

    def mask_count(self, c) -> int:
        """Additive attention masks the model's forward builds and keeps through its layers (one here)."""
        return 1

    def infer_mask_count(self, c, ispec) -> int:
        """The additive masks alive in generate()'s forward (eager): mask_count's, unless the family's model builds
        one its layers do not take (Gemma 2's, with a cache other than static)."""
        return self.mask_count(c)

    def checkpoint_mask_count(self, c, spec) -> int:
        """Of those, the ones checkpointed layers keep as checkpoint inputs through backward (planner/arch/gemma2.py:
        a checkpointing policy can leave a mask's layers uncheckpointed)."""
        return self.mask_count(c)

    # ---- inference (planner/estimate/inference.py) ------------------------------------------------
    def check_infer(self, c, ispec) -> None:
        self.check_infer_offloaded(c, ispec)
        # (a window shorter than the run: dynamic / sliding is DynamicSlidingWindowLayer's, static keeps window-sized
        # StaticSlidingWindowLayers (infer_windows.py static_window_options); quantized is refused by infer_caches)

    def check_infer_offloaded(self, c, ispec) -> None:
        """The offloaded estimate counts alike layers (planner/estimate/infer_caches.py): a window that binds
        (DynamicSlidingWindowLayers of another size) is not modelled with it."""
        if ispec.cache == "offloaded" and self.infer_window_binds(c, dataclasses.replace(ispec, cache="sliding")):
            raise ConfigError("--cache offloaded with a sliding window shorter than prompt + new tokens is not "
                              "modelled yet (the offloaded layers would hold the window)")

    def infer_caches(self, c) -> tuple[str, ...]:
        """generate's caches for this config (planner/infer_spec.py CACHES): sliding needs a sliding window;
        QuantizedCache refuses a model with any sliding layer (cache_utils.py QuantizedCache.__init__)."""
        windowed = any(w is not None for w in self.infer_layer_windows(c))
        return ("dynamic", "static") + (("sliding",) if windowed else ("quantized",)) + ("offloaded",)

    def infer_layer_windows(self, c) -> list:
        """Each layer's sliding window in generate's DynamicCache, None for a full-attention layer: every layer
        when the config sets sliding_window (cache_utils.py get_layer_types_and_kwargs)."""
        return [self.sliding_window(c)] * c.num_hidden_layers

    def infer_kv_decode_bytes(self, c, ispec, e: int) -> int:
        """The cache after the last decode step; sliding layers keep min(p + n - 1, w) tokens when a window binds."""
        if self.infer_window_binds(c, ispec):
            from .infer_windows import kv_after

            return kv_after(self, c, ispec, e, ispec.new_tokens - 1)
        return super().infer_kv_decode_bytes(c, ispec, e)

    def infer_static_windows(self, c, ispec) -> bool:
        """generate's StaticCache gives a layer with a window a StaticSlidingWindowLayer (cache_utils.py
        get_layer_types_and_kwargs): when a window is no longer than the cache (p + n - 1) it keeps the window."""
        from .infer_windows import static_binds

        return static_binds(self.infer_layer_windows(c), ispec)

    def infer_window_binds(self, c, ispec) -> bool:
        """A sliding window no longer than the last decode step's tokens: the cache keeps fewer tokens than a
        plain DynamicCache (planner/arch/infer_windows.py)."""
        from .infer_windows import binds

        return ispec.cache in ("dynamic", "sliding") and binds(self.infer_layer_windows(c), ispec)

    def infer_prefill_window_mask(self, c, ispec) -> bool:
        """SDPA gets a bool mask in the prompt's forward: a layer's window is no longer than the prompt
        (masking_utils.py _ignore_causal_mask_sdpa: kv_length >= local_attention_size)."""
        return c.attention == "sdpa" and ispec.cache in ("dynamic", "sliding") and any(
            w is not None and ispec.prompt_len >= w for w in self.infer_layer_windows(c))

    def kv_bytes_per_token(self, c, e: int) -> int:
        """K and V of every layer, (kv heads x head_dim) each (cache_utils.py DynamicLayer / StaticLayer)."""
        return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * e

    def infer_prefill_points(self, c, ispec, e: int) -> dict[str, int]:
        """The last layer of the prompt's forward under torch.inference_mode (no tensor is saved: only the
        Python references of the forward keep tensors alive; measured op by op on the live-bytes timeline):
        always alive there: inputs_embeds (the model forward's local) and the layer's input (the caller's
        hidden_states; the same tensor in a 1-layer model), cos and sin (b, s, d_rope) in the weights' dtype.
        attention (eager): the input norm's output, q after RoPE, the repeat_kv copies of K and V (none when
        kv = a), the (b, 1, s, kv_len) additive mask, and the scores: matmul * scaling (+ mask), softmax's
        fp32 output and, below fp32, its cast back, b*a*s*kv_len*(e + 4 + [e < 4]*e).
        attention (sdpa): the norm output, q, the K/V SDPA reads (repeated unless enable_gqa) and its output.
        mlp: the residual and the post-attention norm's output, act(gate), up and their product (3*b*s*f;
        Phi-3's fused gate_up: its (b, s, 2f) output, act(gate) and the product, 4*b*s*f).
        norm: the post-attention RMSNorm in fp32: the residual and two fp32 b*s*h temporaries.
        eager, after the attention: its mask and the returned attention weights (kept by the layer's `_`)."""
        kv_len = ispec.total_len - 1 if ispec.cache == "static" else ispec.prompt_len
        return self.infer_forward_points(c, ispec, e, ispec.prompt_len, kv_len,
                                         self.infer_prefill_window_mask(c, ispec))

    def infer_forward_points(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> dict[str, int]:
        """The last layer's high points (infer_prefill_points) of one forward of s queries over kv_len keys: the
        prompt's (s = p) or a decode step's (s = 1, kv_len = the cache), above the weights, generate's tensors
        and the cache. `masked`: SDPA gets a sliding-window bool mask (infer_prefill_window_mask)."""
        x = self.shape(c)
        b, h = ispec.batch_size, c.hidden_size
        bsh = b * s * h
        ctx = (2 if c.num_hidden_layers > 1 else 1) * bsh * e + 2 * b * s * self.rope_dim(c) * e
        if masked:  # the (1, 1, s, s) bool sliding-window mask, built once (no padding: batch 1) and kept (measured)
            ctx += s * kv_len
        attn = bsh * e + self.infer_attention_at(c, ispec, e, s, kv_len, masked)
        if self.fused_qkv:  # Phi-3 binds the qkv_proj output (`qkv`) for the whole attention forward (measured)
            attn += b * s * (x.a + 2 * x.kv) * x.d * e
        # fused gate_up (Phi-3): gate and up are views of one (b, s, 2f) output, alive until the product exists
        mlp = 2 * bsh * e + (4 if self.fused_gate_up else 3) * b * s * x.f * e
        norm = bsh * e + 8 * bsh
        if e < 4:
            # LlamaRMSNorm below fp32: at `hidden_states * torch.rsqrt(variance + eps)` the fp32 copy of x, the
            # product and the (b, s, 1) fp32 variance and rsqrt are alive: 8*b*s above the two fp32 temporaries (in
            # fp32 the later `weight * x` point is the higher). Measured on the live-bytes op log (issue #39's fuzz:
            # llama V7849 h128 f64 a4 kv2 d32 L3 b4 p216 n13 fp16 SDPA static, the prompt's peak there, 6,912 B)
            norm += 8 * b * s
        if c.attention == "eager":
            # the additive mask (built once per forward, alive through every layer) and the attention weights
            # eager_attention_forward returns, which the decoder layer keeps in `_` through its MLP (measured)
            after = b * s * kv_len * e + b * x.a * s * kv_len * e
            mlp, norm = mlp + after, norm + after
            # the model's other additive masks (mask_count: Gemma 2 builds a full and a sliding-window mask
            # before its layers, both alive through every layer; measured)
            ctx += (self.infer_mask_count(c, ispec) - 1) * b * s * kv_len * e
        return {"attention": ctx + attn, "mlp": ctx + mlp, "norm": ctx + norm,
                ROPE_POINT: ctx + bsh * e + self.infer_rope_at(c, ispec, e, s, kv_len)}

    def infer_rope_at(self, c, ispec, e: int, s: int, kv_len: int) -> int:
        """The prompt's RoPE in the last layer, before its cache update: apply_rotary_pos_emb (transformers 5.23
        models/llama/modeling_llama.py, copied by every RMSNorm decoder here) computes q_embed = (q * cos) +
        (rotate_half(q) * sin), then k_embed alike; rotate_half is torch.cat((-x2, x1)). Alive: the q, k and v
        projections' outputs (a + 2*kv heads of (b, s, d); Qwen 3's q/k norm outputs in q and k's place, Phi-3's
        fused qkv output the same bytes), and at q's `rotate_half(q) * sin` q * cos, the cat and the product (3 a),
        or at k's q_embed (a) with k * cos, the cat and the product (3 kv): b*s*d*e*max(4a + 2kv, 2a + 5kv);
        eager: the model's additive masks (mask_count of (b, 1, s, kv_len); Gemma 2's two measured). Measured on the live-bytes op log
        (qwen3 V2000 h48 a6 kv6 d24 b2 s48 sdpa fp32: the prompt's peak at k's product with sin, 147,456 B
        above the attention point). The last layer's K/V is not written yet (infer_prefill_unwritten_kv)."""
        # eager: the model's additive mask (its other masks, mask_count - 1, are in the points' context)
        masks = ispec.batch_size * s * kv_len * e if c.attention == "eager" else 0
        return self.infer_rope_rotation(c, ispec, e, s) + masks

    def infer_rope_rotation(self, c, ispec, e: int, s: int) -> int:
        """The q, k, v projections' outputs and the rotation's tensors at its high point (infer_rope_at)."""
        x = self.shape(c)
        return ispec.batch_size * s * x.d * e * max(4 * x.a + 2 * x.kv, 2 * x.a + 5 * x.kv)

    def infer_prefill_unwritten_kv(self, c, ispec, e: int) -> dict[str, int]:
        """At the RoPE point the last layer's K and V (b, kv, kv_len, d) are not in the cache yet (DynamicLayer
        and StaticLayer allocate at their first update): one layer of the prefill cache planner/estimate/inference.py
        counts (every layer at the prompt, a StaticCache's at p + n - 1)."""
        kv_len = ispec.total_len - 1 if ispec.cache == "static" else ispec.prompt_len
        return {ROPE_POINT: 2 * ispec.batch_size * c.num_key_value_heads * c.head_dim * kv_len * e}

    def infer_attention(self, c, ispec, e: int, s: int, kv_len: int) -> int:
        return self.infer_attention_at(c, ispec, e, s, kv_len, False)

    def infer_attention_at(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> int:
        """One attention call's tensors beyond the cache, s queries over kv_len keys (eager_attention_forward,
        sdpa_attention_forward): q after RoPE; eager: repeat_kv's copies of K and V (none when kv = a), the
        (b, 1, s, kv_len) mask in the weights' dtype, the scores (matmul * scaling, + mask), softmax's fp32
        output and below fp32 its cast back: b*a*s*kv_len*(e + 4 + [e < 4]*e); sdpa: its output, and K/V
        repeated unless enable_gqa (no mask: a StaticCache passes one), a StaticCache's bool mask."""
        x = self.shape(c)
        b = ispec.batch_size
        q = b * x.a * s * x.d * e
        # repeat_kv (expand + reshape) copies unless kv = 1: one K/V head reshapes to a stride-0 view (measured)
        if c.attention == "eager":
            kv_rep = 2 * b * x.a * kv_len * x.d * e if 1 < x.kv < x.a else 0
            scores = b * x.a * s * kv_len * (e + 4 + (e if e < 4 else 0))
            # after the softmax (eager_attention_forward): its output in e, matmul(weights, v) and its
            # transpose(1, 2).contiguous() copy, 2 q; above the scores when 2 d > s (measured: gemma V2000 h48 a6
            # d32 b2 s48 eager fp32 quantized cache, the prompt's peak at that contiguous)
            after = b * x.a * s * kv_len * e + 2 * q if s > 1 else 0
            return q + kv_rep + b * s * kv_len * e + max(scores, after)
        # measured: a StaticCache's padded mask is not passed at these shapes either (K/V are not repeated)
        # (masked: a sliding-window mask is passed, and transformers then repeats K/V instead of enable_gqa; one
        # query packs the heads into the K/V groups instead, integrations/sdpa_attention.py pack_gqa: no copy)
        kv_rep = 2 * b * x.a * kv_len * x.d * e if (
            1 < x.kv < x.a and not parts.sdpa_enable_gqa(x, masked and s > 1)) else 0
        return 2 * q + kv_rep

    def infer_decode_points(self, c, ispec, e: int) -> dict[str, int]:
        """DynamicLayer.update (cache_utils.py): `self.keys = torch.cat([self.keys, key_states], dim=-2)`
        holds the old and the new keys (then values) of one layer at once: the last layer's old K and V
        (b, kv, p + n - 2, d) on top of the grown cache. A StaticCache writes in place (index_copy_)."""
        if self.infer_window_binds(c, ispec):  # DynamicSlidingWindowLayers that keep fewer tokens
            from .infer_windows import decode_points

            return decode_points(self, c, ispec, e)[1]
        b = ispec.batch_size
        x = self.shape(c)
        static = ispec.cache == "static"
        kv_len = ispec.total_len - 1
        # inside the last forward generate holds input_ids and the attention mask at p + n - 1 each (the mask
        # grows after the forward: _update_model_kwargs_for_generation), and the previous step's fp32 logits
        # copy and, when logits processors run (an EOS id is set), its processed scores apart (measured)
        ids = 16 * b * kv_len
        prev = 4 * b * c.vocab_size * (2 if self.infer_has_eos else 1)
        # the step's hidden states: inputs_embeds, the layer's input and the input norm's output (b, 1, h),
        # and cos / sin (b, 1, d_rope)
        step = 3 * b * c.hidden_size * e + 2 * b * self.rope_dim(c) * e
        # the last forward's attention over the whole cache (one query)
        # (eager: the model's masks, mask_count of them; a StaticCache's are counted by infer_cache_state_bytes)
        masks = (self.infer_mask_count(c, ispec) * b * kv_len * e if c.attention == "eager" else 0)
        points = {"attention over the cache": ids + prev + step + self.infer_attention(c, ispec, e, 1, kv_len)
                  - (b * kv_len * e if c.attention == "eager" else 0) + (0 if static else masks)}
        # the step's last layer as the prompt's (infer_forward_points at one query over the cache): its MLP and
        # post-attention norm (four (b, 1, h) hidden states, act(gate), up and their product; eager: the masks and
        # the attention weights the layer keeps through its MLP) and the points before its cache update (RoPE,
        # Qwen 3's q norm), where a DynamicCache's last layer still holds p + n - 2 tokens (one token's K and V
        # less); a StaticCache's masks are counted by infer_cache_state_bytes. Measured: llama V97 h96 a3 kv1 f256
        # b4 s8 eager fp32, the decode peak at act(gate) * up, 6,848 B above the cache concatenation point;
        # qwen3 V97 h32 a4 kv2 d24 b2 s256 sdpa fp32 static, at the RoPE of q
        fwd = self.infer_forward_points(c, ispec, e, 1, kv_len, False)
        before_update = self.infer_prefill_unwritten_kv(c, ispec, e)
        for k, v in fwd.items():
            if k == "attention":  # the attention over the cache: the point above
                continue
            unwritten = 2 * b * x.kv * x.d * e if (k in before_update and not static) else 0
            points[f"the step's {k}"] = ids + prev + v - (masks if static else 0) - unwritten
        if not static:
            # a layer's torch.cat of its values: the old values (b, kv, p + n - 2, d) beside the new, with the
            # step's q, k and v (q and k after RoPE) alive (a fused qkv projection's output, bound as Phi-3's `qkv`,
            # beside q and k: measured, phi3 V97 h32 a4 kv2 b2 s256 sdpa fp32); eager: the model's masks, built
            # before the layers (measured: qwen3 V2000 h48 a6 kv6 b2 s48 eager fp32, the decode peak at that cat,
            # the (b, 1, 1, p + n - 1) mask alive). A DynamicSlidingWindowLayer (a layer with a window, here one
            # longer than the run) binds `self.keys` to its new keys only after both cats (cache_utils.py
            # DynamicSlidingWindowLayer.update): its old keys are alive too (measured: gemma2 V2000 h48 a6 kv6 L3
            # b2 s48 eager fp32, the last layer sliding, 76,800 B). At layer l the later layers still hold one token
            # less; the highest layer is kept (the last, or a sliding one before a full last layer).
            old = b * x.kv * x.d * (ispec.total_len - 2) * e
            token = 2 * b * x.kv * x.d * e
            windows = self.infer_layer_windows(c)
            held, layer = max(((2 if w is not None else 1) * old - token * (len(windows) - 1 - l), l)
                              for l, w in enumerate(windows))
            # the step's hidden states: the first layer's input is inputs_embeds itself
            step_l = step - (b * c.hidden_size * e if layer == 0 and len(windows) > 1 else 0)
            points["cache concatenation (the last layer's old values)"] = (
                held + ids + prev + step_l + b * (x.a + 2 * x.kv) * x.d * e
                + masks + (b * (x.a + x.kv) * x.d * e if self.fused_qkv else 0))
        return points

    def infer_sliding_layers(self, c) -> int:
        """Layers whose DynamicCache layer is a DynamicSlidingWindowLayer (the config's sliding window applies)."""
        return c.num_hidden_layers if self.sliding_window(c) is not None else 0

    def infer_cache_state_bytes(self, c, ispec, phase: str) -> int:
        """cache_utils.py, measured: a StaticLayer's `cumulative_length = torch.tensor(0)` (int64) per layer, and
        in decode with SDPA the bool mask (b, 1, 1, p + n - 1) generate builds for a StaticCache and makes
        contiguous (generation/utils.py prepare_inputs_for_generation); a DynamicSlidingWindowLayer's
        `_sliding_window_tensor` (int64) per sliding layer."""
        if ispec.cache == "static":
            mask = 0
            # the 4-D mask over the cache length, alive through the step (measured); with sliding layers that keep
            # their window, one per kind at its own length, counted in planner/arch/infer_windows.py's points
            if phase == "decode" and not self.infer_static_windows(c, ispec):
                mask = ispec.batch_size * (ispec.total_len - 1) * (1 if c.attention == "sdpa" else
                                                                   self.infer_static_mask_bytes(c, ispec))
            return 8 * c.num_hidden_layers + mask
        return 8 * self.infer_sliding_layers(c)

    def infer_logits_terms(self, c, ispec, e: int) -> list[Term]:
        """The token selection of the last position (generation/utils.py _sample): the model output's
        logits (b, 1, V) in the weights' dtype, generate's fp32 copy `outputs.logits[:, -1].to(copy=True,
        dtype=float32)`, and MinNewTokensLengthLogitsProcessor (min_new_tokens=N, logits_process.py): the
        clone of the scores, torch.arange(V) (int64), the EOS mask (bool V) and torch.where's output, after
        MinLengthLogitsProcessor (generate sets min_length too) has returned its own torch.where output."""
        b, V = ispec.batch_size, c.vocab_size
        if not self.infer_has_eos:  # no EOS id: generate adds no MinLength / MinNewTokens processor (measured)
            return [Term("logits of the last position", "b*V*e", b * V * e, where="logits"),
                    Term("fp32 copy of the logits", "4*b*V", 4 * b * V, where="logits")]
        return [Term("logits of the last position", "b*V*e", b * V * e, where="logits"),
                Term("fp32 copy, MinLength's output, MinNewTokens' clone and torch.where output", "4*4*b*V",
                     16 * b * V, where="logits"),
                Term("MinNewTokensLengthLogitsProcessor vocab arange (int64) and EOS mask (bool)", "9*V", 9 * V,
                     where="logits")]

    # ---- backward high points -------------------------------------------------------------------------
    def block_points(self, c, spec, w, x) -> dict[str, int]:
        """In-block high points of a pre-norm RMSNorm + gated-MLP block's backward, read off the live-bytes
        timeline of transformers' model (planner.measure.tracker; ops labelled by the module that made
        their autograd node):
        ffn: the activation's backward, with the down projection's grad, the MLP output's grad (b*s*h*e_r)
             and two b*s*f gradients alive; autocast's MLP weight copies (2*f*h) already freed (a later
             micro-batch, whose down grad is added in place right after it is made: the higher of that
             moment, with the two b*s*f grads and without down_proj's saved input, and of down_proj's
             input-grad matmul, where its saved input and weight copy are still held and alive are dY (under
             autocast with its bf16 cast, b*s*h*e_m), the new weight grad (under autocast the bf16 one, made
             before the input grad) and the new input grad (b*s*f*e_m). Read off the op timeline of simulate's
             event log, llama bf16-AMP checkpointing accum 2: V97 h64 f160 b2 s64, the matmul is the top
             (20,480 B of weight grad, 16,392 B low without it); V97 h32 f64 tied b2 s256, the activation's
             backward is (the matmul 24,576 B below it); h32 f64 s64, the two are equal).
        mlp_in: the last MLP input projection's backward (gate_proj's; Phi-3's one gate_up_proj), at its
             input-grad matmul: every MLP weight grad exists (gate's just made); alive are the MLP input
             it saved (b*s*h*e_m), the residual's grad (b*s*h*e_r), the grad of its output (b*s*f*e_m; fused:
             SplitBackward's cat of both halves, 2*b*s*f*e_m), the up projection's input grad, already in the
             norm output's dtype (b*s*h*e_r; none when fused) and its own new input grad (b*s*h*e_m). Under
             autocast its bf16 weight copy is still held by its node and its weight grad is still the bf16
             one (4*f*h in place of the fp32 grad). Measured (fp32 Llama/Qwen 3 b4 s8 h96 f256): 12,288 B
             each b*s*h and 32,768 B b*s*f above mlp_done's state; the first block's peak when b*s*f is
             large beside the weights (Qwen 3 V97 h96 b4 s8 eager fp32: 1,727,016 B).
        mlp_done: the MLP's backward finished: its saved tensors freed, its grads made, the MLP input's grad
             and the residual's grad alive.
        mlp_cast (autocast): the last MLP weight's grad is made in bf16 then copied to fp32 (the cast
             weight's ToCopyBackward): both copies exist, beside the residual's grad and the MLP input's
             fp32 grad.
        norm: the post-attention RMSNorm's backward, in fp32: four fp32 b*s*h temporaries (16 B/elem).
        attention (eager, and SDPA's math kernel on CUDA: parts.sdpa_math): the softmax backward: the
             probabilities' gradient and the softmax backward's
             output are fp32 (softmax(dtype=float32)); below fp32 the freed cast offsets e_m.
        attn_in: the attention's input projections' backward (q/k/v in turn, their input grads summed):
             every block grad but the input norm's exists; the input norm's saved tensors and the
             projection input are alive, with the residual's grad, the summed and the new input grad and
             the last projection's output grad (measured: 3*b*s*h*e_m + b*s*a*d*e_m).
        input_norm: the input RMSNorm's backward, in fp32: the block's grads all exist; alive are its fp32
             input, the residual's grad (b*s*h*e_r), below fp32 the first fp32 partial grad (4 B), and four
             fp32 temporaries (16 B) of the rsqrt/mean/pow chain.
        The first block (the last one backward reaches) has freed RoPE's shared cos/sin at its last two."""
        sh = self.shape(c)
        b, s, f, h = spec.batch_size, spec.seq_len, sh.f, sh.h
        after_mlp = x.current - x.mlp_saved - x.casts_mlp + x.mlp_n * x.g + x.pending
        rope_gone = x.rope_bytes if x.first else 0
        points = {
            # fresh grads: the down projection's grad stays (the activation's backward is the top); a later
            # micro-batch adds it in place at once, so the top is the higher of two moments (below)
            "ffn": (x.current + x.bsh * w.e_r + 2 * b * s * f * w.e_m - (2 * f * h if w.amp else 0)
                    + x.down_n * x.e_p) if x.g else x.current + x.bsh * w.e_r + max(
                # the activation's backward: down_proj's saved input and (autocast) its weight copy freed,
                # its input grad and MulBackward's two grads alive
                2 * b * s * f * w.e_m - (2 * f * h if w.amp else 0),
                # down_proj's input-grad matmul: its saved input and weight copy still held, dY (under
                # autocast also its bf16 cast, b*s*h*e_m), the new weight grad before its in-place add (under
                # autocast the bf16 one, made first) and the new input grad (b*s*f*e_m)
                (x.bsh * w.e_m if w.amp else 0) + x.down_n * (w.e_m if w.amp else x.e_p) + b * s * f * w.e_m),
            "mlp_done": after_mlp + x.bsh * (w.e_r + w.e_m) + b * s * f * w.e_m + self.mlp_done_extra(c, spec, w),
            "mlp_in": after_mlp + x.bsh * (w.e_r + 2 * w.e_m) + (0 if self.fused_gate_up else x.bsh * w.e_r)
            + (2 if self.fused_gate_up else 1) * b * s * f * w.e_m
            + (4 * x.mlp_in_weight - x.mlp_in_weight * x.e_p if w.amp else 0),
            "norm": after_mlp + x.bsh * w.e_r + 16 * x.bsh,
            "attn_in": (x.block_n - x.norm_attn_n) * x.g + x.norm_attn_saved + x.attn_in_saved
            + 3 * x.bsh * w.e_m + b * s * sh.a * sh.d * w.e_m - rope_gone,
            "input_norm": x.block_n * x.g + 4 * x.bsh + x.bsh * w.e_r + (4 * x.bsh if w.e_r < 4 else 0)
            + 16 * x.bsh - rope_gone,
        }
        # RoPE's backward on q: three (b, a, s, d) grads at once (grad * cos, grad * sin, rotate_half's
        # slice_backward), in RoPE's output dtype (fp32 under autocast, where q * cos promotes), beside the
        # k and v grads and the residual's; every block grad but the input projections' and norm's exists.
        e_rope = 4 if w.amp else w.e_m
        points["rope"] = ((x.block_n - x.norm_attn_n - x.attn_in_n) * x.g + x.norm_attn_saved + x.attn_in_saved
                          + x.bsh * w.e_r
                          + 3 * b * s * sh.a * sh.d * e_rope + 2 * b * s * sh.kv * sh.d * w.e_m)
        if spec.checkpointing:
            # The block's recompute (started by its MLP's first saved-tensor unpack) at RoPE's add on q:
            # the recomputed input norm and projection inputs, the q/k/v projection outputs, q * cos,
            # rotate_half(q) * sin and their sum in RoPE's dtype, autocast's new q/k/v weight copies (and
            # the norm's fp32 output with one more bf16 b*s*h copy), the MLP output's grad; none of the
            # block's grads yet (measured on the op timeline).
            points["recompute"] = (x.norm_attn_saved + x.attn_in_saved
                                   + b * s * (sh.a + 2 * sh.kv) * sh.d * w.e_m + 3 * b * s * sh.a * sh.d * e_rope
                                   + (2 * x.attn_in_n + x.bsh * (4 + w.e_m) if w.amp else 0) + x.bsh * w.e_r
                                   # q/k norms: their saved tensors, and their outputs in RoPE's dtype
                                   # (weight * normed promotes to fp32 under autocast) instead of q and k
                                   + (sum(t.bytes for t in parts.head_rms_norms(sh, b, s, w))
                                      + b * s * (sh.a + sh.kv) * sh.d * (e_rope - w.e_m) if self.qk_norm else 0))
        if w.amp:
            points["mlp_cast"] = after_mlp + 2 * x.mlp_in_weight + x.bsh * (w.e_r + 4)
        if sh.attention == "eager" or parts.sdpa_math(sh, self.masked(c, spec), spec, w):
            # (CUDA's SDPA math kernel, parts.sdpa_math: the same softmax backward, _safe_softmax's fp32 output
            # saved, its grad from the bmm with v and _softmax_backward_data's output, b*a*s^2*4 each; measured
            # on an H200, tests/data/cuda/2026-11-27-h200 explain.jsonl.gz, llama V97 h32 a4 kv2 b2 s256 fp32)
            points["attention"] = (after_mlp - x.norm_mlp_saved
                                   # o_proj's input (a*d wide), freed by its backward; under autocast
                                   # without checkpointing an equal bf16 grad is alive in its place (measured)
                                   - (0 if w.amp and not spec.checkpointing else b * s * sh.a * sh.d * w.e_m)
                                   + x.attn_n * x.g + x.bsh * w.e_r
                                   + (8 - (w.e_m if w.e_m < 4 else 0)) * b * sh.a * s * s)
        return points

    def mlp_done_extra(self, c, spec, w) -> int:
        """Bytes a family's block holds at the end of its MLP backward beyond Llama's (0 here)."""
        return 0

    def head_point(self, c, spec, w, x) -> int:
        """The final RMSNorm's backward runs in fp32 and holds four fp32 b*s*h temporaries at once
        (measured), after the head's backward has freed its input (b*s*h*e_m) and autocast's head copy."""
        return x.saved_after_loss - x.bsh * w.e_m - x.casts_head + x.grads_last + x.bsh * w.e_m + 16 * x.bsh


def linear_op(label: str, n: int, n_in: int, n_out: int, bias: bool, w) -> tuple[str, str, int, int]:
    """A Linear's op as the selective policy sees it (planner/arch/base.py selective_ops): its (n, n_out) output
    in the matmul dtype and 2*n*n_in*n_out FLOPs."""
    return (label, "addmm" if bias else "mm", n * n_out * w.e_m, 2 * n * n_in * n_out)


def attention_op(kind: str, b: int, s: int, a: int, d: int, w, lse_len: int | None = None,
                 spec=None) -> tuple[str, str, int, int]:
    """The attention's core: SDPA's fused kernel (its output and the fp32 logsumexp, both kept by the selective
    policy; lse_len: the logsumexp's length, s unless CUDA's memory-efficient kernel pads it, parts.sdpa_lse_len)
    or eager's bmm pair (recomputed); 4*b*s^2*a*d FLOPs (QK^T and PV, the causal half not skipped).
    On CUDA (spec.device_type == "cuda") the fused kernel SDPA dispatches decides (cuda_sdpa_kernel): cuDNN's
    (bf16 / fp16), which the policy's list (planner/routines/checkpointing.py _SAVE) does not name, is recomputed
    ("sdpa-recomputed"); the memory-efficient one (fp32) is kept. (The math kernel, fp32 with enable_gqa, is a
    composite: the callers pass kind "eager" for it, parts.sdpa_math.)"""
    flops = 4 * b * s * s * a * d
    if kind == "sdpa":
        out = b * s * a * d * w.e_m + 4 * b * a * (s if lse_len is None else lse_len)
        if spec is not None and spec.device_type == "cuda" and cuda_sdpa_kernel(w, False) == "cuDNN":
            return ("sdpa cuDNN kernel (CUDA: not in the policy's list, recomputed)", "sdpa-recomputed", out, flops)
        return ("sdpa flash kernel: output + fp32 logsumexp", "sdpa", out, flops)
    return ("eager attention (bmm)", "bmm", 0, flops)


def cuda_sdpa_kernel(w, enable_gqa: bool) -> str:
    """The kernel torch.nn.functional.scaled_dot_product_attention runs on CUDA for the attention's compute
    dtype (w.e_m: the autocast dtype under AMP), measured on an H200 (torch 2.11+cu130, the grad_fn of every
    dtype / mask / dropout / GQA case: tests/data/cuda/2026-11-27-h200/sdpa-kernels.json.gz): bf16 and fp16 ->
    cuDNN attention (aten._scaled_dot_product_cudnn_attention) in every case; fp32 -> the memory-efficient kernel
    (aten._scaled_dot_product_efficient_attention), except with enable_gqa=True, which only flash (no fp32) and
    math support (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp check_grouped_query_attention): the math
    kernel, a composite (_scaled_dot_product_attention_math: matmul, _safe_softmax, matmul), so a dispatch-level
    policy sees bmm and pointwise ops. Of the three, the routine's torchtitan list saves only the efficient one."""
    if w.e_m < 4:
        return "cuDNN"
    return "math" if enable_gqa else "efficient"


def rope_buffers(n: int) -> list[TensorSpec]:
    """RotaryEmbedding's inverse frequencies and their copy (inv_freq, original_inv_freq), non-persistent
    fp32 buffers (modeling_llama.py LlamaRotaryEmbedding; the same in every RoPE family here)."""
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
        rest = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        if rest.get("rope_type", "default") != "default":
            data.setdefault("rope_scaling", rest)
        if "partial_rotary_factor" in rp:
            data.setdefault("partial_rotary_factor", rp["partial_rotary_factor"])
    return data


def check_zero(data: dict, keys: tuple[str, ...]) -> None:
    """Dropout probabilities the planner does not model yet must be 0 (as every published config here)."""
    for key in keys:
        value = data.get(key, 0.0)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        if value:
            raise ConfigError(f"{key} {value} > 0 is not modelled yet (the published configs use 0.0)")
