"""Phi-3 (transformers' Phi3ForCausalLM, models/phi3/modeling_phi3.py), from its config.json.

Llama's block with fused projections: one qkv_proj (q, k and v are slices of its output) and one
gate_up_proj (gate and up are halves of its output), no biases, an untied head, a sliding window
(Phi-3-mini-4k: 2047) that needs a mask only from s >= sliding_window on (as Mistral's).
Residual dropout (resid_pdrop) and partial RoPE (partial_rotary_factor < 1) are refused: no published
Phi-3 config uses them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ConfigError
from . import parts
from .decoder import DecoderConfigMixin, RMSDecoder, check_zero, normalise_rope


@dataclass(frozen=True)
class Phi3Config(DecoderConfigMixin):
    """Keys and defaults as transformers' Phi3Config (configuration_phi3.py)."""
    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    original_max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    sliding_window: int | None = None
    pad_token_id: int | None = 32000   # nn.Embedding(padding_idx=...): transformers needs it < vocab_size
    attention: str = "sdpa"
    torch_dtype: str | None = None  # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None  # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="phi3", init=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def __post_init__(self) -> None:
        if self.num_attention_heads and self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by "
                              f"num_attention_heads {self.num_attention_heads}")
        self._validate()
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id {self.pad_token_id} must be below vocab_size {self.vocab_size} "
                              "(it is the embedding's padding_idx)")


