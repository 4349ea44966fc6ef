"""Peak memory of a fine-tuning step (issue #12): a trainable subset or LoRA on a frozen base (no torch).

A block saves what the grads it must compute need, so its saved set follows from what needs grad: the
family walks its block once (planner/arch/saved.py, RMSDecoder.saved). Outside the blocks this file walks the
embeddings, the final norm, the head and the loss.
With checkpointing, transformers' activation_checkpointing_enable (and peft) call enable_input_require_grads:
the embeddings' output needs grad, every block stashes its input, and backward recomputes every block.
Measured against transformers' models with peft 0.21 on the CPU (tests/test_finetune.py, `bench finetune`).
"""
from __future__ import annotations

from types import SimpleNamespace

from ..accounting import DTYPE_BYTES, buffer_bytes, per_config, tensor_inventory
from ..arch import family_of
from ..arch.base import resolved_loss
from ..config import ConfigError
from ..checkpointing import checkpointed_blocks, saved_ops, selective_saved, with_adapters
from ..finetune import adapted_in_block, adapted_linears, quantized_linears, trainable_names
from .activations import Term, Widths
from .categories import contest
from .record import SweepContext
from .step import Step, record as step_record
from ..losses import is_fused
from .losses import finetune_fused

ADAPTER_BYTES = 4  # peft autocast_adapter_dtype=True: adapters are fp32 on fp32, bf16 and fp16 bases


def known_gap(cfg, spec) -> str | None:
    """A combination whose peak this estimate is known to miss by more than 1% (measured), or None: none is
    known now. The last one, fine-tuning under autocast with eager attention and no checkpointing, where the
    forward's high point inside the last block's attention (the fp32 masked scores and softmax output beside
    RoPE's fp32 q and repeat_kv's copies of the fp32 K/V cache) decides the step once the b*a*s^2 tensors
    outweigh the b*s*V logits, is modelled by _forward_attention_point (measured: gemma2 V97 h32 a4 kv2 b2 s256
    last:1 bf16-amp, -1.084% before, -0.000% now), and with a fused loss (no logits) the final norm's point by
    _forward_final_norm_point (gemma2 V1000 h64 b4 s96 LoRA bf16-amp chunked-ce, -2.9% before, -0.000% now).
    (The one before it, a bf16 base, checkpointing and LoRA on the MLP projections, is modelled by
    recompute_alive / recompute_points.) Not modelled, and below the backward in every measured row: under
    checkpointing, the forward phase's in-block points with SDPA (the measured forward up to 0.84 MB above the
    estimated one on the grid's s256 rows; eager attention's is _forward_attention_point_ckpt) and on the b4 s8
    rows (up to 47 KB)."""
    return None


def check_supported(cfg, spec) -> None:
    """Fine-tuning under autocast (fp16-amp / bf16-amp, fp32 master weights) is modelled: the saved set
    (the block walk's e_m copies, planner/arch/saved.py adapter_amp), autocast's cache of trainable copies (autocast_cache_bytes), the
    GradScaler, the forward's frozen-weight copy and, under checkpointing, the recompute's end
    (_recompute_points_amp); measured by `bench finetune-amp` (docs/accuracy.md) on every family that
    fine-tunes. Still refused there: a bitsandbytes optimizer (not measured under autocast)."""
    from . import bnb_optim

    if spec.autocast_dtype is not None and bnb_optim.is_bnb(spec.optimizer):
        raise ConfigError("fine-tuning under autocast (fp16-amp / bf16-amp) with a bitsandbytes optimizer is not "
                          "modelled yet; use a torch optimizer, or --precision fp32 / bf16")


def trainable_params(cfg, spec) -> list[tuple[str, int, int]]:
    """(name, numel, bytes per element) of every trainable tensor, in model.parameters() order (peft's
    adapters come after their base layer's weight and bias)."""
    family = family_of(cfg)
    e_p = DTYPE_BYTES[spec.param_dtype]
    keep = trainable_names(family, cfg, spec)
    adapted = {lin.module: lin for lin in adapted_linears(family, cfg, spec)}
    out = []
    for t in tensor_inventory(cfg):
        if t.kind != "param":
            continue
        if keep is None or t.name in keep:
            out.append((t.name, t.numel, e_p))
        module = t.name.rsplit(".", 1)[0]
        last_of_module = module in adapted and (t.name.endswith(".bias") or not adapted[module].bias)
        if last_of_module:
            lin, r = adapted[module], spec.lora_r
            out += [(f"{module}.lora_A", r * lin.n_in, ADAPTER_BYTES), (f"{module}.lora_B", lin.n_out * r, ADAPTER_BYTES)]
    return out


def block_saved(cfg, spec, w, i: int, g: bool, trains: set, adapted: dict,
                memo: dict | None = None) -> tuple[list[Term], bool, bool]:
    """Block i's saved tensors (no checkpointing), given whether its input needs grad: the family's walk
    (planner/arch/decoder.py RMSDecoder.saved); returns them, whether its output needs grad, and whether
    RoPE's cos/sin are saved in it. memo: one estimate's walks by block signature (planner/arch/saved.py
    block_signature: blocks that walk alike are walked once)."""
    family = family_of(cfg)
    if memo is None:
        return family.saved(cfg, spec, w, i, g, trains, adapted)
    from ..arch.saved import block_signature

    key = (g, block_signature(family, cfg, i, trains, adapted))
    got = memo.get(key)
    if got is None:
        got = memo[key] = family.saved(cfg, spec, w, i, g, trains, adapted)
    return list(got[0]), got[1], got[2]


def finetune_activations(cfg, spec, w, quantized: bool = False) -> tuple[list[Term], int, list[list[Term]]]:
    """Saved tensors of the whole forward and the loss (as estimate_training's `activations`), the bytes
    saved for the loss (ce_saved), and each block's saved set as backward meets it (recomputed under
    checkpointing; empty for a block backward does not reach). quantized: QLoRA's fp32 twin (policy_ops)."""
    from ..arch import parts

    family = family_of(cfg)
    sh = family.shape(cfg)
    b, s, h, V, L = spec.batch_size, spec.seq_len, sh.h, cfg.vocab_size, cfg.layers
    e = w.e_r
    keep = trainable_names(family, cfg, spec)
    inv = [t for t in tensor_inventory(cfg) if t.kind == "param"]
    trains = {t.name for t in inv} if keep is None else keep
    adapted = {lin.module: lin for lin in adapted_linears(family, cfg, spec)}
    masked = family.masked(cfg, spec)
    terms: list[Term] = []
    per_block: list[list[Term]] = []  # what each block holds while backward runs through it ([] = not reached)
    if spec.checkpointing:
        # enable_input_require_grads: every block's input needs grad and each checkpointed block stashes it
        # (every:K: blocks 0, K, 2K, ...; planner/checkpointing.py)
        ckpt = set(checkpointed_blocks(spec.checkpoint_policy, L))
        terms.append(Term("checkpointed block inputs", "n_ckpt*b*s*h*e_r", len(ckpt) * b * s * h * e, where="ckpt"))
        terms.append(parts.rope(b, s, family.rope_dim(cfg), w))
        mask_bytes = b * s * s * w.e_r if cfg.attention == "eager" else s * s
        terms += parts.checkpoint_inputs(sh, b, s, spec, w, masked, mask_bytes)
        if family.checkpoint_mask_count(cfg, spec) > 1:
            # the full and the sliding-window masks both reach the checkpointed layers (Gemma 2;
            # planner/arch/gemma2.py outside_terms for full training)
            terms.append(Term("second (sliding-window) additive mask (checkpoint input)", "b*s^2*e_r",
                              b * s * s * w.e_r, where="kept"))
        g = True
        # backward recomputes each block with its input needing grad: this is what it saves again
        walks: dict = {}
        per_block = [block_saved(cfg, spec, w, i, True, trains, adapted, walks)[0] for i in range(L)]
        terms += policy_terms(cfg, spec, w, per_block, ckpt, quantized)
    else:
        g = any(t.name in trains for t in inv if t.role == "embed")
        rope_saved, walks = False, {}
        for i in range(L):
            blk, g_out, rope = block_saved(cfg, spec, w, i, g, trains, adapted, walks)
            terms += blk
            per_block.append(blk if g_out else [])
            g = g_out
            rope_saved = rope_saved or rope
        if rope_saved:
            terms.append(parts.rope(b, s, family.rope_dim(cfg), w))
    final_trains = any(t.name in trains for t in inv if t.role == "norm.final")
    terms += family.ft_norm("final norm", b, s, h, e, g, final_trains, where="head")
    head_trains = any(t.name in trains for t in inv if t.role == "head")
    if head_trains:
        terms.append(Term("lm_head input (head trains)", "b*s*h*e_m", b * s * h * (w.e_m if w.amp else e), where="head"))
    if w.amp and (g or final_trains):
        # autocast: the head's e_m weight copy, saved for its input's grad (tests/test_finetune_amp_facts.py)
        cached = " (trains: autocast-cached)" if head_trains else ""
        terms.append(Term(f"lm_head weight autocast copy (input needs grad){cached}", "V*h*e_m", V * h * w.e_m,
                          where="head"))
    terms += family.ft_head_extra(cfg, b, s, w.e_m)  # (Gemma 2's soft-capped logits, in the logits' dtype: e_m under autocast)
    loss_kind = resolved_loss(family, spec)
    shifted_labels = 8 * b * s if loss_kind == "labels" else 0
    ce_saved = b * s * V * w.e_ce + w.e_ce + shifted_labels
    terms.append(Term("log_softmax output + nll total_weight (+ shifted labels)", "b*s*V*e_ce + e_ce + 8*b*s",
                      ce_saved, where="loss"))
    return terms, ce_saved, per_block


