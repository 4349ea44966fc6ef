"""Gemma 2 (transformers' Gemma2ForCausalLM, models/gemma2/modeling_gemma2.py), from its config.json.

Gemma's block with four GemmaRMSNorms (input, post-attention, pre- and post-feedforward), attention
logits soft-capped (scores / cap, tanh, * cap: the tanh output is saved), final logits soft-capped the
same way (a saved b*s*V tanh output), sliding-window and full-attention layers alternating
(layer_types), a tied head. transformers runs it with eager attention only: Gemma2ForCausalLM refuses
SDPA (it cannot soft-cap), so "sdpa" is refused here with that reason. With eager attention a sliding
window changes the mask's values, not its size: the memory of sliding and full layers is the same.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import ConfigError
from .terms import TensorSpec, Term
from ..checkpointing import checkpointed_blocks
from .decoder import DecoderConfigMixin, RMSDecoder, check_zero, normalise_rope
from .gemma import Gemma


@dataclass(frozen=True)
class Gemma2Config(DecoderConfigMixin):
    """Keys and defaults as transformers' Gemma2Config (configuration_gemma2.py)."""
    vocab_size: int = 256000
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int | None = 4
    head_dim: int | None = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    query_pre_attn_scalar: float = 256
    sliding_window: int | None = 4096
    final_logit_softcapping: float | None = 30.0
    attn_logit_softcapping: float | None = 50.0
    pad_token_id: int | None = 0
    attention: str = "eager"
    torch_dtype: str | None = None  # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None  # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="gemma2", init=False)

    @property
    def hidden_act(self) -> str:
        return self.hidden_activation

    def __post_init__(self) -> None:
        if self.attention == "sdpa":
            raise ConfigError("transformers' Gemma2ForCausalLM does not run SDPA (it cannot soft-cap the attention "
                              "logits); use attention eager")
        self._validate()
        if self.hidden_size % self.num_attention_heads:  # Gemma2Config.validate_architecture (transformers 5.23)
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                              f"{self.num_attention_heads} (transformers' Gemma2Config refuses it)")


