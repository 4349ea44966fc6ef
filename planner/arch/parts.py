"""Saved-tensor terms of the pieces transformers' decoders share (no torch).

Each function returns the terms of one piece as transformers 5.23 runs it; the family files compose
them. Coefficients: saved-tensor inventories (torch.autograd.graph.saved_tensors_hooks, deduplicated by
storage) of transformers' models on the CPU at several shapes, every precision and attention kernel,
read together with the source file named in each docstring. Symbols as planner/estimate/activations.py;
a = query heads, kv = key/value heads, d = head dim, f = MLP width.
"""
from __future__ import annotations

from dataclasses import dataclass

from .terms import Term

# integrations/sdpa_attention.py use_gqa_in_sdpa: enable_gqa only without a mask and head_dim <= 256.
SDPA_GQA_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class Shape:
    """What the parts need of a decoder config, in one vocabulary across families."""
    h: int          # hidden size
    a: int          # query heads
    kv: int         # key/value heads
    d: int          # head dim
    f: int          # MLP width
    attention: str  # eager | sdpa
    act: str        # transformers ACT2FN name of the MLP activation


def sdpa_enable_gqa(x: Shape, masked: bool) -> bool:
    """True when transformers passes enable_gqa=True to SDPA (integrations/sdpa_attention.py): grouped
    heads, no mask tensor, head_dim <= 256; K/V are then saved un-repeated."""
    return x.kv < x.a and not masked and x.d <= SDPA_GQA_MAX_HEAD_DIM


def sdpa_math(x: Shape, masked: bool, spec, w) -> bool:
    """True when CUDA runs transformers' SDPA call on the MATH kernel: fp32 q, k, v (pure fp32; under autocast
    SDPA gets bf16/fp16 inputs and runs cuDNN attention) with enable_gqa=True (grouped heads, no mask,
    sdpa_enable_gqa). torch's CUDA kernel choice (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
    check_grouped_query_attention: of the fused kernels only flash, fp16/bf16 only, and cuDNN take enable_gqa;
    memory-efficient refuses it) leaves _scaled_dot_product_attention_math, a composite of mul, repeat_interleave,
    matmul and _safe_softmax that autograd differentiates op by op (aten/src/ATen/native/transformers/
    attention.cpp). Measured on an H200 (tests/data/cuda/2026-11-27-h200/sdpa-kernels.json.gz: fp32 with
    enable_gqa -> UnsafeViewBackward0, the math kernel's matmul; fp32 without it ->
    ScaledDotProductEfficientAttentionBackward0; bf16 / fp16 -> ScaledDotProductCudnnAttentionBackward0)."""
    return (spec.device_type == "cuda" and x.attention == "sdpa" and not w.amp and w.e_m == 4
            and sdpa_enable_gqa(x, masked))


def sdpa_efficient(x: Shape, masked: bool, spec, w) -> bool:
    """True when CUDA runs transformers' SDPA call on the memory-efficient kernel: fp32 q, k, v without
    enable_gqa (grouped heads with a mask are repeated by repeat_kv first; sdpa_math otherwise). Flash and cuDNN
    take fp16/bf16 only (sdp_utils.cpp check_tensor_dtype), so fp32 lands on _scaled_dot_product_efficient_attention
    (measured on an H200, tests/data/cuda/2026-11-27-h200/sdpa-kernels.json.gz: fp32 without GQA ->
    ScaledDotProductEfficientAttentionBackward0, with a causal mask or none)."""
    return (spec.device_type == "cuda" and x.attention == "sdpa" and not w.amp and w.e_m == 4
            and not sdpa_math(x, masked, spec, w))


# The memory-efficient kernel's logsumexp rows are padded for its backward's blocks: aten/src/ATen/native/
# transformers/cuda/attention.cu _efficient_attention_forward, logsumexp = empty({B, num_heads,
# ceil_div(max_seqlen_q, kAlignLSE) * kAlignLSE}), kAlignLSE = 32 (mem_eff_attention/kernel_forward.h)
EFFICIENT_LSE_ALIGN = 32