def policy_ops(cfg, spec, w, quantized: bool = False) -> list | None:
    """The block's ops as torchtitan's selective policy sees them (planner/arch/<family>.py selective_ops), with
    LoRA's two adapter matmuls after each adapted Linear (planner/checkpointing.py with_adapters; the adapters'
    outputs in the autocast dtype under AMP, else in their own fp32: ADAPTER_BYTES).
    quantized (QLoRA, or its fp32 twin: planner/estimate/quantized.py): each quantized base Linear runs
    bitsandbytes' MatMul4Bit, whose forward is one custom op, torch.ops.bitsandbytes.gemm_4bit
    (bitsandbytes/autograd/_functions.py), not an aten.mm: the policy neither saves its output nor counts it
    among the mms (measured: llama and qwen3 V1000 h64 L4 b2 s64 QLoRA nf4 r8 selective, 4 * 204,800 B below the
    fp32 twin's = the twin's q, q's lora_B, v, v's lora_B, gate and down outputs less lora_A's of q and v)."""
    family = family_of(cfg)
    ops = family.selective_ops(cfg, spec, w)
    if ops is None:
        return None
    if quantized or getattr(spec, "quantize_base", "none") != "none":
        base = _quantized_block_names(cfg)
        ops = [(label, "gemm_4bit", nbytes, flops) if label in base and kind in ("mm", "addmm") else
               (label, kind, nbytes, flops) for label, kind, nbytes, flops in ops]
    adapters = dict(_first_block_adapters(cfg, bool(spec.lora_r), spec.lora_targets))
    return with_adapters(ops, adapters, spec.batch_size * spec.seq_len, spec.lora_r,
                         w.e_m if w.amp else ADAPTER_BYTES)


@per_config
def _quantized_block_names(cfg) -> frozenset:
    """policy_ops' short names of the quantized linears in the blocks, once per config."""
    return frozenset(lin.module.rsplit(".", 1)[1] for lin in quantized_linears(cfg) if lin.block is not None)


@per_config
def _first_block_adapters(cfg, lora: bool, lora_targets: str) -> dict:
    """policy_ops' adapters: the first adapted block's LoRA linears by short name, (n_in, n_out), once per config and
    targets (lora False: none, as adapted_linears without LoRA). The caller copies the dict."""
    adapted = adapted_linears(None, cfg, SimpleNamespace(lora_r=int(lora), lora_targets=lora_targets))
    first = min((lin.block for lin in adapted if lin.block is not None), default=None)
    return {lin.module.rsplit(".", 1)[1]: (lin.n_in, lin.n_out) for lin in adapted if lin.block == first}


def policy_kept(cfg, spec, w, per_block: list[list[Term]], quantized: bool = False) -> list[int]:
    """What each block keeps from its forward to its backward under checkpointing (planner/checkpointing.py):
    a checkpointed block its input (b*s*h*e_r) and, under selective, the outputs the policy saves; a block
    every:K leaves alone its whole saved set (block_saved with its input needing grad: enable_input_require_grads)."""
    L = cfg.layers
    ckpt = set(checkpointed_blocks(spec.checkpoint_policy, L))
    stash = spec.batch_size * spec.seq_len * cfg.hidden * w.e_r
    cache = selective_saved(policy_ops(cfg, spec, w, quantized)) if spec.checkpoint_policy == "selective" else 0
    extra = _uncheckpointed_extra(cfg, spec, w)
    return [stash + cache if i in ckpt else sum(t.bytes for t in per_block[i]) + extra for i in range(L)]


def _uncheckpointed_extra(cfg, spec, w) -> int:
    """What a block every:K leaves alone keeps in checkpointing mode beyond its saved set (Phi-3: v a view of the
    fused qkv output, planner/arch/phi3.py uncheckpointed_block_extra; full training adds it in ckpt_policy.py).
    Measured (the fuzz check, issue #34): phi3 V951 h32 f270 a1 L2 b3 s257 bf16 every:2 LoRA down_proj, -0.83% before
    (98,692 B = b*s*(a + kv)*d*e_m + 4)."""
    family = family_of(cfg)
    if getattr(spec, "offload_activations", False):
        return 0  # save_on_cpu copies the saved view's own elements to the host: nothing holds the rest on the device
    return family.uncheckpointed_block_extra(cfg, spec, w) if hasattr(family, "uncheckpointed_block_extra") else 0


def selective_tail(cfg, spec, w, blk: list[Term], quantized: bool = False) -> int:
    """Selective checkpointing: bytes a recomputed block holds beside its saved set, from its backward's start to
    its end. Autograd packs an op's saved inputs before it runs the op (the generated VariableType code), and torch's
    non-reentrant checkpoint stops the recompute at the last pack (torch/utils/checkpoint.py _StopRecomputationError),
    so the block's last op is never recomputed: when the policy saved its output, that cached output stays in the
    policy's storage instead of being handed to the recompute. Under fine-tuning every block's input needs grad, so
    its last matmul (down_proj, or its lora_B) always packs (the frozen weight, or its input); a block that saves
    something after it (Gemma 2's post-feedforward norm: part norm.post_mlp) runs it and keeps nothing extra.
    Measured on the op log (alive at the peak): llama V97 h64 L4 b2 s128 LoRA r8 selective, fp32 and bf16-AMP,
    down_proj's forward output (b*s*h*e_m) alive at block 3's gated-product backward."""
    if spec.checkpoint_policy != "selective" or any(t.part == "norm.post_mlp" for t in blk):
        return 0
    ops = policy_ops(cfg, spec, w, quantized)
    saved = saved_ops(ops)
    return ops[-1][2] if saved and saved[-1] is ops[-1] else 0


def policy_terms(cfg, spec, w, per_block: list[list[Term]], ckpt: set, quantized: bool = False) -> list[Term]:
    """The checkpointing policy's kept tensors beyond full checkpointing's stashed inputs (module doc): every:K's
    uncheckpointed blocks' saved sets, selective's saved op outputs (measured: llama and gemma2 tiny configs,
    LoRA r8 and last:1, every:2 and selective, fp32 and bf16-AMP: `bench checkpoint-policies`)."""
    policy = spec.checkpoint_policy
    if policy == "full":
        return []
    if policy == "selective":
        cache = selective_saved(policy_ops(cfg, spec, w, quantized))
        return [Term("selective checkpointing: the outputs the policy saves (every second mm, SDPA's)",
                     "L*(odd aten.mm outputs + SDPA output and logsumexp)", cfg.layers * cache, where="ckpt")]
    # (their names keep "autocast-cached": autocast_cache_bytes counts those copies once)
    extra = _uncheckpointed_extra(cfg, spec, w)
    return [Term(f"block {i} (not checkpointed: {policy}): {t.name}", t.formula, t.bytes, where="ckpt")
            for i, blk in enumerate(per_block) if i not in ckpt for t in blk] + [
        Term(f"block {i} (not checkpointed: {policy}): kept beside its saved set in checkpointing mode",
             "family uncheckpointed_block_extra", extra, where="ckpt")
        for i in range(len(per_block)) if i not in ckpt and extra]


def autocast_cache_bytes(cfg, spec, w, terms) -> int:
    """autocast's cache beyond what the graph saves, alive through the forward and the loss (aten
    autocast_mode.cpp cached_cast caches the copy of every fp32 leaf that requires grad until the outermost
    autocast region exits; planner/estimate/training.py autocast_weight_bytes / autocast_bias_bytes): the
    e_m copies of the trainable Linear weights and biases and the adapters, less the copies the forward's
    saved set holds already (named "autocast-cached" there; under checkpointing the blocks save nothing in
    the forward, so every block's trainable copies are only cached)."""
    if not w.amp:
        return 0
    family = family_of(cfg)
    keep = trainable_names(family, cfg, spec)
    inv = [t for t in tensor_inventory(cfg) if t.kind == "param" and t.autocast and (keep is None or t.name in keep)]
    total = sum(t.numel for t in inv) * w.e_m
    total += sum(spec.lora_r * (lin.n_in + lin.n_out) for lin in adapted_linears(family, cfg, spec)) * w.e_m
    saved = sum(t.bytes for t in terms if "autocast-cached" in t.name)
    return max(0, total - saved)


def _head_cache_bytes(cfg, spec, w, terms) -> int:
    """The part of autocast_cache_bytes that is a trainable output head's e_m copy, unless a saved term holds
    that copy instead (the head's "lm_head weight autocast copy" when its input needs grad, or cce's saved
    classifier copy, planner/estimate/losses.py finetune_fused)."""
    if not w.amp or any(t.name.startswith("lm_head weight autocast copy")
                        or (t.where == "loss" and "autocast-cached" in t.name) for t in terms):
        return 0
    family = family_of(cfg)
    keep = trainable_names(family, cfg, spec)
    return sum(t.numel for t in tensor_inventory(cfg) if t.kind == "param" and t.role == "head" and t.autocast
               and (keep is None or t.name in keep)) * w.e_m