class Gemma2(Gemma):
    offload_finetune = True  # --offload-activations with LoRA / a trainable subset measured (decoder.py)
    arch = "gemma2"
    model_types = ("gemma2",)
    model_type = "gemma2"
    hf_attribute_map: dict = {}  # transformers 5.23 models/gemma2/configuration_gemma2.py Gemma2Config.attribute_map: none
    config_cls = Gemma2Config
    description = "transformers Gemma2ForCausalLM"
    grid_options = {"head_dim": 32, "sliding_window": 32}  # s64 and s48 run beyond the window, s8 inside it

    def recompute_replays_last(self, c) -> bool:
        return True  # post_feedforward_layernorm saves after down_proj (planner/arch/base.py)

    def presets(self) -> dict:
        # tests/data/gemma-2-2b.config.json; 2,614,341,888 parameters.
        return {"gemma-2-2b": Gemma2Config(vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                                           num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                                           head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6,
                                           rope_theta=10000.0, query_pre_attn_scalar=256, sliding_window=4096,
                                           final_logit_softcapping=30.0, attn_logit_softcapping=50.0, torch_dtype="float32")}

    def normalise(self, data: dict) -> dict:
        data = normalise_rope(data)
        if "hidden_activation" not in data and "hidden_act" in data:
            data = {**data, "hidden_activation": data["hidden_act"]}
        return data

    def from_dict(self, data: dict):
        check_zero(data, ("attention_dropout",))
        if data.get("attention") is None and data.get("_attn_implementation") in (None, "eager"):
            data = {**data, "attention": "eager"}
        return RMSDecoder.from_dict(self, data)

    def logit_softcap(self, cfg) -> float | None:
        """Gemma2ForCausalLM soft-caps its logits (logits / cap, tanh, * cap) before the loss; a fused loss applies
        the same cap per chunk (chunked-ce, as Liger's fused linear cross-entropy) or per block (cce, as
        cut-cross-entropy's linear_cross_entropy(..., softcap=cap)): planner/models/losses.py."""
        return cfg.final_logit_softcapping

    def attention_kinds(self, cfg) -> tuple[str, ...]:
        return ("eager",)

    def grid_configs(self):
        return [(label, dataclasses.replace(cfg, attention="eager"), b, s) for label, cfg, b, s in
                super().grid_configs()]

    def tiny(self, cfg):
        return dataclasses.replace(cfg, vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=8, pad_token_id=0)

    def masked(self, c, spec) -> bool:
        return True  # eager only: an additive float mask

    def inventory(self, c: Gemma2Config) -> list[TensorSpec]:
        specs = []
        for t in super().inventory(c):
            specs.append(t)
            if t.name.endswith(".post_attention_layernorm.weight"):
                # Gemma2DecoderLayer registers input, post_attention, pre_feedforward, post_feedforward
                # norms in that order; the post-attention one normalises the attention's output.
                p = t.name.rsplit(".", 2)[0]
                specs[-1] = dataclasses.replace(t, role="norm.other")
                specs += [TensorSpec(f"{p}.pre_feedforward_layernorm.weight", t.shape, "param", block=t.block,
                                     role="norm.mlp"),
                          TensorSpec(f"{p}.post_feedforward_layernorm.weight", t.shape, "param", block=t.block,
                                     role="norm.other")]
        return specs

    def outside_terms(self, c: Gemma2Config, spec, w) -> list[Term]:
        b, s = spec.batch_size, spec.seq_len
        terms = super().outside_terms(c, spec, w)
        if c.final_logit_softcapping is not None:
            terms.append(Term("final logit soft-capping tanh output", "b*s*V*e_m", b * s * c.vocab_size * w.e_m,
                              where="head"))
        if spec.checkpointing and len(set(self.layer_types(c))) > 1:
            terms.append(Term("second (sliding-window) additive mask (checkpoint input)", "b*s^2*e_r",
                              b * s * s * w.e_r, where="kept"))
        return terms

    def after_head_bytes(self, c: Gemma2Config, spec, w) -> int:
        """The final soft-capping (Gemma2ForCausalLM.forward: logits / cap, tanh, * cap) runs after lm_head: its
        saved tanh output is not made yet where the forward phase ends (the head's forward hook) (measured: the
        simulated forward phase of V1000 h64 a4 kv2 b2 s64 fp32, b*s*V*4 = 512,000 B under before, +14.1%,
        checkpointed or not)."""
        return spec.batch_size * spec.seq_len * c.vocab_size * w.e_m if c.final_logit_softcapping is not None else 0

    def offload_block_norms(self, c, spec, w, e_p) -> list[Term]:
        """--offload-activations: the four GemmaRMSNorms of a sandwich block (Gemma.offload_norm)."""
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        return [self.offload_norm(n, b, s, h, w, w.e_r, e_p) for n in
                ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm")]

    def offload_attention_extra(self, c, spec, w) -> list[Term]:
        """scores / cap, tanh, * cap: tanh saves its output (the divisions and products by Python scalars save
        wrapped numbers, which the pack hook never sees; measured)."""
        if c.attn_logit_softcapping is None:
            return []
        b, s = spec.batch_size, spec.seq_len
        return [Term("host: attention soft-capping tanh output", "b*a*s^2*e_m",
                     b * c.num_attention_heads * s * s * w.e_m, True)]

    def offload_head_extra(self, c, spec, w) -> list[Term]:
        if c.final_logit_softcapping is None:
            return []
        b, s = spec.batch_size, spec.seq_len
        return [Term("host: final logit soft-capping tanh output", "b*s*V*e_m", b * s * c.vocab_size * w.e_m,
                     where="head")]

    def block_points(self, c, spec, w, x) -> dict[str, int]:
        """Llama's points; at the attention's backward the post-attention norm (which normalises the
        attention's output, so its backward runs first) has freed its saved tensors too (x.post_attn_saved:
        fine-tuning's own set, without the fp32 normed x when the norm's weight is frozen; else the full set;
        measured: gemma2 V97 h32 b2 s256 LoRA all-linear fp16-amp accum2, 4*b*s*h under it before).
        ffn (the GELU's backward, at the gated product's backward where both b*s*f grads are made): the
        post-feedforward norm normalises the MLP's output, so its backward ran before the MLP's: its saved
        tensors are freed (x.post_mlp_saved: fine-tuning's own set; else the full set) and, in full training,
        its weight grad (h*e_p) exists. Measured on the op timeline (simulate's event log, transformers 5.23,
        torch 2.13): gemma2 V1000 h64 a4 kv2 untied L4 b2 s64 fp32 AdamW checkpointing, first block's point
        2,326,792 B above the persistent base, the estimate 98,808 B above it before (the norm's 66,304 B of
        saves, its 256 B grad, the full-attention mask below, and the loss's two 4 B 0-d tensors).
        (The full-attention mask, gone at the first block under checkpointing: first_block_released.)"""
        points = super().block_points(c, spec, w, x)
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        if x.post_mlp_saved is None:
            # post_ffn_norm (full training; fine-tuning has its own, planner/estimate/finetune.py): the
            # post-feedforward norm's backward, the block's first backward op (after its recompute under
            # checkpointing), at its rsqrt chain: beside the block's whole saved set, the output's grad (e_r),
            # the fp32 grad of the normed x (grad * (1 + weight): GemmaRMSNorm computes in fp32 at any precision)
            # and four fp32 b*s*h temporaries; the norm has already released its fp32 normed x (4*b*s*h), its
            # 1 + weight (4*h) and its rsqrt (4*b*s), and made its weight grad (h*g). The block's top when the
            # MLP is narrow beside those fp32 temporaries (below fp32, f = 4h: the ffn point's two b*s*f grads
            # are 16*b*s*h, these 20*b*s*h). Measured on the op timeline (simulate's event log, transformers
            # 5.23, torch 2.13): gemma2 V97 h32 f128 a4 kv4 and kv2 L2 b4 s64 bf16 SGD checkpointing, the peak at
            # the last block's post_feedforward_layernorm mul, 1,405,000 B above the persistent base; the ffn
            # point 57,352 B (-3.9%) below it before, this point 8 B below (the loss's two 4 B 0-d tensors,
            # which no point counts)
            points["post_ffn_norm"] = (x.current + x.bsh * w.e_r + 4 * x.bsh + 16 * x.bsh
                                       - (4 * x.bsh + 4 * b * s + 4 * h) + h * x.g)
        if "attention" in points:
            if x.post_attn_saved is None:  # full training: the norm saved its full set
                points["attention"] -= sum(t.bytes for t in self.norm_terms("post_attention_layernorm", b, s, h, w))
            else:  # fine-tuning: what it saved in this step (no fp32 normed x when its weight is frozen)
                points["attention"] -= x.post_attn_saved
        if "ffn" in points:
            if x.post_mlp_saved is None:  # full training: every weight trains, the norm saved its full set
                points["ffn"] += h * x.g - sum(t.bytes for t in self.norm_terms("post_feedforward_layernorm",
                                                                                  b, s, h, w))
                if x.g == 0:  # a later micro-batch: the down projection's backward, below (the same two grads;
                    # measured in full training under --offload-activations, where the last block's point is the
                    # backward's top: gemma2 V1000 h64 L2 b2 s32/s64/s128 fp32 AdamW checkpointing accum2,
                    # b*s*h*e_r under before at each)
                    points["ffn"] += x.bsh * w.e_r
            else:
                points["ffn"] -= x.post_mlp_saved
                if x.g == 0 and x.down_n and not spec.lora_r:
                    # a later micro-batch with down_proj's weight training: the point is the down projection's
                    # backward (Decoder.block_points), whose dY is the post-feedforward norm's input grad, a
                    # tensor apart from the block output's grad that the residual add handed on (b*s*h*e_r;
                    # in Llama they are one). Measured on the op timeline (planner.measure.events): gemma2
                    # V97 h96 a3 kv1 untied b4 s8 accum2 last:1 fp32 SGD, the peak at down_proj's input-grad
                    # matmul, 1,728,524 B, both grads alive (12,296 B under before)
                    points["ffn"] += x.bsh * w.e_r
        return points

    def offload_backward_points(self, c, spec, w, points: dict[str, int], grads_exist: bool = False) -> dict[str, int]:
        """The RMS decoder's (planner/arch/decoder.py), without checkpointing less block_points' release of the
        sandwich norms' saved sets at the attention's and the GELU's backward: with every saved tensor a host copy
        there is nothing of theirs on the device to free (measured: the backward's op timeline of Gemma 2 V97 h32
        f128 a4 kv4 b4 s64 bf16, the attention point); a later micro-batch's the same (grads_exist: a correction to
        the sweep's own points)."""
        out = super().offload_backward_points(c, spec, w, points, grads_exist)
        if spec.checkpointing:
            return out
        b, s, h = spec.batch_size, spec.seq_len, c.hidden_size
        back = {" attention": "post_attention_layernorm", " ffn": "post_feedforward_layernorm"}
        # and, in a first micro-batch, the sandwich norms' two weight grads (role norm.other), both made before the
        # softmax backward, which the generic attention point leaves out (it counts o_proj's and the pre-MLP norm's:
        # training.py _grad_numels attn_done; measured: the op timeline of Gemma 2 V97 h32 a4 kv2 b2 s256 fp32,
        # SoftmaxBackward's point 2*h*e_p = 256 B above, -264 B before)
        e_p = 2 if spec.precision == "bf16" else 4
        sandwich = 0 if grads_exist else e_p * sum(t.numel for t in self.inventory(c)
                                                    if t.kind == "param" and t.block == 0 and t.role == "norm.other")
        return {k: v + sum(t.bytes for n, label in back.items() if k.endswith(n)
                           for t in self.norm_terms(label, b, s, h, w)) + (sandwich if k.endswith(" attention") else 0)
                for k, v in out.items()}

    def offload_bound_note(self, c, spec) -> str | None:
        """--offload-activations' measured bound where Gemma 2's points still miss (estimate against the simulation:
        the off-grid sweep, bench/offload_act.py offgrid_runs, and the combinations' grid, mix_specs):
        none without checkpointing (every phase to 8 B there); with checkpointing (any policy) the forward phase is
        high by up to 2.9% (V1000 h64 a4 kv2 b2 s64 bf16-AMP selective; never the step's peak, which is the
        backward's). The backward is held to 0.1% on both (it was low by up to 3.8%, the step's peak with a narrow
        MLP below fp32: block_points' post_ffn_norm)."""
        if not spec.checkpointing:
            return super().offload_bound_note(c, spec)
        if spec.finetuning and getattr(spec, "checkpoint_policy", "full") == "selective":
            # (fine-tuning: the last block's eager attention point beside every block's cached outputs, LoRA's
            # among them; measured against the simulation, V1000 h64 a4 kv2 b2 s64 LoRA r8 all-linear bf16-AMP
            # selective +4.18%, q,v +2.96%: bench/offload_act.py finetune_mix_rows)
            return ("Gemma 2 fine-tuning with --offload-activations and selective checkpointing: the forward phase's "
                    "estimate is high by up to 4.2% (not the step's peak)")
        return ("Gemma 2 with --offload-activations and checkpointing: the forward phase's estimate is high by up to "
                "2.9% (not the step's peak), against the simulation off the measured grids")

    def selective_unconsumed(self, c, spec, w) -> int:
        """The post-feedforward norm saves down_proj's output, so the recompute replays down_proj and consumes its
        cached output (planner/arch/base.py; measured: gemma2 tiny fp32 selective under --offload-activations, the
        backward exact without it)."""
        return 0

    def mlp_done_extra(self, c, spec, w) -> int:
        """The gate projection's input grad is made while the up projection's is still held apart, its sum
        with the residual's grad not yet formed (the post-feedforward norm sits between them): one more
        b*s*h*e_m at the end of the MLP's backward (measured, GemmaRMSNorm blocks)."""
        return spec.batch_size * spec.seq_len * c.hidden_size * w.e_m

    def ft_post_norm(self, label: str, b: int, s: int, h: int, e_r: int, rg_in: bool, trains: bool, part: str,
                     where: str = "block") -> tuple[list[Term], bool]:
        """The sandwich norms (Gemma2DecoderLayer.forward: post_attention_layernorm on the attention's output,
        post_feedforward_layernorm on the MLP's, each before its residual add; inventory role norm.other)."""
        return self.ft_norm(label, b, s, h, e_r, rg_in, trains, part=part, where=where), rg_in or trains

    def first_block_released(self, c, spec, w) -> int:
        """Under checkpointing Gemma2Model hands the full-attention layers (odd indices) one additive mask and the
        sliding ones another (mask_count), each kept as a checkpoint input by the layers that take it (both
        counted kept: outside_terms, and planner/estimate/finetune.py); block 0 is a sliding layer, and by its
        backward every full-attention layer's checkpoint has run and let go of the full mask (b*s^2*e_r).
        Measured on the op timeline (simulate's event log): one mask alive at block 0's points (gemma2 V1000 h64
        L4 b2 s64 fp32 AdamW; V1000 h64 L2 b2 s32 bf16 last:1 chunked-ce, block 0's post-feedforward norm)."""
        if not spec.checkpointing or self.checkpoint_mask_count(c, spec) < 2:
            return 0  # (no checkpointed full-attention layer kept the full mask: nothing to let go)
        return spec.batch_size * spec.seq_len * spec.seq_len * w.e_r

    def checkpoint_mask_count(self, c: Gemma2Config, spec) -> int:
        """The masks kept as checkpoint inputs: a mask lives through backward only when a checkpointed layer takes it.
        every:K with K even checkpoints sliding layers only (blocks 0, K, ...: even indices, planner/checkpointing.py),
        so the full-attention mask dies with the forward (the uncheckpointed layers' eager attention saves no mask);
        measured: gemma2 V1000 h64 L4 b2 s64 LoRA r8 and last:1, every:2, fp32 and bf16-AMP, b*s^2*e_r below the
        two masks on every phase the forward reaches."""
        if not spec.checkpointing:
            return self.mask_count(c)
        types = self.layer_types(c)
        return len({types[i] for i in checkpointed_blocks(spec.checkpoint_policy, c.num_hidden_layers)})

    def ft_post_norm_released(self, blk: list[Term], b: int, s: int, h: int, g: int) -> int:
        """The post-feedforward GemmaRMSNorm's backward (fine-tuning's `post-feedforward norm` point, at its rsqrt
        chain's four fp32 b*s*h temporaries): the product with 1 + weight has run its backward and released the
        fp32 normed x (weight trains) and 1 + weight (4*h), the rsqrt's backward has released the rsqrt (4*b*s), and
        the weight's grad (h*g, g: bytes per new grad) exists when it trains. Measured on the op timeline
        (simulate's event log): gemma2 V1000 h64 a4 kv2 untied L2 b2 s32 bf16 last:1 checkpointing chunked-ce, the
        point 592,904 B above the persistent base, the family's point 16,760 B above it before (16,384 + 256 + 256
        - 128, and the loss's two 4 B 0-d tensors)."""
        saved = [t for t in blk if t.part == "norm.post_mlp"]
        normed = sum(t.bytes for t in saved if "normed x (weight trains)" in t.name)
        rg_in = any("fp32 input" in t.name for t in saved)
        return normed + (4 * h + 4 * b * s if rg_in else 0) - (h * g if normed else 0)

    def ft_attention_extra(self, c: Gemma2Config, x, b: int, s: int, e: int, q: bool, k: bool) -> list[Term]:
        """eager_attention_forward soft-caps the scores (/ cap, tanh, * cap): tanh saves its output for the
        scores' grad."""
        if c.attn_logit_softcapping is None or not (q or k):
            return []
        return [Term("attention soft-capping tanh output", "b*a*s^2*e_m", b * x.a * s * s * e, True,
                     part="attn.scores")]  # (made before the softmax: finetune.py's in-attention forward point)

    def ft_head_extra(self, c: Gemma2Config, b: int, s: int, e: int) -> list[Term]:
        """Gemma2ForCausalLM.forward: logits / cap, tanh, * cap; tanh saves its output (the logits need grad in
        every fine-tuning step: the head trains or its input needs grad; outside_terms for full training)."""
        if c.final_logit_softcapping is None:
            return []
        return [Term("final logit soft-capping tanh output", "b*s*V*e_m", b * s * c.vocab_size * e, where="head")]

    def mask_count(self, c: Gemma2Config) -> int:
        """Gemma2Model builds a full and a sliding-window mask and keeps both through its layers."""
        return len(set(self.layer_types(c)))

    def infer_norm_input_bytes(self, c: Gemma2Config, ispec, e: int, s: int) -> int:
        """The sandwich norms: post_feedforward_layernorm takes the MLP's output, alive beside the residual while the
        norm runs (b*s*h*e; Gemma's post-attention norm takes the residual itself). Measured: see
        Gemma.infer_forward_points."""
        return ispec.batch_size * s * c.hidden_size * e

    def infer_mask_count(self, c: Gemma2Config, ispec) -> int:
        """Gemma2Model.forward builds both masks whatever its layer types (causal_mask_mapping: create_causal_mask
        and create_sliding_window_causal_mask, modeling_gemma2.py) and keeps the mapping through its layers: a
        1-layer model (only a sliding layer) holds the full mask too. Measured on the live-bytes op log (issue #39's
        fuzz: gemma2 V3509 h168 a3 kv1 d32 L1 w116 b3 p137 n13 bf16 eager, the prompt's peak 112,614 B = one
        (b, 1, p, p) bf16 mask above the estimate before). With a StaticCache generate builds the masks itself
        (prepare_inputs_for_generation: create_masks_for_generate, one per layer type in config.layer_types) and
        hands the model that mapping: mask_count's (measured: gemma2 V5334 h120 a8 kv2 d16 L1 w58 b2 p264 n9 bf16
        static, one (b, 1, p, p) mask, +2.23% before)."""
        return self.mask_count(c) if ispec.cache == "static" else 2

    def infer_layer_windows(self, c: Gemma2Config) -> list:
        """The sliding layers (layer_types) get the window in generate's DynamicCache, the others none."""
        return [c.sliding_window if t == "sliding_attention" else None for t in self.layer_types(c)]

    def infer_sliding_layers(self, c: Gemma2Config) -> int:
        """The sliding-window layers (layer_types): their DynamicCache layers are DynamicSlidingWindowLayers."""
        return self.layer_types(c).count("sliding_attention") if c.sliding_window is not None else 0

    @staticmethod
    def layer_types(c: Gemma2Config) -> list[str]:
        """Gemma2Config.__post_init__: even layers slide, odd ones attend fully; Gemma2Model builds both
        masks and hands each layer its type's."""
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(c.num_hidden_layers)]


FAMILY = Gemma2()