class Phi3(RMSDecoder):
    offload_finetune = True  # --offload-activations with LoRA / a trainable subset measured (decoder.py)
    arch = "phi3"
    model_types = ("phi3",)
    model_type = "phi3"
    hf_attribute_map: dict = {}  # transformers 5.23 models/phi3/configuration_phi3.py Phi3Config.attribute_map: none
    config_cls = Phi3Config
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    description = "transformers Phi3ForCausalLM"
    q_bias = False
    o_bias = False
    fused_qkv = True
    fused_gate_up = True
    lora_default_targets = ()  # peft 0.21 maps no default LoRA targets for phi3
    # fine-tuning measured (bench finetune / finetune-amp's Phi-3 rows, tests/test_finetune.py): the block walk's
    # fused qkv_proj / gate_up_proj (planner/arch/saved.py), frozen layers and LoRA, fp32 / bf16 / under autocast.
    # QLoRA is not measured on Phi-3 (qlora_supported False)
    lora_supported = subset_supported = True
    qlora_supported = False
    # RoPE here ends in torch.cat (apply_rotary_pos_emb splits the rotary and pass-through halves), so q is a
    # contiguous (b, a, s, d) tensor and SDPA's output comes out in that layout too: the o_proj input
    # (transpose(1, 2).contiguous()) is one more copy, saved by o_proj (the block walk, planner/arch/saved.py).
    # Eager attention makes that copy in Llama as well.
    sdpa_output_is_o_input = False
    grid_options = {"pad_token_id": 0, "sliding_window": 48}  # s64 runs beyond the window, s48 at it, s8 inside

    def offload_alive(self, c, spec, w) -> tuple[int, int, int]:
        """Llama's, with the MLP point of the fused gate_up: Phi3MLP keeps `up_states = self.gate_up_proj(x)`
        (2*b*s*f*e_m) alive while it chunks it and makes act(gate) and the product, so the point holds 4*b*s*f*e_m,
        not Llama's three (measured: the forward's op timeline of Phi-3 V97 h64 f512 a4 kv2 b2 s128 fp32, 524,288
        B = b*s*f*4 above Llama's point, -10% before)."""
        cache, rope, mlp = super().offload_alive(c, spec, w)
        return cache, rope, mlp + spec.batch_size * spec.seq_len * c.intermediate_size * w.e_m

    def offload_backward_points(self, c, spec, w, points: dict[str, int], grads_exist: bool = False) -> dict[str, int]:
        """Llama's, and without checkpointing the fused gate_up's SplitBackward: its cat of the gate and up grads
        (2*b*s*f*e_m) is made while SiLU's input grad and up's grad (b*s*f*e_m each) are alive, one b*s*f*e_m above
        the product's backward (decoder.py offload_backward_points' ffn point; measured: the backward's op
        timeline of Phi-3 V97 h32 f128 a4 kv4 b4 s64 fp32, to 8 B, -12.9% before). Corrections to the sweep's own
        points, so the same in a later micro-batch (grads_exist)."""
        out = super().offload_backward_points(c, spec, w, points, grads_exist)
        if spec.checkpointing:
            # the recomputed block runs with the cache off, so SDPA saves v as a view of qkv_proj's output and
            # the whole output stays alive until SDPA's backward (uncheckpointed_block_extra: b*s*(a + kv)*d*e_m
            # more than v), at every point of the block before it (measured: the backward's op timeline of Phi-3
            # V97 h32 f128 a4 kv4 b4 s64 fp32 checkpointed, the first block's ffn point 65,544 B low before: -3.6%)
            extra = self.uncheckpointed_block_extra(c, spec, w)
            return {k: v + (extra if k.endswith((" ffn", " mlp_in", " mlp_done", " norm", " mlp_cast")) else 0)
                    for k, v in out.items()}
        bsf = spec.batch_size * spec.seq_len * c.intermediate_size
        return {**out, **{k[:-len("ffn")] + "gate_up cat": v + bsf * w.e_m for k, v in out.items()
                          if k.endswith(" ffn")}}

    def offload_forward_points(self, c, spec, w) -> dict[str, int]:
        """Llama's eager-attention point, plus two b*s*a*d*e_m more: RoPE here ends in torch.cat (rotary and
        pass-through halves), whose pieces are alive beside q (measured: Phi-3 V97 h32 a4 kv2 b2 s256 bf16, eager:
        65,536 B over Llama's point; e_m: under autocast the measured point is within +0.4% with it)."""
        points = super().offload_forward_points(c, spec, w)
        if "attention" in points:
            points["attention"] += 2 * spec.batch_size * spec.seq_len * c.num_attention_heads * c.head_dim * w.e_m
        if "sdpa" in points:  # q, k and v are views of qkv_proj's output: all of it alive at SDPA (measured: Phi-3
            # V97 h32 a4 kv2 b2 s256 fp32 and bf16-AMP, -131,072 / -65,536 B before)
            x = self.shape(c)
            points["sdpa"] += spec.batch_size * spec.seq_len * (x.a + 2 * x.kv) * x.d * w.e_m
            if spec.checkpointing:  # (the cache off: v is that output's view, not its own b*s*kv*d*e_m; measured:
                # Phi-3 V97 h48 f96 a6 kv2 b1 s512 fp32 checkpointed, +32,768 B before)
                points["sdpa"] -= spec.batch_size * spec.seq_len * x.kv * x.d * w.e_m
        return points

    def uncheckpointed_block_extra(self, c, spec, w) -> int:
        """--checkpointing every:K: an uncheckpointed block runs in checkpointing mode, where transformers turns
        the DynamicCache off, so SDPA gets v as a view of qkv_proj's output (not the cache's copy) and saving it
        keeps the whole b*s*(a + 2kv)*d*e_m storage: b*s*(a + kv)*d*e_m more than v's own bytes. Not when v is
        repeated (repeat_kv copies it: a mask with kv < a). Measured on the op log: Phi-3 h48 a6 kv6 L4 b1 s48
        bf16-AMP every:4, 9,216 B a block (the qkv mm output alive, v a view of it); phi-3-mini-4k b1 s4096 every:4,
        the former -1.66% full-size gap (50 MB a block, 24 blocks)."""
        if not spec.checkpointing or c.attention != "sdpa":
            return 0
        x = self.shape(c)
        masked = self.masked(c, spec)
        if x.kv < x.a and not parts.sdpa_enable_gqa(x, masked):
            return 0  # repeat_kv's copy of v is what SDPA saves
        if parts.sdpa_math(x, masked, spec, w):
            # CUDA's math kernel (fp32 with enable_gqa) saves repeat_interleave's copy of v, not the view
            # (aten _scaled_dot_product_attention_math: pre_process_group_query_attention_input)
            return 0
        return spec.batch_size * spec.seq_len * (x.a + x.kv) * x.d * w.e_m

    def infer_attention(self, c, ispec, e: int, s: int, kv_len: int) -> int:
        """Llama's attention tensors plus the whole fused projection output: Phi3Attention.forward
        (transformers 5.x models/phi3/modeling_phi3.py) binds `qkv = self.qkv_proj(hidden_states)` as a local
        and takes q, k and v as views of it, so the (b, s, (a + 2 kv) * d) tensor stays alive until the
        attention returns (Llama's separate v_proj output dies when the cache update rebinds value_states).
        Measured on the live-bytes op log: in prefill and in decode (s = 1), eager and SDPA, fp32 and bf16;
        it decides the peak where the attention is the prompt's high point (eager in bf16: -b*s*op*e before).
        The prompt's points count it through RMSDecoder.infer_prefill_points (`fused_qkv`), which calls
        infer_attention_at; this hook is what the decode step's point calls (s = 1)."""
        op = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        return super().infer_attention(c, ispec, e, s, kv_len) + ispec.batch_size * s * op * e

    def infer_attention_at(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> int:
        """Llama's, and with SDPA over more than one query the output's copy: apply_rotary_pos_emb here ends in
        torch.cat, so q is a contiguous (b, a, s, d) tensor, SDPA's output takes q's layout (measured, torch 2.13
        CPU: a transposed q gives a (b, s, a, d)-strided output, a contiguous q a contiguous one) and
        sdpa_attention_forward's `attn_output.transpose(1, 2).contiguous()` (integrations/sdpa_attention.py) copies
        it: q, SDPA's output and the copy are alive at once (Llama's q keeps the projection's (b, s, a, d) layout,
        so its contiguous() is a no-op: `sdpa_output_is_o_input`). One query (decode): (b, a, 1, d) transposed is
        contiguous, no copy. Measured on the live-bytes op log (issue #39: Phi-3 V6913 h256 f256 a8 kv8 L1 b1 p253
        bf16 SDPA, the prompt's peak at that contiguous, 129,536 B = b*a*s*d*e above the estimate before)."""
        out = super().infer_attention_at(c, ispec, e, s, kv_len, masked)
        if c.attention == "sdpa" and s > 1 and not self.sdpa_output_is_o_input:
            out += ispec.batch_size * c.num_attention_heads * s * c.head_dim * e
        return out

    def infer_forward_points(self, c, ispec, e: int, s: int, kv_len: int, masked: bool) -> dict[str, int]:
        """Llama's points, and with int8 weights the down projection's input quantization: Phi3MLP.forward
        (modeling_phi3.py) chunks the fused gate_up output and `gate` stays bound, so the (b, s, 2f) output
        and the product (b, s, f) are alive while bitsandbytes' MatMul8bitLt (autograd/_functions.py, 0.50)
        casts down_proj's input to fp16 (2*b*s*f) and int8_vectorwise_quant makes its int8 codes (b*s*f) and
        one fp32 scale per row (4*b*s). Measured on the live-bytes op log (phi3 h64 f128 b2 s64 bf16 SDPA:
        the prompt's peak, 16,896 B above the plain MLP point). Outlier columns (threshold 6.0) add a
        data-dependent (b*s, n_outliers) copy; none at the measured shapes. In Llama the gate and up outputs
        are gone by then, so this point stays below its MLP point there."""
        points = super().infer_forward_points(c, ispec, e, s, kv_len, masked)
        if ispec.quantize_weights == "int8":
            b, f = ispec.batch_size, c.intermediate_size
            # the MLP point holds act(gate) (b*s*f*e) instead, freed once the product exists; the rest of it
            # (context, residual, post-attention norm output, eager's mask and attention weights) is alive
            points["mlp: down_proj int8 input quantization"] = (points["mlp"] - b * s * f * e
                                                                + 2 * b * s * f + b * s * f + 4 * b * s)
        return points

    def block_points(self, c, spec, w, x) -> dict[str, int]:
        """Llama's points, but the one input projection is fused: q, k and v's grads each come back as a
        full (b, s, (a + 2 kv) * d) tensor (SliceBackward pads its slice with zeros) and are summed, so at
        qkv_proj's backward four such tensors are alive (measured), not Llama's three input grads."""
        points = super().block_points(c, spec, w, x)
        b, s = spec.batch_size, spec.seq_len
        op = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        points["attn_in"] = ((x.block_n - x.norm_attn_n) * x.g + x.norm_attn_saved + x.attn_in_saved
                             + 4 * b * s * op * w.e_m - (x.rope_bytes if x.first else 0))
        return points

    def presets(self) -> dict:
        # tests/data/Phi-3-mini-4k-instruct.config.json; 3,821,079,552 parameters.
        return {"phi-3-mini-4k": Phi3Config(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                                            num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                                            max_position_embeddings=4096, original_max_position_embeddings=4096,
                                            rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=2047,
                                            pad_token_id=32000, torch_dtype="bfloat16")}

    def normalise(self, data: dict) -> dict:
        data = normalise_rope(data)
        factor = data.get("partial_rotary_factor", 1.0)
        if factor not in (None, 1, 1.0):
            raise ConfigError(f"partial_rotary_factor {factor} is not modelled yet (Phi-3 configs use 1.0)")
        return data

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout", "resid_pdrop", "embd_pdrop"))
        return super().from_dict(data)

    def tiny(self, cfg):
        return dataclasses.replace(cfg, vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, pad_token_id=0)

    def hf_kwargs(self, cfg) -> dict:
        data = super().hf_kwargs(cfg)
        data.pop("head_dim", None)
        return data


FAMILY = Phi3()