def forward_only_bytes(cfg, spec, w, terms) -> int:
    """transformers' DynamicCache K/V copies (use_cache; off under checkpointing): extra unless attention
    saves those very tensors (planner/arch/parts.py forward_only) — and a frozen block's attention saves
    nothing, so there they are extra too."""
    from ..arch import parts

    family = family_of(cfg)
    sh = family.shape(cfg)
    if spec.checkpointing:
        return 0
    b, s, L = spec.batch_size, spec.seq_len, cfg.layers
    masked = family.masked(cfg, spec)
    # (CUDA's SDPA math kernel saves repeat_interleave's copies, not the cache's K/V: parts.sdpa_math)
    as_is = (sh.kv == sh.a or (sh.attention == "sdpa" and parts.sdpa_enable_gqa(sh, masked))) and not parts.sdpa_math(
        sh, masked, spec, w)
    per_layer = 2 * b * sh.kv * s * sh.d * w.e_r
    if not as_is or w.amp:
        # (under autocast the cache holds RoPE's fp32 k and an fp32 v, while SDPA saves the e_m casts autocast
        # makes of its inputs: the cache's tensors are extra in every block; measured: llama V97 h32 b2 s256
        # LoRA all-linear sdpa bf16-amp, the forward and the loss 2*L*b*kv*s*d*4 above the saved set)
        return L * per_layer
    recorded = sum(1 for t in terms if t.name.startswith("SDPA q and output") or t.name.startswith("attention q, k^T"))
    return (L - recorded) * per_layer


def optimizer_terms(params: list[tuple[str, int, int]], spec) -> tuple[int, int]:
    """(state bytes, step temporaries) over the trainable tensors only (planner/estimate/training.py says
    why: Adam(W) exp_avg, exp_avg_sq and a 0-d fp32 step each; the for-loop's sqrt/divide temporaries)."""
    from . import bnb_optim

    if bnb_optim.is_bnb(spec.optimizer):  # bitsandbytes: planner/estimate/bnb_optim.py (adapters fp32: eb = 4)
        tmp, _ = bnb_optim.step_temporary_bytes(spec.optimizer, [(n, eb) for _, n, eb in params], spec.device_type)
        return bnb_optim.state_bytes(spec.optimizer, [n for _, n, _ in params]), tmp
    if spec.optimizer in ("adam", "adamw"):
        state = sum(2 * n * eb + 4 for _, n, eb in params)
        impl = spec.resolved_optimizer_impl
        if impl == "fused":
            tmp = 0
        elif impl == "foreach":
            tmp = sum(n * eb for _, n, eb in params)
        else:
            sizes = [n * eb for _, n, eb in params]
            tmp = max((2 * x + (sizes[i - 1] if i else 0) for i, x in enumerate(sizes)), default=0)
        return state, tmp
    if spec.optimizer == "sgd-momentum":
        return sum(n * eb for _, n, eb in params), 0
    return 0, 0


@per_config
def _param_where(cfg) -> dict[str, tuple]:
    """Each parameter's (block, role, is_bias) by name, once per config (_numels_by_block copies it)."""
    return {t.name: (t.block, t.role, t.is_bias) for t in tensor_inventory(cfg) if t.kind == "param"}