def sdpa_lse_len(x: Shape, masked: bool, spec, w, s: int) -> int:
    """The query length SDPA's fp32 logsumexp (b, a, len) holds: s, padded to a multiple of 32 by CUDA's
    memory-efficient kernel (EFFICIENT_LSE_ALIGN; measured on an H200, tests/data/cuda/2026-11-27-h200: the
    families grid's V2000 h48 a6 kv6 b2 s48 fp32 rows, 2*6*(64 - 48)*4 B a layer above the CPU's figure)."""
    if spec is not None and sdpa_efficient(x, masked, spec, w):
        return -(-s // EFFICIENT_LSE_ALIGN) * EFFICIENT_LSE_ALIGN
    return s


def rms_norm(label: str, b: int, s: int, h: int, w, part: str = "", where: str = "block",
             per_layer: bool = True) -> list[Term]:
    """LlamaRMSNorm (models/llama/modeling_llama.py): x.to(float32), pow(2).mean, rsqrt, x * rsqrt, then
    weight * normed.to(input dtype). Saved: the fp32 input (a copy below fp32, else the input itself)
    and the normed x in the input dtype (fp32: the product itself): (4 + e_r) per element; rsqrt 4*b*s."""
    return [Term(f"RMSNorm fp32 input and normed x ({label})", "(4 + e_r)*b*s*h", (4 + w.e_r) * b * s * h,
                 per_layer, where, part),
            Term(f"RMSNorm rsqrt ({label})", "4*b*s", 4 * b * s, per_layer, where, part)]


def gemma_rms_norm(label: str, b: int, s: int, h: int, w, part: str = "", where: str = "block",
                   per_layer: bool = True) -> list[Term]:
    """GemmaRMSNorm (models/gemma/modeling_gemma.py): x.float(), x * rsqrt(mean(x^2) + eps), times
    (1 + weight.float()), then type_as(x). All in fp32: saved are the fp32 input (a copy below fp32,
    else the input itself), the normed x (fp32), the fp32 (1 + weight) and rsqrt."""
    return [Term(f"GemmaRMSNorm fp32 input and normed x ({label})", "8*b*s*h", 8 * b * s * h, per_layer, where, part),
            Term(f"GemmaRMSNorm rsqrt and 1 + weight ({label})", "4*b*s + 4*h", 4 * b * s + 4 * h, per_layer, where,
                 part)]


def attention(x: Shape, b: int, s: int, w, masked: bool = False, spec=None) -> list[Term]:
    """Self-attention after the projections and RoPE (transformers' eager_attention_forward /
    sdpa_attention_forward):
    sdpa: the CPU flash kernel saves q, k, v, its output (laid out as the o_proj input: the transpose
      back is free) and a fp32 logsumexp; with enable_gqa K/V are the kv heads, else repeat_kv copies.
    eager: matmul saves q and the repeated k, v; softmax(dtype=float32) saves its fp32 output and, below
      fp32, matmul saves the cast probabilities; o_proj saves the transposed output copy. The additive
      mask is added, not saved.
    spec (its device): on CUDA in fp32 the memory-efficient kernel's logsumexp is padded (sdpa_lse_len)."""
    a, d = x.a, x.d
    if x.attention == "sdpa":
        kv = x.kv if (x.kv == x.a or sdpa_enable_gqa(x, masked)) else x.a
        why = "" if kv == a else (" (un-repeated: enable_gqa)" if kv < a else "")
        if kv == a and x.kv < x.a:
            why = " (repeat_kv copies: a mask or head_dim > 256 rules out enable_gqa)"
        return [Term("SDPA q and output (o_proj input)", "2*b*a*s*d*e_m", 2 * b * a * s * d * w.e_m, True),
                Term("SDPA k, v" + why, ("2*b*kv*s*d*e_m" if kv < a else "2*b*a*s*d*e_m"), 2 * b * kv * s * d * w.e_m,
                     True),
                Term("SDPA logsumexp", "4*b*a*s (fp32; CUDA fp32: s padded to a multiple of 32)",
                     4 * b * a * sdpa_lse_len(x, masked, spec, w, s), True)]
    return [Term("attention q, k^T, v (repeated to all heads), output copy", "4*b*a*s*d*e_m",
                 4 * b * a * s * d * w.e_m, True),
            Term("softmax output (fp32) and, below fp32, its cast", "b*a*s^2*(4 + (e_m if e_m < 4 else 0))",
                 b * a * s * s * (4 + (w.e_m if w.e_m < 4 else 0)), True)]


def head_rms_norms(x: Shape, b: int, s: int, w) -> list[Term]:
    """Qwen 3's q_norm and k_norm (RMSNorm over head_dim on the projections' (b, s, heads, d) outputs,
    models/qwen3/modeling_qwen3.py): each saves its fp32 input (the projection output itself in fp32,
    else a copy), the normed x in the projection output's dtype (e_m) and an fp32 rsqrt per head."""
    hd = (x.a + x.kv) * x.d
    return [Term("q_norm/k_norm fp32 input and normed x", "(4 + e_m)*b*s*(a + kv)*d", (4 + w.e_m) * b * s * hd,
                 True),
            Term("q_norm/k_norm rsqrt", "4*b*s*(a + kv)", 4 * b * s * (x.a + x.kv), True)]


def rope(b: int, s: int, rope_dim: int, w) -> Term:
    """cos and sin (1, s, rope_dim) in the residual dtype (RotaryEmbedding.forward: cos.to(x.dtype)),
    saved by RoPE's multiplications in every layer (one storage each)."""
    return Term("RoPE cos, sin (shared by all layers)", "2*s*d_rope*e_r", 2 * s * rope_dim * w.e_r, where="embed",
                part="shared")


def checkpoint_inputs(x: Shape, b: int, s: int, spec, w, masked: bool, mask_bytes: int = 0) -> list[Term]:
    """With non-reentrant checkpointing each layer's recompute closure holds its keyword inputs
    (modeling_layers.GradientCheckpointingLayer: partial(forward, **kwargs)), so these live through
    backward: position_ids (1, s) int64 and, when there is one, the (b, 1, s, s) additive float mask in
    the embeddings' dtype (masking_utils.py eager_mask), or SDPA's bool mask for a sliding window.
    Without checkpointing they die after the forward (nothing saves them)."""
    if not spec.checkpointing:
        return []
    terms = [Term("position_ids (checkpoint input)", "8*s (int64)", 8 * s, where="kept")]
    if masked:
        eager = x.attention == "eager"
        terms.append(Term("additive causal mask (checkpoint input)" if eager else "attention mask (checkpoint input)",
                          "b*s^2*e_r" if eager else "s^2 * 1 B", mask_bytes or b * s * s * w.e_r, where="kept"))
    return terms


def forward_only(x: Shape, L: int, b: int, s: int, spec, w, masked: bool) -> list[Term]:
    """Alive at the end of the forward and through transformers' loss, but not saved for backward (they
    die with the output object, before backward):
    - DynamicCache (config use_cache=True, the default; GradientCheckpointingLayer turns it off under
      checkpointing): each layer's K and V as torch.cat copies (cache_utils.py DynamicLayer.update) in
      the keys' dtype after RoPE (under autocast q*cos promotes to fp32, and the values follow: the
      layer's empty seed tensor has the keys' dtype). Attention saves these very tensors when it takes
      them as they are (MHA or SDPA's enable_gqa, no autocast); otherwise (repeat_kv copies, autocast
      casts) they are extra: 2*L*b*kv*s*d*e_r.
    - the final norm's output (BaseModelOutputWithPast.last_hidden_state): the lm_head input itself,
      unless autocast casts it for the head: then an extra b*s*h*e_r."""
    terms = []
    # (CUDA's SDPA math kernel saves repeat_interleave's copies, not the cache's K/V: sdpa_math)
    as_is = ((x.kv == x.a or (x.attention == "sdpa" and sdpa_enable_gqa(x, masked))) and not w.amp
             and not sdpa_math(x, masked, spec, w))
    if not spec.checkpointing and not as_is:
        terms.append(Term("DynamicCache K/V copies (use_cache)", "2*L*b*kv*s*d*e_r",
                          2 * L * b * x.kv * s * x.d * w.e_r, where="forward"))
    if w.amp:
        terms.append(Term("final norm output kept by the model output (autocast casts it for lm_head)",
                          "b*s*h*e_r", b * s * x.h * w.e_r, where="forward"))
    return terms


# peft autocast_adapter_dtype=True: adapters are fp32 on fp32, bf16 and fp16 bases (peft/tuners/lora/layer.py)
ADAPTER_BYTES = 4


def dropout_mask_bytes(spec, e_in: int) -> int:
    """Bytes per element that a dropout saves for its backward when its input needs grad. torch's at::dropout
    (aten/src/ATen/native/Dropout.cpp) takes the fused kernel when is_fused_kernel_acceptable (a CUDA input,
    0 < p < 1): native_dropout returns the output and a bool mask, and native_dropout_backward(grad, mask, scale)
    saves only the mask, 1 byte (derivatives.yaml). Elsewhere _dropout<false> draws `noise` in the input's
    dtype (empty_like(input).bernoulli_) and returns input * noise, which saves the noise: e_in bytes.
    Measured on an H200 (tests/data/cuda/2026-11-27-h200, explain.jsonl.gz: llama V97 h96 b4 s8 LoRA p0.1,
    lora_dropout's native_dropout holds a fp32 [4, 8, 256] output and 8,192 B beside it)."""
    return 1 if spec.device_type == "cuda" else e_in


def lora_adapter(label: str, b: int, s: int, n_in: int, spec, e_x: int, rg_in: bool, shared: set, key,
                 where: str = "block", part: str = "") -> list[Term]:
    """One LoRA adapter's saved tensors on input x (n_in wide, e_x bytes per element). `shared` holds
    the inputs already saved (at p = 0 on an fp32 base lora_A saves x itself, one storage per input).
    peft/tuners/lora/layer.py Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling, x cast to the
    adapter's dtype first: lora_A saves its input (x itself, its fp32 copy on a bf16 base, or the dropout's
    output with its fp32 noise when x needs grad) and lora_B lora_A's b*s*r output (moved here from
    planner/estimate/finetune.py and the book's GPT-2: one model of the adapter for every family)."""
    r, p = spec.lora_r, spec.lora_dropout
    terms = []
    if p > 0:
        e_k = dropout_mask_bytes(spec, ADAPTER_BYTES)  # the saved noise (fp32) or, on CUDA, bool mask
        terms.append(Term(f"{label} LoRA dropout output" + ((" and noise" if e_k == ADAPTER_BYTES else " and bool mask")
                                                            if rg_in else ""),
                          "b*s*in*4 + rg*b*s*in*e_k", b * s * n_in * (ADAPTER_BYTES + (e_k if rg_in else 0)),
                          True, where, part))
    elif e_x != ADAPTER_BYTES:
        terms.append(Term(f"{label} LoRA fp32 copy of x", "b*s*in*4", b * s * n_in * ADAPTER_BYTES, True, where, part))
    elif key not in shared:
        shared.add(key)
        terms.append(Term(f"{label} LoRA input x", "b*s*in*4", b * s * n_in * ADAPTER_BYTES, True, where, part))
    terms.append(Term(f"{label} lora_A output", "b*s*r*4", b * s * r * ADAPTER_BYTES, True, where, part))
    return terms


def offload_checkpointed_input(b: int, s: int, h: int, w) -> Term:
    """--offload-activations under checkpointing: a checkpointed block's own saves go to checkpoint's hooks
    (innermost), so its input is the one tensor save_on_cpu copies (measured, every family with offload_copies)."""
    return Term("host: checkpointed block input", "b*s*h*e_r", b * s * h * w.e_r, True)


def offload_loss_copies(b: int, s: int, V: int, w) -> Term:
    """--offload-activations: the loss's host copies: log_softmax's output saved by itself and by nll_loss (two
    copies of b*s*V*e_ce), its int64 target and the 0-d total_weight (measured, every family with offload_copies)."""
    return Term("host: log_softmax output (saved twice), target, total_weight", "2*b*s*V*e_ce + 8*b*s + e_ce",
                2 * b * s * V * w.e_ce + 8 * b * s + w.e_ce, where="loss")


def cuda_amp_tanh_gelu_backward(bsf: int, e_m: int, checkpointed: bool) -> int:
    """The Python tanh GELU's backward top under CUDA autocast (the book's GELU and transformers' NewGELUActivation:
    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))), pow on CUDA's fp32 autocast list, so the chain is
    fp32 from pow on): what is alive beside the block's saved set at MulBackward0 of (0.5 * x) * (1 + tanh), in
    place of the CPU's two e_m-wide b*s*f grads. The incoming grad is fp32 (ToCopyBackward of the next Linear's
    e_m input cast, whose saved cast its addmm/linear backward has released: - e_m), and mul_tensor_backward makes
    both products in the fp32 of the output (torch/csrc/autograd/FunctionsManual.cpp mul_tensor_backward: grad *
    other, no cast): 4 + 4 + 4. The engine then casts the grad of the e_m 0.5 * x to e_m (engine.cpp
    validate_outputs) with the incoming grad still alive; not checkpointed, the node's saved 0.5 * x and 1 + tanh
    are held until release_variables after that, so the cast (e_m) is the top; checkpointed, the recomputed saved
    tensors die with the unpacked values when the node returns, and the second product is the top. Measured on an
    H200 (tests/data/cuda/2026-11-27-h200): the book's GPT-2 V97 h96 a3 b4 s8 bf16-AMP and transformers' GPT-2 V97
    h96 a3 b4 s8 bf16-AMP (not checkpointed, 3,087,184 and 2,236,872 B), transformers' V97 h32 a4 b2 s256 SDPA
    bf16-AMP checkpointed (2,774,536 B), each to the byte on the op timeline of a CPU run with CUDA's list
    differences applied (pow and softmax in fp32, the e_m cross-entropy composite, native_dropout's bool mask)."""
    return (12 - e_m + (0 if checkpointed else e_m)) * bsf


def cuda_amp_cast_input_grad(bsf: int, e_m: int) -> int:
    """Under CUDA autocast the Python tanh GELU's output is fp32 (pow on the fp32 list: cuda_amp_tanh_gelu_backward),
    so the next Linear saves autocast's e_m cast of it, and its input grad (e_m) goes through that cast's
    ToCopyBackward to fp32. The engine runs the input cast's ToCopyBackward before the weight cast's, so at the
    weight grad's fp32 copy (the MLP output projection's "cast" point, where the CPU's e_m input grad offsets the
    freed saved input) the fp32 input grad is alive instead: (4 - e_m) per b*s*f more. Measured on an H200
    (tests/data/cuda/2026-11-27-h200): the book's GPT-2 V97 h96 a3 b4 s8 SDPA fp16-AMP accum2 (the later
    micro-batch's top, 6,065,360 B), to the byte on the op timeline of a CPU run with CUDA's list differences."""
    return (4 - e_m) * bsf