def _numels_by_block(cfg, spec, train: list[tuple[str, int, int]]) -> tuple[list[dict[str, int]], int]:
    """The backward sweep's parameter counts by role (planner/estimate/training.py _grad_numels' keys) of
    what trains, per block, in units of the base weights' bytes (an fp32 adapter on a bf16 base counts
    twice), and the head's (output projection and final norm)."""
    family = family_of(cfg)
    e_p = DTYPE_BYTES[spec.param_dtype]
    where = dict(_param_where(cfg))
    for lin in adapted_linears(family, cfg, spec):
        for ab in ("lora_A", "lora_B"):
            where[f"{lin.module}.{ab}"] = (lin.block, lin.role, False)
    units = [(where[n], numel * eb // e_p) for n, numel, eb in train]
    head = sum(k for (blk, role, _), k in units if role in ("head", "norm.final"))
    by_block: dict = {}  # (one pass over the units, each block's in their order)
    for (b_, role, bias), k in units:
        by_block.setdefault(b_, []).append((role, k, bias))
    out = []
    for i in range(cfg.layers):
        blk = by_block.get(i, [])
        mlp = [(r, k, bias) for r, k, bias in blk if r in ("mlp.in", "mlp.out")]
        out.append({"block": sum(k for _, k, _ in blk), "mlp": sum(k for _, k, _ in mlp),
                    "down": sum(k for r, k, _ in blk if r == "mlp.out"),
                    "mlp_weight": max((k for _, k, bias in mlp if not bias), default=0),
                    "attn_done": sum(k for r, k, _ in blk if r in ("attn.out", "norm.mlp")),
                    "norm_attn": sum(k for r, k, _ in blk if r == "norm.attn"),
                    "attn_in": sum(k for r, k, _ in blk if r == "attn.in"),
                    "mlp_in_weight": max((k for r, k, bias in blk if r == "mlp.in" and not bias), default=0)})
    return out, head


def recompute_alive(cfg, spec, w, i: int, blk: list[Term]) -> list[Term]:
    """What is alive beside the block's own (recomputed) saved set while backward recomputes block i under
    checkpointing with LoRA on its MLP (read off the op timeline, planner.measure.tracker, fp32 and bf16
    bases, lora_dropout 0 and 0.1; tensors that the block also saves count once, in its saved set):
      - the block output's grad (the residual's AddBackward hands it on as is);
      - with down_proj adapted, the recompute is started by lora_B's MmBackward unpacking lora_A's output,
        after peft's `result = result + lora_B(lora_A(dropout(x))) * scaling` (peft/tuners/lora/layer.py
        Linear.forward) has been differentiated: MulBackward's grad * scaling (fp32, the adapter's dtype)
        waits for lora_B's backward, and on a base below fp32 the add promoted result to fp32 (then
        `result.to(torch_result_dtype)`), so AddBackward also holds the grad cast back for the frozen base
        layer (b*s*h*e_m);
      - LlamaDecoderLayer.forward's `residual` (the sum after attention), unless the post-attention norm
        saved it as its fp32 input (an fp32 base: x.to(float32) is x itself);
      - the MLP's input (the norm's output, LlamaMLP.forward's `x`), unless an adapter saved x itself
        (fp32 base, lora_dropout 0)."""
    family = family_of(cfg)
    b, s, h = spec.batch_size, spec.seq_len, cfg.hidden
    bsh = b * s * h
    down = any(lin.role == "mlp.out" for lin in adapted_in_block(family, cfg, spec, i))
    terms = [Term("block output's grad", "b*s*h*e_r", bsh * w.e_r, True, "recompute")]
    if down:
        terms.append(Term("down_proj adapter: grad * scaling (fp32)", "b*s*h*4", bsh * ADAPTER_BYTES, True,
                          "recompute"))
        if w.e_m != ADAPTER_BYTES:
            terms.append(Term("down_proj: base layer's grad cast from the promoted add", "b*s*h*e_m", bsh * w.e_m,
                              True, "recompute"))
    residual_saved = w.e_r == 4 and any(t.part == "norm.mlp" and "fp32 input" in t.name for t in blk)
    if not residual_saved:
        terms.append(Term("residual after attention", "b*s*h*e_r", bsh * w.e_r, True, "recompute"))
    mlp_in_saved = any(t.where == "mlp" and t.part == "" and (t.name.endswith("LoRA input x")
                                                            or t.name.startswith("block mlp.in input"))
                       for t in blk)
    if not mlp_in_saved:
        terms.append(Term("MLP input (post-attention norm output)", "b*s*h*e_m", bsh * w.e_m, True, "recompute"))
    return terms


def recompute_points(cfg, spec, w, i: int, blk: list[Term], below: int) -> dict[str, int]:
    """Block i's high points inside its recompute (checkpointing, LoRA on its MLP): `below` is what the
    blocks before it, the grads made so far and its whole recomputed saved set (with the stash) hold;
    recompute_alive's tensors come on top. Measured on the op timeline (planner.measure.tracker):
      up adapter: at up_proj's `lora_B(...) * scaling` (the block's saved set so far: not the product's
        inputs and the down projection's tensors yet): the activation's output (if not saved), up's base
        result (b*s*f*e_m), lora_B's output and its scaled copy (fp32, b*s*f each), and with dropout below
        fp32 the fp32 copy of x the dropout reads (peft: x = self._cast_input_dtype(x, lora_A.weight.dtype));
      down adapter: at lora_A's matmul, the last saved tensor (the non-reentrant checkpoint stops the
        recompute there): the product act(gate) * up (unless lora_A saved it: fp32 base, no dropout),
        down's base result (b*s*h*e_m), and with dropout below fp32 the fp32 copy of the product."""
    family = family_of(cfg)
    if not family.dense_mlp_recompute:
        return {}
    b, s, f = spec.batch_size, spec.seq_len, cfg.intermediate_size
    bsh, bsf = b * s * cfg.hidden, b * s * f
    adapted = adapted_in_block(family, cfg, spec, i)
    if w.amp:
        return _recompute_points_amp(cfg, spec, w, i, blk, below, adapted)
    if not any(lin.role.startswith("mlp") for lin in adapted):
        return {}
    # A norm after the MLP (Gemma 2's post_feedforward_layernorm, block terms of part norm.post_mlp) saves the
    # block's last tensors: its backward runs first and its first unpack starts the recompute, which then runs
    # past down_proj up to that norm. So while the MLP is recomputed: the down adapter's grads (recompute_alive's
    # down_proj terms) do not exist yet; the norm's own saves are not remade yet; its `.type_as(x)` output cast
    # has run its backward, the block output's grad in fp32 (b*s*h*4, below an fp32 residual); and down_proj's
    # `lora_B(...) * scaling` runs to the end: lora_B's output and its scaled copy (fp32, b*s*h each). Measured
    # on the op timeline (planner.measure.events): gemma2 V97 h96 a3 kv1 untied b4 s8 LoRA r4 all-linear p0.1
    # checkpointing AdamW, the step's peak at that mul in block 0: bf16 1,069,946 B, fp32 1,548,732 B.
    post_norm_saved = sum(t.bytes for t in blk if t.part == "norm.post_mlp")
    post_norm = any(t.part == "norm.post_mlp" for t in blk)
    alive = (sum(t.bytes for t in recompute_alive(cfg, spec, w, i, blk)
                 if not (post_norm and t.name.startswith("down_proj")))
             + (bsh * 4 if post_norm and w.e_r < 4 else 0))
    cast_copy = w.e_m != ADAPTER_BYTES and spec.lora_dropout > 0
    points = {}
    if any(lin.role == "mlp.out" for lin in adapted):
        product_saved = any(t.part == "mlp.out" and t.name.endswith("LoRA input x") for t in blk)
        points[f"block {i} recompute down adapter"] = (
            below - post_norm_saved + alive + (0 if product_saved else bsf * w.e_m) + bsh * w.e_m
            + (bsf * ADAPTER_BYTES if cast_copy else 0) + (2 * bsh * ADAPTER_BYTES if post_norm else 0))
        if not post_norm:
            # right after the recompute, lora_B's backward (its input-grad matmul): the recompute stopped at
            # lora_A's output, the block's last saved tensor, and let go of down_proj's base result, the
            # product's fp32 copy and the unsaved product; alive beside the saved set and recompute_alive's
            # grads are lora_B's new weight grad (r*h*4) and the grad of lora_A's output (b*s*r*4). The top
            # when r is large beside h (measured on the op timeline, planner.measure.events: llama V97 h32 a4
            # kv2 tied b2 s256 LoRA r64 all-linear sdpa fp32 checkpointing AdamW8bit, the step's peak there,
            # 3,069,480 B; the estimate was 49,160 B under)
            points[f"block {i} down adapter backward"] = (
                below + alive + (spec.lora_r * cfg.hidden + b * s * spec.lora_r) * ADAPTER_BYTES)
    if any(lin.short == "up_proj" for lin in adapted):
        later_saved = sum(t.bytes for t in blk if t.part in ("mlp.out", "mlp.up_out", "norm.post_mlp"))
        act_saved = any(t.part == "mlp.act_out" for t in blk)
        points[f"block {i} recompute up adapter"] = (
            below - later_saved + alive + (0 if act_saved else bsf * w.e_m) + bsf * w.e_m
            + 2 * bsf * ADAPTER_BYTES + (bsh * ADAPTER_BYTES if cast_copy else 0))
    return points


def _recompute_points_amp(cfg, spec, w, i: int, blk: list[Term], below: int, adapted: list) -> dict[str, int]:
    """Block i's high point at the end of its recompute under autocast (checkpointing): torch's non-reentrant
    checkpoint stops the recompute at the block's last saved tensor, the down projection's (its weight's e_m
    copy: under checkpointing its input needs grad, and a frozen weight's copy is a fresh tensor per use).
    Beside the block's whole recomputed saved set (`below`), alive then (read off the op timeline,
    planner.measure.tracker: llama V97 h96 b4 s8 LoRA q,v bf16-amp checkpointing):
      - the block output's grad (e_r) and its e_m cast for the down projection's output (the residual add
        fp32 + e_m promoted: AddBackward casts the grad back to the e_m operand's dtype);
      - LlamaDecoderLayer.forward's `residual` (the sum after attention), unless the post-attention norm
        saved it as its fp32 input (under autocast the residual stream is fp32: x.to(float32) is x itself);
      - the MLP's input, the post-attention norm's output (e_r under autocast: the norm runs in the residual
        dtype; saved only as an adapter's or a trainable linear's e_m copy, so always alive besides);
      - the product act(gate) * up (e_m), the down projection's input, not saved by a frozen down_proj (a
        trainable one saves it: its "input autocast copy" is the product itself, already e_m)."""
    b, s, f = spec.batch_size, spec.seq_len, cfg.intermediate_size
    bsh, bsf = b * s * cfg.hidden, b * s * f
    alive = bsh * w.e_r + bsh * w.e_m  # the block output's grad and its e_m cast
    residual_saved = w.e_r == 4 and any(t.part == "norm.mlp" and "fp32 input" in t.name for t in blk)
    alive += 0 if residual_saved else bsh * w.e_r
    alive += bsh * w.e_r  # the MLP's input
    product_saved = any(t.part == "mlp.out" and "input autocast copy" in t.name for t in blk)  # down_proj trains
    if any(lin.role == "mlp.out" for lin in adapted):
        # down_proj adapted: the recompute ends at lora_B's weight copy, inside peft's Linear.forward
        # (peft/tuners/lora/layer.py): beside the saved set, the base layer's result (b*s*h*e_m), peft's
        # fp32 copy of x (`x = self._cast_input_dtype(x, lora_A.weight.dtype)`, b*s*f*4: its local until the
        # forward returns), and in the backward already, MulBackward's grad * scaling (e_m: under autocast
        # lora_B's output is e_m) waiting for lora_B's backward (measured: llama V97 h32 b2 s256 LoRA on the
        # MLP, bf16-amp, checkpointing)
        alive += 2 * bsh * w.e_m + bsf * ADAPTER_BYTES
        if spec.lora_dropout > 0:
            # with lora_dropout the recompute's high point is lora_A's matmul (its output, the last b*s*r
            # tensor saved), the dropout's fp32 output still alive as lora_A's argument, lora_B's weight copy
            # not made yet (measured: llama V97 h32 b2 s256 LoRA all-linear p0.1 bf16-amp checkpointing)
            alive += bsf * ADAPTER_BYTES - spec.lora_r * cfg.hidden * w.e_m
    points = {f"block {i} recompute end (autocast)": below + alive + (0 if product_saved else bsf * w.e_m)}
    o_adapted = [lin for lin in adapted if lin.role == "attn.out"]
    if o_adapted:
        # o_proj adapted: the recompute's high point can be inside peft's Linear.forward on o_proj (a*d wide
        # input), before the MLP's saves exist (measured on the op timeline: gemma V97 h32 a4 d32 b2 s256 LoRA
        # all-linear sdpa bf16-amp checkpointing): the saved set through o_proj; the backward's grads so far
        # (the block output's grad, its e_m cast, with down_proj adapted its grad * scaling); the decoder
        # layer's normed input (e_r) and the attention's locals query_states / key_states after RoPE (fp32
        # under autocast: q * cos promotes); peft's fp32 copy of o_proj's input, the base result (e_m), and
        # lora_B's output and its scaled copy (e_m each), or with lora_dropout, at lora_A's matmul, the
        # dropout's fp32 output with lora_B's weight copy not made yet
        sh = family_of(cfg).shape(cfg)
        last_o = max(k for k, t in enumerate(blk) if t.part == "attn.out")
        ad = b * s * sh.a * sh.d
        o_alive = (bsh * w.e_r + bsh * w.e_m + (bsh * w.e_m if any(lin.role == "mlp.out" for lin in adapted) else 0)
                   + bsh * w.e_r + ad * 4 + b * s * sh.kv * sh.d * 4
                   + ad * ADAPTER_BYTES + bsh * w.e_m
                   + (ad * ADAPTER_BYTES - spec.lora_r * cfg.hidden * w.e_m if spec.lora_dropout > 0 else 2 * bsh * w.e_m))
        points[f"block {i} recompute o_proj adapter (autocast)"] = below - sum(t.bytes for t in blk[last_o + 1:]) + o_alive
    return points


def _sweep(cfg, spec, w, terms: list[Term], per_block: list[list[Term]], saved_after_loss: int,
           train, grads_exist: bool = False, quantized: bool = False) -> dict[str, int]:
    """The backward's high points, block by block from the last (planner/estimate/training.py
    _backward_sweep, here per block: a fine-tuning step's blocks differ): the family's in-block points
    (planner/arch/<family>.py block_points) on the block's own saved set and trainable counts, above what
    the blocks before it still hold and the grads made so far; and the point before the blocks.
    grads_exist: a later micro-batch of gradient accumulation (planner/estimate/training.py _backward_sweep
    says the same for full training): every trainable .grad already exists (the caller counts them all),
    and torch's AccumulateGrad adds each new grad into it in place, so the sweep makes no grads of its own;
    the new grad of one MLP weight (or adapter) is the transient at the MLP's points."""
    family = family_of(cfg)
    e_p = DTYPE_BYTES[spec.param_dtype]
    b, s, L, h = spec.batch_size, spec.seq_len, cfg.layers, cfg.hidden
    bsh = b * s * h
    numels, head_n = _numels_by_block(cfg, spec, train)
    out = [t for t in terms if not t.per_layer and t.where != "loss"]
    embed_bytes = sum(t.bytes for t in out if t.where in ("embed", "kept"))
    saved_blocks = [sum(t.bytes for t in blk) for blk in per_block]
    below = [0]  # below[i]: sum(saved_blocks[:i])
    for v in saved_blocks:
        below.append(below[-1] + v)
    stash = family.stash_extra(cfg, spec, w) if spec.checkpointing else 0
    points = {}
    grads = 0 if grads_exist else head_n * e_p
    first_reached = min((i for i, blk in enumerate(per_block) if blk), default=L)
    if spec.checkpointing:
        kept = policy_kept(cfg, spec, w, per_block, quantized)  # full: b*s*h*e_r a block
        kept_below = [0]  # kept_below[i]: sum(kept[:i])
        for v in kept:
            kept_below.append(kept_below[-1] + v)
        ckpt = set(checkpointed_blocks(spec.checkpoint_policy, L))
    for i in range(L - 1, first_reached - 1, -1):
        blk, n = per_block[i], numels[i]
        recomputed = spec.checkpointing and i in ckpt  # (every:K: the others run backward on their saved set)
        if spec.checkpointing:
            # the blocks below hold what they keep (a selective block's cached outputs are the recompute's own
            # tensors while it runs: not counted twice)
            others = embed_bytes + kept_below[i]
            others -= family.first_block_released(cfg, spec, w) if i == 0 else 0  # (Gemma 2's full mask)
        else:
            others = embed_bytes + below[i]
        ctx = SweepContext(b=b, s=s, h=h, L=L, bsh=bsh, e_p=e_p, g=0 if grads_exist else e_p,
                           pending=n["mlp_weight"] * e_p if grads_exist else 0,
                           current=saved_blocks[i] + (stash + selective_tail(cfg, spec, w, blk, quantized) if recomputed else 0),
                           mlp_saved=sum(t.bytes for t in blk if t.where == "mlp"),
                           norm_mlp_saved=sum(t.bytes for t in blk if t.part == "norm.mlp"), casts_mlp=0,
                           mlp_n=n["mlp"], down_n=n["down"], attn_n=n["attn_done"],
                           saved_after_loss=saved_after_loss, casts_head=0,
                           grads_last=0 if grads_exist else head_n * e_p,
                           block_n=n["block"], norm_attn_n=n["norm_attn"],
                           norm_attn_saved=sum(t.bytes for t in blk if t.part == "norm.attn"),
                           attn_in_saved=sum(t.bytes for t in blk if t.part == "attn.in"),
                           mlp_in_weight=n["mlp_in_weight"], attn_in_n=n["attn_in"], first=i == 0,
                           rope_bytes=sum(t.bytes for t in out if t.part == "shared"),
                           post_mlp_saved=sum(t.bytes for t in blk if t.part == "norm.post_mlp"),
                           post_attn_saved=sum(t.bytes for t in blk if t.part == "norm.post_attn"),
                           block_terms=tuple(blk))
        if recomputed:
            points.update(recompute_points(cfg, spec, w, i, blk, others + grads + ctx.current))
        input_rg = any(t.part == "norm.attn" and "fp32 input" in t.name for t in blk)
        for name, value in family.block_points(cfg, spec, w, ctx).items():
            if name == "input_norm" and not input_rg:
                continue  # the block's input needs no grad: its input norm's backward makes no input grad
            if name == "attn_in" and not input_rg:
                value = _attn_in_frozen_input(cfg, spec, w, i, blk, ctx)
            if name == "ffn":
                # the down projection's adapter middle (lora_A's b*s*r output) is freed by its backward,
                # before the activation's (the family's point counts the block's whole saved set)
                value -= sum(t.bytes for t in blk if t.part == "mlp.out" and t.name.endswith("lora_A output"))
            if name == "ffn" and w.amp and grads_exist and any(
                    t.part == "mlp.out" and "input autocast copy" in t.name for t in blk):
                # autocast, a later micro-batch, the down projection trains: at its weight grad's fp32 cast
                # (ToCopyBackward) its saved input and weight copies are freed, and in their place its bf16
                # weight grad and its input's grad (b*s*f*e_m) are alive beside the fp32 grad and the MLP
                # output's grad (measured on the op timeline: llama V97 h96 b4 s8 accum2 last:1 bf16-amp
                # checkpointing; the family's point assumes full training's casts)
                value = ctx.current + bsh * w.e_r + n["down"] * e_p
            if grads_exist and name in ("norm", "attention"):
                # a later micro-batch: the MLP weights' new grads were added in place by then, so the
                # family's pending MLP weight grad (after_mlp) is gone at the norm's and attention's backward
                # (measured on the op timeline, accum2 last:1)
                value -= ctx.pending
            if name == "attention":
                # eager attention's backward: the family's point has o_proj's input (a*d wide) freed by
                # o_proj's backward; here what o_proj saved (its input, or its adapter's tensors) is
                value += (b * s * cfg.num_attention_heads * cfg.head_dim * w.e_m
                          - sum(t.bytes for t in blk if t.part == "attn.out"))
                if not input_rg:
                    # the family's point holds the residual's grad (b*s*h*e_r) for the block's input; when that
                    # input needs no grad (a frozen prefix) the residual add hands its grad to the attention's
                    # output only, and nothing holds it once o_proj's backward has run (measured on the op
                    # timeline: llama / qwen2 / qwen3 V97 h32 b2 s256 last:1 eager, fp32 and bf16-amp, the
                    # softmax backward 65,528 B = b*s*h*4 - 8 below the point before)
                    value -= bsh * w.e_r
            points[f"block {i} {name}"] = others + grads + value
        if any(t.part == "norm.post_mlp" and "fp32 input" in t.name for t in blk):
            # Gemma 2's post-feedforward norm, the block's first backward op (after the recompute under
            # checkpointing): beside the block's saved set, the output's grad (e_r), the fp32 grad of the
            # normed x (grad * (1 + weight), fp32 at any precision: GemmaRMSNorm computes in fp32), and four
            # fp32 b*s*h temporaries of the rsqrt chain (as the family's input_norm point; measured on the op
            # timeline: gemma2 V97 h96 b4 s8 LoRA q,v bf16 checkpointing; V1000 h64 L2 b2 s32 last:1 fp32 and
            # V97 h96 L2 b4 s96 LoRA bf16-AMP chunked-ce, where the fp32 grad was missing: -4*b*s*h)
            points[f"block {i} post-feedforward norm"] = (others + grads + ctx.current + bsh * w.e_r
                                                          + 4 * bsh + 16 * bsh
                                                          - family.ft_post_norm_released(blk, b, s, h, ctx.g))
        if any(t.part in ("mlp.act_out", "mlp.up_out") for t in blk):
            # the gated product's backward: its output grad and both input grads (b*s*f each) beside the
            # block's saved set less what the down projection saved (freed by its backward, which has
            # made its grads), and the residual's grad (measured on the op timeline)
            down_saved = sum(t.bytes for t in blk if t.part in ("mlp.out", "norm.post_mlp"))  # (and Gemma 2's post-feedforward norm's)
            points[f"block {i} gated product backward"] = (others + grads + ctx.current - down_saved + n["down"] * ctx.g
                                                           + bsh * w.e_r + 3 * b * s * family.gated_mlp_width(cfg) * w.e_m)
        grads += 0 if grads_exist else n["block"] * e_p
        if i == L - 1:
            # the family's point frees the output head's saved input at the head's backward: a frozen head
            # saved none. Below fp32 the final norm's output grad (from the head, in e_r) is alive beside
            # its fp32 copy through the norm's backward (measured on fine-tuning steps' op timelines).
            head_input = sum(t.bytes for t in out if t.where == "head" and t.name.startswith("lm_head input"))
            # (Gemma 2's final soft-capping tanh output is freed by its own backward before the head's)
            softcap = sum(t.bytes for t in out if t.name.startswith("final logit soft-capping"))
            softcap += family.ft_final_norm_released(out, h)  # (GemmaRMSNorm's saves, freed by then)
            points["final norm"] = (family.head_point(cfg, spec, w, ctx) + bsh * w.e_m - head_input - softcap
                                    + (bsh * w.e_r if w.e_r < 4 else 0))
    return points


def _attn_in_frozen_input(cfg, spec, w, i: int, blk: list[Term], ctx) -> int:
    """The family's attn_in point (the last attention input projection's backward) in a block whose input needs no
    grad (the first block backward reaches past a frozen prefix: its input norm's input is a frozen block's output or
    the frozen embeddings'). No input grad is made there, so none of the family's point's b*s*h grads (the
    residual's, the summed and the new input grad) exist; backward meets the first projection of the forward
    (q_proj) last, when the others' saved tensors are freed. Alive beside the block's grads (all but the input
    norm's): the input norm's saves (a trainable weight's normed x), what the first projection saved (its input,
    or its adapter's lora_A input), and the grad its weight-grad matmul reads: the adapter's lora_A output grad
    (b*s*r*4, fp32), or the projection's output grad (b*s*out*e_m). Measured on the op timeline (CPU and an H200
    alike, tests/data/cuda/2026-11-27-h200): llama V97 h96 a3 kv1 b4 s8 LoRA r64 all-linear sdpa bf16 AdamW8bit,
    the backward's peak at block 0's q_proj lora_A weight grad, 2,681,160 B (the family's point gave 65,528 B
    more: 3*b*s*h*e_m + b*s*a*d*e_m, less q's lora_A output grad)."""
    family = family_of(cfg)
    b, s = spec.batch_size, spec.seq_len
    projs = [lin for lin in adapted_in_block(family, cfg, spec, i) if lin.role == "attn.in"]
    others = tuple(f"{lin.short} " for lin in projs[1:])
    first_saved = sum(t.bytes for t in blk if t.part == "attn.in" and not t.name.startswith(others)
                      and not t.name.endswith("lora_A output"))
    if projs:
        grad = b * s * spec.lora_r * ADAPTER_BYTES
    else:  # a trainable projection: its output grad (the first attn.in linear of the inventory)
        from ..finetune import linears

        first = next((lin for lin in linears(tensor_inventory(cfg)) if lin.block == i and lin.role == "attn.in"), None)
        grad = b * s * first.n_out * w.e_m if first else 0
    return ((ctx.block_n - ctx.norm_attn_n) * ctx.g + ctx.norm_attn_saved + first_saved + grad
            - (ctx.rope_bytes if ctx.first else 0))


def _forward_mlp_point(cfg, spec, w, terms: list[Term], per_block: list[list[Term]], a_before_loss: int,
                       fwd: int) -> int:
    """The forward's high point inside the last block's gated MLP, at the product act(gate) * up (read off
    the op timeline; it decides the forward when little is saved): everything saved so far but what the
    last MLP and the head save after it, the K/V cache, and alive without being saved: the embeddings'
    output (LlamaModel.forward keeps inputs_embeds), the block's input (its caller's variable), the
    residual after attention, the MLP's input, the activation's output, up's output and the product
    (b*s*f each), RoPE's cos/sin and the position ids. A tensor that is also saved counts once."""
    family = family_of(cfg)
    b, s, h, f = spec.batch_size, spec.seq_len, cfg.hidden, cfg.intermediate_size
    bsh, bsf = b * s * h, b * s * f
    last = per_block[-1] if per_block else []
    gated = sum(t.bytes for t in last if t.part in ("mlp.act_out", "mlp.up_out"))
    down_saved = sum(t.bytes for t in last if t.part == "mlp.out")
    later = gated + down_saved + sum(t.bytes for t in terms if t.where == "head")
    later += sum(t.bytes for t in last if t.part == "norm.post_mlp")  # Gemma 2's post-feedforward norm saves after it
    fp32_saved = lambda part: w.e_r == 4 and any(t.part == part and "fp32 input" in t.name for t in last)
    rope = 0 if any(t.part == "shared" for t in terms) else 2 * s * family.rope_dim(cfg) * w.e_r
    mask = b * s * s * w.e_r if cfg.attention == "eager" else 0
    mask *= family.mask_count(cfg)  # (Gemma 2: a full and a sliding-window mask, both alive through its layers)
    # an input an adapter saved itself (fp32 base, lora_dropout 0: lora_A saves x) is in a_before_loss already
    x_saved = lambda part: any(t.part == part and t.name.endswith("LoRA input x") for t in last)
    alive = (bsh * w.e_r  # inputs_embeds
             + (0 if fp32_saved("norm.attn") else bsh * w.e_r)  # the block's input
             + (0 if fp32_saved("norm.mlp") else bsh * w.e_r)   # the residual after attention
             + (0 if x_saved("") else bsh * w.e_r) + rope + 8 * s + mask)  # the MLP's input (the norm's output: e_r)
    if cfg.attention == "eager" and not any(t.part.startswith("attn.") and t.part not in ("attn.in", "attn.out")
                                            for t in last):
        # the decoder layer's `hidden_states, _ = self.self_attn(...)`: `_` keeps eager attention's returned
        # probabilities (softmax(fp32).to(query.dtype): fp32 under autocast, where q is RoPE's fp32) alive through
        # the MLP; counted here when the attention saved none of its own (measured on the op timeline: qwen3 V97
        # h96 b4 s8 head eager bf16-amp, fp32 rows of the fine-tuning grid: b*a*s^2*4 under before)
        sh = family.shape(cfg)
        alive += b * sh.a * s * s * (4 if w.amp else w.e_m)
    common = a_before_loss - later + fwd + alive
    product = common + 3 * bsf * w.e_m
    lora_down = any(lin.role == "mlp.out" and lin.block == cfg.layers - 1
                    for lin in adapted_linears(family, cfg, spec))
    if not lora_down:
        return product
    # peft's Linear.forward on down_proj, at `lora_B(...) * scaling`: the base result (b*s*h), the fp32
    # copy of x on a bf16 base (its local `x` until the forward returns), what the adapter saves, and
    # lora_B's output and its scaled copy (fp32, b*s*h each)
    down = (common + gated + (0 if x_saved("mlp.out") else bsf * w.e_m) + down_saved + bsh * w.e_m
            + (bsf * ADAPTER_BYTES if w.e_m != ADAPTER_BYTES and spec.lora_dropout > 0 else 0)  # p = 0: saved
            + 2 * bsh * ADAPTER_BYTES)
    if w.amp:
        # under autocast (measured on the op timeline: gemma2 V97 h96 b4 s8 LoRA all-linear p0.1 fp16-amp):
        # peft's fp32 copy of x is made whatever the dropout (x is e_m) and lora_A saves its own e_m copy, not
        # it; with lora_dropout the high point is lora_A's matmul (the dropout's fp32 output its argument,
        # lora_B's weight copy not made yet), without it lora_B's output and its scaled copy (e_m each)
        down = (common + gated + (0 if x_saved("mlp.out") else bsf * w.e_m) + down_saved + bsh * w.e_m
                + bsf * ADAPTER_BYTES
                + (bsf * ADAPTER_BYTES - spec.lora_r * h * w.e_m if spec.lora_dropout > 0 else 2 * bsh * w.e_m))
    return max(product, down)


# the last block's saves made after its attention's softmax, in forward order from the first of them
_AFTER_SOFTMAX = ("attn.probs", "attn.out", "norm.post_attn", "norm.mlp", "mlp.act_out", "mlp.up_out", "mlp.out",
                  "norm.post_mlp")


def _forward_attention_point(cfg, spec, w, terms: list[Term], per_block: list[list[Term]], a_before_loss: int,
                             fwd: int) -> int:
    """The forward's high point inside the last block's eager attention under autocast, at its softmax
    (transformers' eager_attention_forward: softmax(scores + mask, dtype=float32); read off the op timeline,
    planner.measure.tracker's event log: gemma2 / qwen2 / llama V97 h32 a4 kv2 b2 s256 last:1 and LoRA
    all-linear, bf16-amp and fp16-amp; it decides the forward, and the step, when b*a*s^2 outweighs b*s*V).
    Alive: everything saved so far but what the last block saves after the softmax (the second matmul's v and
    probabilities, o_proj onwards) and the head; the K/V cache (`fwd`: RoPE's fp32 k and an fp32 v per layer);
    and, not saved: the embeddings' output, the block's input (unless its input norm saved it as its fp32
    input), the input norm's output (fp32: under autocast the linears save their own e_m copies), RoPE's
    cos/sin (unless saved) and the position ids, the model's additive masks (mask_count * b*s^2*e_r), q after
    RoPE (fp32: q * cos promotes), repeat_kv's copies of the fp32 K and V when kv < a, and two fp32 b*a*s^2
    tensors: the masked scores (e_m scores + the e_r mask promote) and the softmax's output (counted once if
    saved). (A family's own saved scores, Gemma 2's soft-capping tanh output, are part "attn.scores": counted
    as saved before the softmax.) After the softmax the masked scores die and the second matmul's e_m cast of
    the probabilities is smaller, so this is the attention's top."""
    family = family_of(cfg)
    sh = family.shape(cfg)
    b, s, h = spec.batch_size, spec.seq_len, cfg.hidden
    bsh, ad, bas2 = b * s * h, b * s * sh.a * sh.d, b * sh.a * s * s
    last = per_block[-1] if per_block else []
    first_after = next((k for k, t in enumerate(last) if t.part in _AFTER_SOFTMAX or t.where == "mlp"), len(last))
    later = sum(t.bytes for t in last[first_after:] if t.part not in ("attn.scores", "attn.softmax"))
    later += sum(t.bytes for t in terms if t.where == "head")
    softmax_saved = sum(t.bytes for t in last if t.part == "attn.softmax")
    block_input_saved = any(t.part == "norm.attn" and "fp32 input" in t.name for t in last)  # (e_r = 4 here)
    rope = 0 if any(t.part == "shared" for t in terms) else 2 * s * family.rope_dim(cfg) * w.e_r
    e_q = max(w.e_m, w.e_r)  # q after RoPE (cos/sin are e_r) and the masked scores (the mask is e_r)
    alive = (bsh * w.e_r  # inputs_embeds
             + (0 if block_input_saved else bsh * w.e_r)  # the block's input
             + bsh * w.e_r  # the input norm's output (the attention's hidden_states)
             + rope + 8 * s + family.mask_count(cfg) * b * s * s * w.e_r
             + ad * e_q  # q after RoPE
             # repeat_kv's copies of the cache's K and V (expand + reshape: with one K/V head the reshape is a
             # view, no copy; measured: gemma2 V97 h96 a3 kv1 head bf16-amp chunked-ce)
             + (2 * ad * w.e_r if 1 < sh.kv < sh.a else 0)
             + bas2 * e_q + 4 * bas2 - softmax_saved)  # the masked scores and the softmax's fp32 output
    return a_before_loss - later + fwd + alive


def _forward_attention_point_ckpt(cfg, spec, w, terms: list[Term], a_before_loss: int) -> int:
    """The forward's high point inside the last block's eager attention under autocast with checkpointing, at
    its softmax (read off the op timeline: llama V97 h32 a4 kv2 b2 s256 LoRA all-linear bf16-amp accum2
    checkpointing, the forward 4,294,080 B above the estimate before). The checkpointed forward saves nothing:
    alive are what the checkpoints keep (the blocks' inputs, RoPE's cos/sin, the masks, the position ids), the
    input norm's output (e_r), q and k after RoPE (fp32: q * cos promotes), v (e_m: no KV cache under
    checkpointing), repeat_kv's copies of k (fp32) and v (e_m) when 1 < kv < a, the fp32 masked scores and the
    softmax's fp32 output; and autocast's cache of the trainable copies made so far: not yet those of the last
    block's o_proj and MLP (weights and adapters), which the caller's cache counts (returned less them)."""
    family = family_of(cfg)
    sh = family.shape(cfg)
    b, s, h = spec.batch_size, spec.seq_len, cfg.hidden
    ad, kvd, bas2 = b * s * sh.a * sh.d, b * s * sh.kv * sh.d, b * sh.a * s * s
    kept = a_before_loss - sum(t.bytes for t in terms if t.where == "head")
    e_q = max(w.e_m, w.e_r)
    alive = (b * s * h * w.e_r + ad * e_q + kvd * e_q + kvd * w.e_m
             + ((ad * e_q + ad * w.e_m) if 1 < sh.kv < sh.a else 0) + bas2 * e_q + 4 * bas2)
    keep = trainable_names(family, cfg, spec)
    later_roles = ("attn.out", "mlp.in", "mlp.out")
    not_yet = sum(t.numel for t in tensor_inventory(cfg) if t.kind == "param" and t.autocast
                  and t.block == cfg.layers - 1 and t.role in later_roles and (keep is None or t.name in keep))
    not_yet += sum(spec.lora_r * (lin.n_in + lin.n_out) for lin in adapted_linears(family, cfg, spec)
                   if lin.block == cfg.layers - 1 and lin.role in later_roles)
    return kept + alive - not_yet * w.e_m


def _forward_final_norm_point(cfg, spec, w, terms: list[Term], a_before_loss: int, fwd: int) -> int:
    """The forward's high point at the model's final norm under autocast, its last op (read off the op timeline:
    gemma2 V1000 h64 a4 kv2 b4 s96 LoRA q,v bf16-amp chunked-ce, where no b*s*V logits follow it): the saved
    set but what the head and the loss save after the norm, the K/V cache, and alive inside the model's forward
    beside them: the embeddings' output (inputs_embeds), the position ids, RoPE's cos/sin (unless saved), the
    model's additive masks (eager: mask_count * b*s^2*e_r), the last block's output (unless the norm saved it as
    its fp32 input), the norm's fp32 normed x (x * rsqrt; unless saved: its weight trains) and its output
    (b*s*h*e_r: under autocast the residual stream is fp32, so x.to(float32) and type_as copy nothing).
    The model's forward returns after it: the masks and inputs_embeds die, so the logits point (the head's
    output, counted by the caller) has neither."""
    family = family_of(cfg)
    b, s, h = spec.batch_size, spec.seq_len, cfg.hidden
    bsh = b * s * h
    final = [t for t in terms if t.where == "head" and t.name.startswith("final norm")]
    later = sum(t.bytes for t in terms if t.where == "head") - sum(t.bytes for t in final)
    rope = 0 if any(t.part == "shared" for t in terms) else 2 * s * family.rope_dim(cfg) * w.e_r
    mask = family.mask_count(cfg) * b * s * s * w.e_r if cfg.attention == "eager" else 0
    alive = (bsh * w.e_r + 8 * s + rope + mask  # inputs_embeds, the position ids, cos/sin, the masks
             + (0 if any("fp32 input" in t.name for t in final) else bsh * w.e_r)  # the last block's output
             + (0 if any("normed x" in t.name for t in final) else 4 * bsh)  # the normed x (fp32)
             + bsh * w.e_r)  # the norm's output
    return a_before_loss - later + fwd + alive


def persistent_bytes(cfg, spec, train) -> tuple[int, int, int, int]:
    """(weights, buffers, inputs, grads) of a fine-tuning step: the whole base in its dtype plus the adapters
    (fp32), the buffers, the int64 batch and targets, and a grad for each trainable tensor only."""
    e_p = DTYPE_BYTES[spec.param_dtype]
    base_params = sum(t.numel for t in tensor_inventory(cfg) if t.kind == "param") * e_p
    adapter_bytes = sum(n * eb for name, n, eb in train if ".lora_" in name)
    return (base_params + adapter_bytes, buffer_bytes(cfg, spec.param_dtype), 2 * 8 * spec.batch_size * spec.seq_len,
            sum(n * eb for _, n, eb in train))


def estimate_finetune(cfg, spec, quantized: bool = False):
    """A fine-tuning step (module doc); quantized: QLoRA's fp32 twin (planner/estimate/quantized.py), whose
    checkpointing policy sees the quantized base's custom ops (policy_ops)."""
    if family_of(cfg).own_finetune_step:  # a block not the decoder's (the book's GPT-2): its planner/arch file walks it
        return estimate_own_step(cfg, spec)
    check_supported(cfg, spec)
    family = family_of(cfg)
    loss_kind = resolved_loss(family, spec)
    w = Widths.of(spec, loss_upcast=family.loss_upcast(cfg, spec))
    b, s, V = spec.batch_size, spec.seq_len, cfg.vocab_size
    bsV = b * s * V
    train = trainable_params(cfg, spec)
    params, buffers, inputs, grads = persistent_bytes(cfg, spec, train)
    opt_state, opt_tmp = optimizer_terms(train, spec)
    terms, ce_saved, per_block = finetune_activations(cfg, spec, w, quantized)
    fused = None
    if is_fused(loss_kind):  # chunked-ce / cce: the head runs inside the loss (planner/estimate/losses.py)
        terms, ce_saved, fused = finetune_fused(cfg, spec, w, terms, loss_kind)
    activations = sum(t.bytes for t in terms)
    logits = bsV * w.e_m
    logits_fp32_copy = bsV * 4 if ((w.amp or loss_kind == "labels") and w.e_m < 4) else 0  # (autocast: cross_entropy is on the fp32 list)
    ce_grads = 2 * bsV * w.e_ce
    if fused is not None:  # never whole: a chunk's are in fused.loss_point / fused.backward_point
        logits = logits_fp32_copy = ce_grads = 0
    shifted_labels = 8 * b * s if loss_kind == "labels" else 0
    fwd = forward_only_bytes(cfg, spec, w, terms)
    # the loss inside the model (labels=): the causal LM's forward still holds the final norm's output
    # (hidden_states, the head's input) while its loss_function runs; counted unless the head trains and
    # saved it (measured on the op timeline: qwen3 V97 h32 b2 s256 LoRA on the MLP, bf16, peak in the loss)
    # (under autocast the head saves its e_m copy, not the hidden state itself)
    head_input_saved = not w.amp and any(t.where == "head" and t.name.startswith("lm_head input") for t in terms)
    in_model_loss = (fwd + 8 * b * (s + 1) + (0 if head_input_saved else b * s * cfg.hidden * w.e_r)
                     if loss_kind == "labels" else 0)
    scaler = 8 if spec.precision == "fp16-amp" else 0  # GradScaler's 0-d fp32 scale and int32 growth tracker (training.py)
    base = params + buffers + inputs + opt_state + scaler
    a_before_loss = activations - ce_saved
    backward_points = _sweep(cfg, spec, w, terms, per_block, a_before_loss, train, quantized=quantized)
    forward_mlp = 0 if spec.checkpointing else _forward_mlp_point(cfg, spec, w, terms, per_block, a_before_loss, fwd)
    forward_attn = 0
    # (a policy that keeps more than the last block's input, selective or every:K leaving the last block
    # uncheckpointed, has its own forward: these two points are measured with full checkpointing and none)
    last_block_input_only = spec.checkpoint_policy == "full" or (
        not spec.checkpoint_policy.startswith("selective")
        and cfg.layers - 1 in checkpointed_blocks(spec.checkpoint_policy, cfg.layers))
    if w.amp and cfg.attention == "eager" and (not spec.checkpointing or last_block_input_only):
        forward_attn = (_forward_attention_point_ckpt(cfg, spec, w, terms, a_before_loss) if spec.checkpointing
                        else _forward_attention_point(cfg, spec, w, terms, per_block, a_before_loss, fwd))
    forward_norm = (_forward_final_norm_point(cfg, spec, w, terms, a_before_loss, fwd)
                    if w.amp and not spec.checkpointing else 0)
    # under full checkpointing without autocast, the last block's forward locals (the family's point; nothing of the
    # block is saved on the device then: planner/arch/moe.py ckpt_forward_point)
    forward_ckpt = (family.ckpt_forward_point(cfg, spec, w, sum(t.bytes for t in terms if t.where in ("ckpt", "kept", "embed")))
                    if spec.checkpointing and spec.checkpoint_policy == "full" and not w.amp else 0)
    # autocast caches a trainable head's copy at the head's matmul, after the in-model points (the MLP's, the
    # attention's, the final norm's): it is not made yet there unless the head's saved copy is counted in the
    # saved set instead (measured: gemma2 V97 h96 b2 s128 head bf16-amp chunked-ce, the softmax and the MLP
    # points V*h*e_m below the cache)
    head_copy = _head_cache_bytes(cfg, spec, w, terms)
    head_mm = softcap_saved = 0
    if w.amp and loss_kind == "labels" and fused is None:
        # labels= (the loss inside the model): the forward phase ends at the output head's forward hook, so its
        # high point is the head's matmul: the final norm's output (the causal LM's hidden_states, e_r) and the
        # head's e_m cast of it (saved, and counted, when the head trains) beside the logits; what the model
        # does to the logits after the head (Gemma 2's saved soft-capping tanh output) is the loss phase's
        # (measured on the op timeline: gemma2 V2000 h48 b2 s48 LoRA q,v bf16-amp, the forward 356,336 B high
        # before; llama V1000 h64 b2 s64 LoRA fp16-amp, 49,152 B = b*s*h*(4 + 2) short)
        head_trains = any(t.where == "head" and t.name.startswith("lm_head input") for t in terms)
        softcap_saved = sum(t.bytes for t in terms if t.where == "head" and t.name.startswith("final logit soft-capping"))
        head_mm = b * s * cfg.hidden * (w.e_r + (0 if head_trains else w.e_m)) - softcap_saved
    # gradient accumulation: a later micro-batch runs its forward, loss and backward with every trainable
    # .grad of the earlier ones alive (TrainingStep.run zeroes them only after optimizer.step)
    accum = grads if spec.grad_accum > 1 else 0
    sweep = max(backward_points.values(), default=0)
    if accum:
        later = _sweep(cfg, spec, w, terms, per_block, a_before_loss, train, grads_exist=True, quantized=quantized)
        sweep = max(sweep, accum + max(later.values(), default=0))
        backward_points.update({f"later micro-batch: {k}": accum + v for k, v in later.items()})
    cache = autocast_cache_bytes(cfg, spec, w, terms)
    # autocast's fresh copy of a frozen weight lives through its matmul: the largest one is a forward
    # transient (read off the op timeline: llama V97 h96 b4 s8 head bf16-amp, the forward 48 KiB above)
    largest_cast = max((t.numel for t in tensor_inventory(cfg) if t.kind == "param" and t.autocast
                        and not t.is_bias), default=0) * w.e_m if w.amp else 0
    if per_block and any("weight autocast copy" in t.name for t in per_block[-1]):
        largest_cast = 0  # the last block's weight copies are saved (its input needs grad): in forward_mlp already
    mlp_cast = forward_mlp + largest_cast
    if largest_cast and not spec.checkpointing and not family.fused_gate_up:
        # the fresh copy lives through its own matmul, before the gated product exists: at the last block's
        # up_proj matmul the activation's output and up's output (b*s*f*e_m each), up's e_m cast of its input
        # (b*s*h*e_m) and its weight's copy (f*h*e_m) (measured on the op timeline: qwen2 V97 h96 b4 s8 head
        # sdpa fp16-amp, b*s*f*e_m - b*s*h*e_m = 10,240 B under the product point plus the largest copy)
        mlp_cast = (forward_mlp - b * s * cfg.intermediate_size * w.e_m + b * s * cfg.hidden * w.e_m
                    + cfg.intermediate_size * cfg.hidden * w.e_m)
    step = Step(  # the phases (planner/estimate/step.py), above the base
        base=base, grads=grads, optimizer_tmp=opt_tmp,
        forward=accum + cache + max(a_before_loss + logits + fwd + head_mm,
                                      max(forward_mlp, mlp_cast, forward_attn, forward_norm) - head_copy, forward_ckpt),
        loss=accum + cache + a_before_loss + logits + logits_fp32_copy + ce_saved + in_model_loss
        + (fused.loss_point if fused else 0),  # (a fused loss's chunk: planner/estimate/losses.py)
        backward=[accum + activations - shifted_labels + ce_grads + (fused.backward_point if fused else 0), grads, sweep])
    # what each phase's high point is made of (planner/estimate/categories.py), where the candidate that wins is one
    # this file splits: the end of the forward, the loss, the cross-entropy's backward, every grad; the in-block
    # points are the sweep's and the family's, whose split is approximate
    fwd_end = a_before_loss + logits + fwd + head_mm
    splits = {"loss": {"gradient": accum, "activation": activations, "exact": True}}
    if fwd_end >= max(max(forward_mlp, mlp_cast, forward_attn, forward_norm) - head_copy, forward_ckpt):
        splits["forward"] = {"gradient": accum, "activation": a_before_loss - softcap_saved,
                             "exact": not spec.checkpointing,
                             "bounds": {"activation": [0, a_before_loss - softcap_saved]}}
    if max(step.backward) == step.backward[0]:
        splits["backward"] = {"gradient": accum, "activation": activations - shifted_labels, "exact": True}
    elif max(step.backward) == grads:
        splits["backward"] = {"gradient": grads, "activation": 0, "exact": True}
    if "backward" in splits:  # a rival within the bar (categories.py contest): the measured point may be it
        splits["backward"] = contest(splits["backward"], step.backward, base, activations)
    if "forward" in splits:
        splits["forward"] = contest(splits["forward"], [fwd_end, max(forward_mlp, mlp_cast, forward_attn,
                                                                     forward_norm) - head_copy, forward_ckpt],
                                    base, a_before_loss)
    out_terms = [dict(vars(t)) for t in terms]
    out_terms.append(dict(vars(Term("transient: cross-entropy backward gradients", "2*b*s*V*e_ce", ce_grads,
                                    where="transient"))))
    if known_gap(cfg, spec):
        notes_gap = [known_gap(cfg, spec)]
    else:
        notes_gap = []
    notes = notes_gap + [f"fine-tuning: {len(train)} trainable tensors, {sum(n for _, n, _ in train):,} parameters"
             + (f" (LoRA r={spec.lora_r} on {len(adapted_linears(family, cfg, spec))} linears, fp32 adapters)"
                if spec.lora_r else f" (train_layers {spec.train_layers})")]
    est = step_record(
        step, params=params, buffers=buffers, inputs=inputs, optimizer=opt_state, activations=activations,
        transients={"logits": logits, "logits_fp32_copy": logits_fp32_copy, "cross_entropy_grads": ce_grads,
                    "optimizer_temporaries": opt_tmp, "gradscaler": scaler},
        terms=out_terms, notes=notes, backward_points=backward_points)
    est.splits = splits  # (an attribute, not a field: a record replaced by another mode drops it)
    return est


def estimate_own_step(cfg, spec):
    """A fine-tuning step of a family that walks its own block (planner/arch/<family>.py finetune_step: the
    book's GPT-2), its phases built here from the family's terms (planner/estimate/step.py): the persistent
    base (the whole base and the adapters, a grad and optimizer state per trainable tensor), the forward's
    high point (the family's), the loss (the saved set, the logits b*s*V*e_m, the loss's saved log-softmax and
    the 0-d loss), and the backward's candidates: the cross-entropy's backward (nll_loss_backward's and
    _log_softmax_backward_data's b*s*V*e_ce grads beside the saved set; op timeline), the family's in-block
    points (with the loss and its grad, 0-d each), and every grad at its end."""
    family = family_of(cfg)
    family.finetune_check(cfg, spec)
    w = Widths.of(spec)
    b, s, V = spec.batch_size, spec.seq_len, cfg.vocab_size
    bsV = b * s * V
    train = trainable_params(cfg, spec)
    params, buffers, inputs, grads = persistent_bytes(cfg, spec, train)
    opt_state, opt_tmp = optimizer_terms(train, spec)
    keep = trainable_names(family, cfg, spec)
    trains = {t.name for t in tensor_inventory(cfg) if t.kind == "param"} if keep is None else keep
    adapted = {lin.module: lin for lin in adapted_linears(family, cfg, spec)}
    own = family.finetune_step(cfg, spec, w, train, trains, adapted)
    terms, ce_saved, loss0 = own["terms"], own["ce_saved"], own["loss_bytes"]
    fused = None
    forward_points = dict(own["forward_points"])
    if is_fused(spec.loss):  # chunked-ce / cce: the head runs inside the loss (planner/estimate/losses.py)
        terms, ce_saved, fused = finetune_fused(cfg, spec, w, terms, spec.loss)
        forward_points.pop("forward logits", None)  # the head's forward never runs: no b*s*V logits
    activations = sum(t.bytes for t in terms)
    a_before_loss = activations - ce_saved
    logits = bsV * w.e_m  # the head's output, alive until the loss returns
    ce_grads = 2 * bsV * w.e_ce
    if fused is not None:  # never whole: a chunk's are in fused.loss_point / fused.backward_point
        logits = ce_grads = 0
    step = Step(base=params + buffers + inputs + opt_state, grads=grads, optimizer_tmp=opt_tmp,
                forward=max(forward_points.values()),
                loss=a_before_loss + logits + ce_saved + loss0 + (fused.loss_point if fused else 0),
                backward=[activations + ce_grads + loss0 + (fused.backward_point if fused else 0),
                          2 * loss0 + max(own["backward_points"].values(), default=0), grads])
    notes = [f"fine-tuning: {len(train)} trainable tensors, {sum(n for _, n, _ in train):,} parameters"
             + (f" (LoRA r={spec.lora_r} on {len(adapted_linears(family, cfg, spec))} linears, fp32 adapters)"
                if spec.lora_r else f" (train_layers {spec.train_layers})")]
    return step_record(
        step, params=params, buffers=buffers, inputs=inputs, optimizer=opt_state, activations=activations,
        transients={"logits": logits, "logits_fp32_copy": 0, "cross_entropy_grads": ce_grads,
                    "optimizer_temporaries": opt_tmp, "gradscaler": 0},
        terms=[dict(vars(t)) for t in terms], notes=notes, backward_points=own["backward_points"])
