"""Peak memory of one steady-state training step, from the config alone (no torch, microseconds).

What is alive when (research/pytorch-memory-facts.md 1.1-1.6, re-measured with planner.measure):
  forward      weights W, inputs, optimizer state S, saved activations A growing, then the logits
  loss         + log_softmax output (+ an fp32 copy of the logits under CPU autocast)
  backward     starts inside the cross-entropy backward: A + log_softmax output + its two b*s*V
               gradients; then each block frees its saved tensors and creates its weight grads
  optimizer    W + grads G + S + the update's temporaries T_opt
The peak is the largest of these phase candidates; its phase is reported with it.
"""
from __future__ import annotations

import dataclasses
import functools

from ..accounting import DTYPE_BYTES, buffer_bytes, param_count, per_config, tensor_inventory
from ..arch import family_of
from ..arch.memo import config_key
from ..arch.base import resolved_loss
from ..config import ModelConfig
from ..spec import TrainSpec
from . import bnb_optim
from ..losses import cuda_amp_cross_entropy, is_fused
from .losses import HEAD_SAVES, fused_loss
from .activations import Term, Widths
from .record import SweepContext, TrainEstimate  # re-exported: callers import them from here
from .categories import contest, estimate_categories, sweep_split
from .step import Step, record as step_record


def optimizer_state_bytes(cfg: ModelConfig, spec: TrainSpec) -> int:
    return _optimizer_state_bytes(cfg, spec.optimizer, spec.param_dtype)


@per_config
def _optimizer_state_bytes(cfg: ModelConfig, optimizer: str, param_dtype: str) -> int:
    """Adam(W): exp_avg + exp_avg_sq in the weights' dtype, plus a 0-d fp32 `step` per parameter tensor
    (torch/optim/adam.py _init_group). SGD with momentum: one momentum_buffer. Plain SGD: nothing."""
    e_p = DTYPE_BYTES[param_dtype]
    if bnb_optim.is_bnb(optimizer):  # bitsandbytes: planner/estimate/bnb_optim.py (fp32/8-bit whatever e_p)
        return bnb_optim.state_bytes(optimizer, [t.numel for t in tensor_inventory(cfg) if t.kind == "param"])
    n_params = param_count(cfg)
    n_tensors = sum(1 for t in tensor_inventory(cfg) if t.kind == "param")
    if optimizer in ("adam", "adamw"):
        return 2 * n_params * e_p + 4 * n_tensors
    if optimizer == "sgd-momentum":
        return n_params * e_p
    return 0


def optimizer_temporary_bytes(cfg: ModelConfig, spec: TrainSpec) -> tuple[int, str]:
    if bnb_optim.is_bnb(spec.optimizer):  # bitsandbytes' kernels: planner/estimate/bnb_optim.py
        return _bnb_temporary_bytes(cfg, spec.optimizer, spec.param_dtype, spec.device_type)
    return _optimizer_temporary_bytes(cfg, spec.optimizer, spec.resolved_optimizer_impl, spec.param_dtype)


@per_config
def _optimizer_temporary_bytes(cfg: ModelConfig, optimizer: str, impl: str, param_dtype: str) -> tuple[int, str]:
    """Transient bytes inside optimizer.step() (torch 2.x source, measured on CPU):
    - Adam for-loop: `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` holds two
      temporaries the size of the parameter being updated, while the local `denom` of the previous
      parameter is still alive: max over consecutive parameters of numel[i-1] + 2*numel[i].
    - Adam foreach: `_foreach_sqrt(exp_avg_sqs)` is one extra copy of every parameter.
    - fused kernels and SGD (with or without momentum) update in place.
    """
    e_p = DTYPE_BYTES[param_dtype]
    if optimizer not in ("adam", "adamw") or impl == "fused":
        return 0, "0 (in-place update)"
    if impl == "foreach":
        return param_count(cfg) * e_p, "P*e_p (foreach sqrt copy of all params)"
    sizes = [t.numel for t in tensor_inventory(cfg) if t.kind == "param"]
    worst = max(2 * n + (sizes[i - 1] if i else 0) for i, n in enumerate(sizes))
    return worst * e_p, "max_i(numel[i-1] + 2*numel[i]) * e_p (for-loop sqrt, divide, previous denom)"


@per_config
def _bnb_temporary_bytes(cfg: ModelConfig, optimizer: str, param_dtype: str, device_type: str) -> tuple[int, str]:
    tensors = [(t.numel, DTYPE_BYTES[param_dtype]) for t in tensor_inventory(cfg) if t.kind == "param"]
    return bnb_optim.step_temporary_bytes(optimizer, tensors, device_type)


def autocast_weight_bytes(cfg: ModelConfig, spec: TrainSpec, blocks_only: bool = False) -> int:
    return _autocast_weight_bytes(cfg, spec.autocast_dtype is not None, blocks_only)


@per_config
def _autocast_weight_bytes(cfg: ModelConfig, amp: bool, blocks_only: bool) -> int:
    """Low-precision copies of the fp32 matmul weights that autocast caches and Linear saves for backward
    (aten autocast_mode.cpp cached_cast: fp32 leaf tensors that require grad). Embeddings are not cast;
    biases are cast but not saved. A tied output head casts the embedding matrix."""
    if not amp:
        return 0
    total = 0
    for t in tensor_inventory(cfg):
        if t.autocast and not t.is_bias and t.trainable and (t.block is not None or not blocks_only):
            total += t.numel
    if not blocks_only and family_of(cfg).tied(cfg):
        total += sum(t.numel for t in tensor_inventory(cfg) if t.role == "embed")
    return total * 2


def autocast_bias_bytes(cfg: ModelConfig, spec: TrainSpec) -> int:
    return _autocast_bias_bytes(cfg, spec.autocast_dtype is not None)


@per_config
def _autocast_bias_bytes(cfg: ModelConfig, amp: bool) -> int:
    """Low-precision copies of the fp32 biases that autocast casts for linear / addmm. cached_cast caches
    every fp32 leaf that requires grad, biases included, until the outermost autocast region (forward +
    loss) exits; no backward saves them (a bias's grad is a sum of the output's grad), so they are alive
    in the forward and the loss only. Measured: GPT-2 V97 h96 L2 bf16-amp, 3,456 B (2 * 1,728 bias
    elements) in both phases, checkpointed or not."""
    if not amp:
        return 0
    return 2 * sum(t.numel for t in tensor_inventory(cfg) if t.autocast and t.is_bias and t.trainable)


# CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every block is a multiple of 512 B.
CUDA_BLOCK_BYTES = 512
# cuBLAS workspaces, allocated through the caching allocator and so counted by max_memory_allocated, and kept
# for the life of the process. One per (cuBLAS handle, stream) (CublasHandlePool.cpp, map keyed by both), and
# handles are per thread: the forward's matmuls run on the Python thread, autograd's backward on the device's
# own worker thread, so a training step holds two. Each is parseChosenWorkspaceSize's default: 32 MiB on Hopper
# (sm_90), ":4096:2:16:8" = 8,519,680 B on other GPUs (then this term is an upper bound by 2 x 23.9 MiB).
# Measured on an H100 (torch 2.11, docs/gpu.md): +33,554,432 B after the first matmul, +67,125,248 B after a
# Linear's backward (two workspaces and 16 KiB more).
CUBLAS_WORKSPACE_BYTES_PER_HANDLE = 32 * 2**20
CUBLAS_WORKSPACE_BYTES = 2 * CUBLAS_WORKSPACE_BYTES_PER_HANDLE
# The CUDA context (driver, the kernels loaded, cuBLAS and cuDNN handles) is outside the allocator: measured on an
# H200 (torch 2.11.0+cu130, driver 580.159.04, docs/gpu.md) as the "non-PyTorch memory" of a training process at
# its peak (torch's OOM message: in use - allocated - reserved but unallocated = 135.41 - 118.38 - 16.29 GiB, and
# 119.34 - 118.37 - 0.23 GiB under expandable_segments): 0.74 GiB. It differs by GPU, driver and torch build
# (PyTorch PR #86509: 300-500 MB with lazy module loading before cuDNN loads). Shown as a separate line, never
# in peak_bytes.
CUDA_CONTEXT_BYTES = 758 * 2**20


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def cuda_rounding_bytes(cfg: ModelConfig, spec: TrainSpec) -> int:
    nbytes = 8 * spec.batch_size * spec.seq_len  # the two int64 index tensors
    bnb_states = (bnb_optim.cuda_rounding_bytes(spec.optimizer, [t.numel for t in tensor_inventory(cfg)
                                                                 if t.kind == "param"])
                  if bnb_optim.is_bnb(spec.optimizer) else 0)  # bitsandbytes' state tensors, rounded the same way
    return (_persistent_rounding_bytes(cfg, spec.optimizer, spec.param_dtype) + bnb_states
            + 2 * (_round_up(nbytes, CUDA_BLOCK_BYTES) - nbytes))


def _rounded(nbytes: int) -> int:
    """What the caching allocator's 512-B blocks add to one tensor of nbytes."""
    return _round_up(nbytes, CUDA_BLOCK_BYTES) - nbytes


def finetune_rounding_bytes(cfg: ModelConfig, spec: TrainSpec, train: list[tuple[str, int, int]]) -> int:
    """cuda_rounding_bytes for a fine-tuning step, whose persistent tensors differ from full training's: every
    weight and buffer of the base (a quantized linear's packed weight instead of its full one: QLoRA; its
    statistics are small tensors left out, as the activations are), and a grad and the optimizer's states only
    for `train` (planner/estimate/finetune.py trainable_params: (name, numel, bytes per element), the LoRA
    adapters included), and the two int64 index tensors."""
    extra = _base_rounding_bytes(cfg, spec.param_dtype, getattr(spec, "quantize_base", "none"),
                                 getattr(spec, "double_quant", False))
    copies = 1 + {"adam": 2, "adamw": 2, "sgd-momentum": 1}.get(spec.optimizer, 0)  # the grad and the states
    for _, n, eb in train:
        extra += copies * _rounded(n * eb)
        if spec.optimizer in ("adam", "adamw"):
            extra += CUDA_BLOCK_BYTES - 4  # the 0-d fp32 step tensor
    if bnb_optim.is_bnb(spec.optimizer):  # bitsandbytes' state tensors, rounded the same way
        extra += bnb_optim.cuda_rounding_bytes(spec.optimizer, [n for _, n, _ in train])
    nbytes = 8 * spec.batch_size * spec.seq_len  # the two int64 index tensors
    return extra + 2 * _rounded(nbytes)


@per_config
def _base_rounding_bytes(cfg: ModelConfig, param_dtype: str, quantize_base: str, double_quant: bool) -> int:
    """finetune_rounding_bytes' part over the base's weights and buffers (the spec fields it reads: the
    parameters' dtype, and bnb.quantized_linear_bytes' quantize_base and double_quant), once per config."""
    from types import SimpleNamespace

    from ..bnb import quantized_linear_bytes
    from ..finetune import quantized_linears

    e_p = DTYPE_BYTES[param_dtype]
    qspec = SimpleNamespace(quantize_base=quantize_base, double_quant=double_quant)
    quantized = {f"{lin.module}.weight": lin for lin in quantized_linears(cfg)} if quantize_base != "none" else {}
    extra = 0
    for t in tensor_inventory(cfg):
        lin = quantized.get(t.name)
        extra += _rounded(quantized_linear_bytes(lin.n_out, lin.n_in, qspec) if lin else
                          t.numel * (DTYPE_BYTES[t.dtype] if t.dtype else e_p))
    return extra


def cuda_lines(rounding: int) -> dict[str, int]:
    """The CUDA allocator's own lines of a training step (full training and fine-tuning alike): the 512-B
    rounding, the two cuBLAS workspaces (CUBLAS_WORKSPACE_BYTES: every training step runs matmuls on the Python
    thread and on autograd's device thread; docs/gpu.md) and the context, outside the allocator's count."""
    return {"allocator_rounding": rounding, "cublas_workspace": CUBLAS_WORKSPACE_BYTES,
            "cuda_context_not_counted": CUDA_CONTEXT_BYTES}


def with_cuda_lines(est: TrainEstimate, lines: dict[str, int]) -> TrainEstimate:
    """An estimate whose phases were built without the CUDA lines (fine-tuning: planner/estimate/finetune.py,
    quantized.py), with them added to every phase (as Step.every_phase adds them to full training's)."""
    from . import step

    phase = step.shifted(est.phase_peak_bytes, every=lines["allocator_rounding"] + lines["cublas_workspace"])
    peak_phase = step.peak(phase)[0]
    est.transients.update(lines)
    est.notes.append(CUDA_NOTE)
    return dataclasses.replace(est, phase_peak_bytes=phase, peak_phase=peak_phase, peak_bytes=phase[peak_phase])


CUDA_NOTE = ("CUDA: 512-B allocator rounding and the two cuBLAS workspaces are included; the CUDA context "
             f"(~{CUDA_CONTEXT_BYTES // 2**20} MiB) is not, as max_memory_allocated does not count it.")


@per_config
def _persistent_rounding_bytes(cfg: ModelConfig, optimizer: str, param_dtype: str) -> int:
    """Bytes the allocator's 512-B rounding adds to the persistent tensors: weights, buffers, grads,
    optimizer states (per tensor, from the inventory) and the two index tensors. Saved activations are
    rounded too but are few and large, so their rounding is < 512 B each and is left out."""
    e_p = DTYPE_BYTES[param_dtype]
    extra = 0
    per_param_copies = 1 + 1 + {"adam": 2, "adamw": 2, "sgd-momentum": 1}.get(optimizer, 0)
    for t in tensor_inventory(cfg):
        nbytes = t.numel * (DTYPE_BYTES[t.dtype] if t.dtype else e_p)
        copies = per_param_copies if t.kind == "param" else 1
        extra += copies * (_round_up(nbytes, CUDA_BLOCK_BYTES) - nbytes)
        if t.kind == "param" and optimizer in ("adam", "adamw"):
            extra += CUDA_BLOCK_BYTES - 4  # the 0-d fp32 step tensor (on the device when fused)
    return extra


@per_config
def _grad_numels(cfg: ModelConfig) -> dict[str, int]:
    """Parameter counts by role, for the grads that exist at each point of the backward sweep:
    head (output projection + final norm; a tied head's grad is made at the head's backward), one block
    (block 0), its MLP, its MLP output projection, its largest MLP weight, and what exists at the
    attention's backward besides the MLP's (the attention output projection and the pre-MLP norm)."""
    inv = [t for t in tensor_inventory(cfg) if t.kind == "param" and t.trainable]
    head = sum(t.numel for t in inv if t.role in ("head", "norm.final"))
    if family_of(cfg).tied(cfg):
        head += sum(t.numel for t in inv if t.role == "embed")
    blk = [t for t in inv if t.block == 0]
    mlp = [t for t in blk if t.role in ("mlp.in", "mlp.out")]
    return {"head": head, "block": sum(t.numel for t in blk), "mlp": sum(t.numel for t in mlp),
            "down": sum(t.numel for t in blk if t.role == "mlp.out"),
            "mlp_weight": max((t.numel for t in mlp if not t.is_bias), default=0),
            "attn_done": sum(t.numel for t in blk if t.role in ("attn.out", "norm.mlp")),
            "norm_attn": sum(t.numel for t in blk if t.role == "norm.attn"),
            "attn_in": sum(t.numel for t in blk if t.role == "attn.in"),
            "mlp_in_weight": max((t.numel for t in blk if t.role == "mlp.in" and not t.is_bias), default=0)}


def _backward_sweep(cfg: ModelConfig, spec: TrainSpec, w: Widths, blk: list[Term], out: list[Term], e_p: int,
                    saved_after_loss: int, amp_weights: int, grads_exist: bool = False,
                    numels: dict[str, int] | None = None, tweak=None, detail: bool = False) -> dict[str, int]:
    """Live bytes (without the persistent base) at the in-block high points of the first and last block.

    Each block frees its saved tensors and adds its weight grads, so the total is linear in the block
    index and its maximum is at the first or the last block; inside a block the family names its high
    points (planner/arch/<family>.py block_points), and one before the blocks (head_point).
    grads_exist: a later micro-batch of gradient accumulation, where every .grad already exists (and is
    counted by the caller); new grads are then only transients added in place, so the grads "made so
    far" by the sweep are not counted again.
    numels: parameter counts by role that get grads (_grad_numels' keys), for a fine-tuning step whose
    frozen weights make none (planner/estimate/finetune.py); default: every parameter trains.
    tweak / detail (planner/estimate/categories.py sweep_split): the context handed to the family's points passed
    through `tweak` first, and each point as (the other blocks' saved bytes, the grads made before the block,
    the family's value) instead of their sum."""
    family = family_of(cfg)
    b, s, L, h = spec.batch_size, spec.seq_len, cfg.layers, cfg.hidden
    bsh = b * s * h
    n = _grad_numels(cfg) if numels is None else numels
    blk_bytes = sum(t.bytes for t in blk)
    head_bytes = sum(t.bytes for t in out if t.where == "head")
    embed_bytes = sum(t.bytes for t in out if t.where in ("embed", "kept"))
    mlp_saved = sum(t.bytes for t in blk if t.where == "mlp")
    norm_mlp_saved = sum(t.bytes for t in blk if t.part == "norm.mlp")
    casts_blk = autocast_weight_bytes(cfg, spec, blocks_only=True) // L     # one block's bf16 weight copies
    casts_head = amp_weights - (0 if spec.checkpointing else L * casts_blk)  # the output head's copy
    casts_mlp = 2 * n["mlp"] if w.amp else 0                                  # ~ the MLP's weight copies

    g = 0 if grads_exist else e_p  # bytes per parameter of grads the sweep itself creates
    # With grads already there, a new weight grad is computed in full, then added in place: one MLP
    # weight's grad is the transient at the MLP's points.
    pending = n["mlp_weight"] * e_p if grads_exist else 0
    if spec.checkpointing:  # the others keep only their stashed input; the current block is recomputed
        others_last = embed_bytes + (L - 1) * bsh * w.e_r
    else:
        others_last = saved_after_loss - head_bytes - blk_bytes - casts_blk - casts_head
    others_first = embed_bytes - family.first_block_released(cfg, spec, w)  # (Gemma 2's full-attention mask)
    current = blk_bytes + casts_blk + (family.stash_extra(cfg, spec, w) if spec.checkpointing else 0)
    # A tied head's weight grad is not added to .grad at the head's backward: the engine holds it in the
    # input buffer of the shared weight's AccumulateGrad node until the embedding's backward (the last
    # one) adds its part. With fresh grads that is part of n["head"]; in a later micro-batch it is the
    # one grad the sweep holds apart from the existing .grads (V*h*e_p; measured on GPT-2 V97 h96 b4 s8
    # bf16-amp ckpt accum2: a 37,248 B fp32 (97, 96) tensor alive from the head's backward to the end).
    tied_pending = (sum(t.numel for t in tensor_inventory(cfg) if t.kind == "param" and t.role == "embed") * e_p
                    if grads_exist and family.tied(cfg) else 0)
    grads_last = tied_pending if grads_exist else n["head"] * e_p
    ctx = SweepContext(b=b, s=s, h=h, L=L, bsh=bsh, e_p=e_p, g=g, pending=pending, current=current,
                       mlp_saved=mlp_saved, norm_mlp_saved=norm_mlp_saved, casts_mlp=casts_mlp, mlp_n=n["mlp"],
                       down_n=n["down"], attn_n=n["attn_done"], saved_after_loss=saved_after_loss,
                       casts_head=casts_head, grads_last=grads_last, block_n=n["block"], norm_attn_n=n["norm_attn"],
                       norm_attn_saved=sum(t.bytes for t in blk if t.part == "norm.attn"),
                       attn_in_saved=sum(t.bytes for t in blk if t.part == "attn.in"),
                       mlp_in_weight=n["mlp_in_weight"], attn_in_n=n["attn_in"],
                       rope_bytes=sum(t.bytes for t in out if t.part == "shared"), block_terms=tuple(blk))
    grads_first = tied_pending if grads_exist else (n["head"] + (L - 1) * n["block"]) * e_p
    if tweak is not None:
        ctx = tweak(ctx)
    if detail:
        out_ = {"final norm": (0, 0, family.head_point(cfg, spec, w, ctx))}
        for name, value in family.block_points(cfg, spec, w, ctx).items():
            out_[f"last block {name}"] = (others_last, grads_last, value)
        for name, value in family.block_points(cfg, spec, w, dataclasses.replace(ctx, first=True)).items():
            out_[f"first block {name}"] = (others_first, grads_first, value)
        return out_
    out_ = {"final norm": family.head_point(cfg, spec, w, ctx)}
    for name, value in family.block_points(cfg, spec, w, ctx).items():
        out_[f"last block {name}"] = others_last + grads_last + value
    for name, value in family.block_points(cfg, spec, w, dataclasses.replace(ctx, first=True)).items():
        out_[f"first block {name}"] = others_first + grads_first + value
    return out_


def tied_embedding_accumulation(cfg: ModelConfig, spec: TrainSpec) -> int:
    """The backward's last step with a tied head: the embedding's own grad (V*h) is added to the grad the
    head's backward already made, out of place (AccumulateGrad), so every grad plus two V*h tensors are
    alive at once (measured). Untied: the embedding's grad is one more new grad (the `grads` level)."""
    if not family_of(cfg).tied(cfg):
        return 0
    e_p = DTYPE_BYTES[spec.param_dtype]
    embed = sum(t.numel for t in tensor_inventory(cfg) if t.role == "embed")
    return (param_count(cfg) + 2 * embed) * e_p


def _saved_terms(cfg: ModelConfig, spec: TrainSpec, w: Widths, loss_kind: str):
    """What the forward and loss save: (the block's terms, the terms outside the blocks, the fused loss or None,
    the saved autocast weight copies, the loss's saved bytes, every saved byte)."""
    family = family_of(cfg)
    b, s, V, L = spec.batch_size, spec.seq_len, cfg.vocab_size, cfg.layers
    bsV = b * s * V
    e_p = DTYPE_BYTES[spec.param_dtype]
    blk = family.block_terms(cfg, spec, w)  # the family file describes its block once (planner/arch)
    out = family.outside_terms(cfg, spec, w)
    fused = None
    if is_fused(loss_kind):  # chunked-ce / cce (planner/estimate/losses.py): the head runs inside the loss
        fused = fused_loss(loss_kind, b * s, V, cfg.hidden, w.e_r, w.e_m, e_p, w.amp,
                           softcap=family.logit_softcap(cfg))  # (Gemma 2's cap applied per chunk / block)
        out = ([t for t in out if not t.name.endswith("head input") and not t.name.startswith(HEAD_SAVES[-1])]
               + [t for t in fused.saved if t.where == "head"])
    blk_bytes = sum(t.bytes for t in blk)
    out_bytes = sum(t.bytes for t in out)
    # log_softmax output and nll_loss's 0-d total_weight; transformers' ForCausalLMLoss also saves its
    # shifted labels (pad(labels, (0, 1))[..., 1:].contiguous(): an int64 b*s copy) as nll_loss's target.
    shifted_labels = 8 * b * s if loss_kind == "labels" else 0
    ce_saved = bsV * w.e_ce + w.e_ce + shifted_labels
    if cuda_amp_cross_entropy(spec, w, loss_kind):  # log_softmax's e_m output and nll_loss's fp32 copy of it
        ce_saved = bsV * (w.e_m + 4) + 4
    if spec.checkpointing:
        # Non-reentrant checkpoint saves only each block's input; everything else is recomputed.
        ckpt_input = b * s * cfg.hidden * w.e_r
        saved_blocks = L * ckpt_input
        amp_weights = autocast_weight_bytes(cfg, spec) - autocast_weight_bytes(cfg, spec, blocks_only=True)
    else:
        saved_blocks = L * blk_bytes
        amp_weights = autocast_weight_bytes(cfg, spec)
    if fused is not None:  # no b*s*V log-softmax output; the head's autocast copy is not saved by the head
        ce_saved = sum(t.bytes for t in fused.saved if t.where == "loss")
        amp_weights -= autocast_weight_bytes(cfg, spec) - autocast_weight_bytes(cfg, spec, blocks_only=True)
    activations = saved_blocks + out_bytes + amp_weights + ce_saved
    return blk, out, fused, amp_weights, ce_saved, activations


_COPIES_MODELLED: dict = {}


def _offload_copies_modelled(family, cfg: ModelConfig, spec: TrainSpec, w: Widths) -> bool:
    """Whether the family lists save_on_cpu's host copies for this config (offload_copies is not None), memoised:
    whether it is None depends on the config and the device alone (planner/arch/base.py offload_copies), and the
    list itself is a whole walk of a block (half of a full-training estimate's time)."""
    key = (type(family), family.arch, config_key(cfg), spec.device_type)
    got = _COPIES_MODELLED.get(key)
    if got is None:
        if len(_COPIES_MODELLED) > 4096:
            _COPIES_MODELLED.clear()
        got = _COPIES_MODELLED[key] = family.offload_copies(cfg, spec, w) is not None
    return got


def forward_block_points(cfg: ModelConfig, spec: TrainSpec, w: Widths, blk: list[Term] | None = None) -> dict[str, int]:
    """The forward's high points inside the last block (above the persistent base), where the forward goes higher
    than its end: eager attention's scores and softmax, RoPE's copies, SDPA, the MLP's gated product. They are the
    --offload-activations step's points (planner/estimate/offload_act.py forward_alive: with every saved tensor on
    the host they are the block's transients over an empty device stash) with the tensors this step keeps on the
    device added back. Under full checkpointing each block runs its forward without saving (non-reentrant
    checkpoint's pack hook keeps nothing: torch/utils/checkpoint.py _checkpoint_hook), and what is kept is each
    block's input (L*b*s*h*e_r, _saved_terms): the points count the last two (the embedding output and the last block's
    input, the model's locals: planner/arch/decoder.py offload_forward_held), so the L - 2 before them are added
    (measured: the forward phase of the simulated step, planner/measure/simulate.py, equals the offloaded step's
    at L = 2). Autocast's cache is every block's copy made so far: the points take the copies not made yet off.
    No checkpointing, fp16-AMP, fine-tuning and the families without the offloaded points: {} (the end of the
    forward only)."""
    family = family_of(cfg)
    if not forward_points_modelled(cfg, spec, w):
        return {}
    from .offload_act import forward_alive

    cache, held, mlp_point, points = forward_alive(cfg, spec, w)
    L = cfg.layers
    if not spec.checkpointing:
        # every block before the last has saved its whole set, the last one its tensors before the softmax
        # (planner/arch/<family>.py plain_attention_saved; the other points are under the end of the forward)
        if blk is None:  # (estimate_training passes its own: the same walk)
            blk = family.block_terms(cfg, spec, w)
        added = family.plain_attention_saved(cfg, spec, w, blk) if hasattr(family, "plain_attention_saved") else None
        if added is None or "attention" not in points:
            return {}
        amp_cache = autocast_weight_bytes(cfg, spec) + autocast_bias_bytes(cfg, spec)
        return {"last block attention": amp_cache + cache + held + points["attention"]
                + (L - 1) * sum(t.bytes for t in blk) + added}
    kept_inputs = max(L - 2, 0) * spec.batch_size * spec.seq_len * cfg.hidden * w.e_r  # (the ones before them)
    amp_cache = autocast_weight_bytes(cfg, spec) + autocast_bias_bytes(cfg, spec)
    over = amp_cache + cache + held + kept_inputs
    return {f"last block {name}": over + v for name, v in {"mlp": mlp_point, **points}.items()}


def forward_points_modelled(cfg: ModelConfig, spec: TrainSpec, w: Widths) -> bool:
    """Whether forward_block_points models this step's in-block forward points (else the forward is its end only)."""
    family = family_of(cfg)
    return not ((spec.checkpointing and getattr(spec, "checkpoint_policy", "full") != "full") or spec.finetuning
                or spec.precision not in ("fp32", "bf16", "bf16-amp") or not hasattr(family, "offload_alive")
                or not _offload_copies_modelled(family, cfg, spec, w)
                or (hasattr(family, "offload_why_not") and family.offload_why_not(cfg, spec)))


def forward_point_activation(cfg: ModelConfig, spec: TrainSpec, w: Widths, name: str, blk: list[Term]) -> int:
    """The saved bytes alive at one of forward_block_points' high points (planner/estimate/categories.py)."""
    family = family_of(cfg)
    L = cfg.layers
    if not spec.checkpointing:
        return (L - 1) * sum(t.bytes for t in blk) + family.plain_attention_saved(cfg, spec, w, blk)
    # under full checkpointing: every block's input (the stash: the L - 2 before and the two the points count) and
    # what every checkpointed block is given (forward_alive's held: RoPE's cos and sin, position_ids, masks)
    from .offload_act import forward_alive

    return L * spec.batch_size * spec.seq_len * cfg.hidden * w.e_r + forward_alive(cfg, spec, w)[1]


def tied_head_bytes(cfg: ModelConfig, spec: TrainSpec) -> int:
    """A tied head's weight grad, held by the engine apart from .grad until the embedding's backward (the sweep's
    grads_last counts it; _backward_sweep's tied_pending): not a .grad yet, so a temporary by the measurement."""
    if not family_of(cfg).tied(cfg):
        return 0
    return sum(t.numel for t in tensor_inventory(cfg) if t.kind == "param" and t.role == "embed") \
        * DTYPE_BYTES[spec.param_dtype]


def later_sweep_points(cfg: ModelConfig, spec: TrainSpec) -> dict[str, int]:
    """The backward sweep's points in a later micro-batch of gradient accumulation (every .grad alive already, not
    counted here: the caller adds them), for full training with this spec (planner/estimate/ckpt_policy.py builds
    the policies' later micro-batches from full checkpointing's and no checkpointing's)."""
    family = family_of(cfg)
    loss_kind = resolved_loss(family, spec)
    w = Widths.of(spec, loss_upcast=family.loss_upcast(cfg, spec))
    blk, out, _, amp_weights, ce_saved, activations = _saved_terms(cfg, spec, w, loss_kind)
    return _backward_sweep(cfg, spec, w, blk, out, DTYPE_BYTES[spec.param_dtype], activations - ce_saved,
                           amp_weights, grads_exist=True)


def estimate_training(cfg: ModelConfig, spec: TrainSpec, *, forward_points: bool = True) -> TrainEstimate:
    """forward_points=False: the forward phase is the end of the forward only (not the last block's in-block
    points, forward_block_points): planner/estimate/ckpt_policy.py shifts full checkpointing's end of the forward
    by what its policy keeps."""
    if getattr(spec, "offload_optimizer", False):  # the optimizer on the host: planner/estimate/offload.py
        from .offload import estimate_offload_optimizer

        return _recategorised(estimate_offload_optimizer(cfg, spec, estimate_training), spec)
    if getattr(spec, "offload_activations", False):  # saved tensors on the host: planner/estimate/offload_act.py
        from .offload_act import estimate_offload_activations

        return _recategorised(estimate_offload_activations(cfg, spec, estimate_training, _backward_sweep,
                                                           autocast_weight_bytes, autocast_bias_bytes,
                                                           later_sweep_points), spec)
    policy = getattr(spec, "checkpoint_policy", "full")
    if spec.checkpointing and policy != "full" and not spec.finetuning:  # every:K, selective: ckpt_policy.py
        # (with fine-tuning: planner/estimate/finetune.py, the policy's kept tensors in the fine-tuning step)
        from .ckpt_policy import estimate_policy

        return _recategorised(estimate_policy(cfg, spec, functools.partial(estimate_training, forward_points=False),
                                              _grad_numels, autocast_weight_bytes, later_sweep_points), spec)
    if spec.finetuning:  # a trainable subset or LoRA (planner/estimate/finetune.py; a family walking its own
        # block, the book's GPT-2: its planner/arch file's finetune_step) or on a quantized base (QLoRA: quantized.py)
        from .finetune import estimate_finetune, trainable_params
        from .quantized import estimate_quantized

        if spec.checkpointing and policy != "full":
            from .ckpt_policy import check_policy_estimable

            check_policy_estimable(cfg, spec)

        if getattr(spec, "quantize_base", "none") != "none":
            est = estimate_quantized(cfg, spec)
        else:
            est = estimate_finetune(cfg, spec)
        if bnb_optim.is_bnb(spec.optimizer):  # its notes and paged line, over the trainable tensors
            est.transients.update(bnb_extra_lines(spec, [n for _, n, _ in trainable_params(cfg, spec)], est.notes))
        if spec.device_type == "cuda":  # the allocator's lines, as full training's (cuda_lines)
            est = with_cuda_lines(est, cuda_lines(finetune_rounding_bytes(cfg, spec, trainable_params(cfg, spec))))
        est.categories = estimate_categories(est, spec)
        return est
    family = family_of(cfg)
    loss_kind = resolved_loss(family, spec)
    w = Widths.of(spec, loss_upcast=family.loss_upcast(cfg, spec))
    e_p = DTYPE_BYTES[spec.param_dtype]
    b, s, V = spec.batch_size, spec.seq_len, cfg.vocab_size
    bsV = b * s * V

    params = param_count(cfg) * e_p
    buffers = buffer_bytes(cfg, spec.param_dtype)
    inputs = 2 * 8 * b * s  # input ids and targets, int64
    grads = params          # one .grad per parameter, in the parameter's dtype
    opt_state = optimizer_state_bytes(cfg, spec)
    scaler = 8 if spec.precision == "fp16-amp" else 0  # GradScaler's 0-d fp32 scale and int32 growth tracker

    blk, out, fused, amp_weights, ce_saved, activations = _saved_terms(cfg, spec, w, loss_kind)
    # (ce_saved: log_softmax output and nll_loss's 0-d total_weight, with transformers' shifted labels)
    shifted_labels = 8 * b * s if loss_kind == "labels" else 0

    logits = bsV * w.e_m
    # The loss's fp32 copy of low-precision logits: autocast's cast for cross_entropy (fp32 list), or
    # ForCausalLMLoss's logits.float() (transformers/loss/loss_utils.py), which pure bf16 pays too.
    logits_fp32_copy = bsV * 4 if (w.amp or (loss_kind == "labels" and w.e_m < 4)) else 0
    ce_grads = 2 * bsV * w.e_ce  # nll_loss_backward output and _log_softmax_backward_data output
    if cuda_amp_cross_entropy(spec, w, loss_kind):
        # the fp32 copy nll_loss saves is in ce_saved (no cast for a fp32-list cross_entropy); the backward's top
        # is nll_loss_backward's fp32 output beside the saved set (then the fp32 copy is released, and the
        # ToCopyBackward and log_softmax backward's e_m grads are smaller)
        logits_fp32_copy, ce_grads = 0, bsV * 4
    if fused is not None:  # never whole: a chunk's are in fused.loss_point / fused.backward_point
        logits = logits_fp32_copy = ce_grads = 0
    opt_tmp, opt_tmp_formula = optimizer_temporary_bytes(cfg, spec)

    base = params + buffers + inputs + opt_state + scaler
    accum_grads = grads if spec.grad_accum > 1 else 0  # later micro-batches run with grads alive
    a_before_loss = activations - ce_saved
    # Backward sweep, block by block from the last: each block frees its saved tensors and adds its
    # weight grads, so the total is linear in the block index and its maximum is at the first or the
    # last block. Inside a block these points can hold the maximum (found by walking the measured
    # timeline op by op): the FFN activation's backward, the end of the MLP's backward, Llama's RMSNorm
    # backward, and the attention's backward (eager and math attention only: its s x s gradients);
    # before the blocks, Llama's final RMSNorm backward.
    backward_points = _backward_sweep(cfg, spec, w, blk, out, e_p, activations - ce_saved, amp_weights)
    sweep = max(backward_points.values())
    if spec.grad_accum > 1:
        sweep = max(sweep, accum_grads + max(_backward_sweep(cfg, spec, w, blk, out, e_p, activations - ce_saved,
                                                             amp_weights, grads_exist=True).values()))
    # Under checkpointing nothing in the blocks is saved, but autocast's cache still holds every block's
    # low-precision weight copy until the autocast region (forward + loss) exits.
    cached_casts = autocast_weight_bytes(cfg, spec, blocks_only=True) if spec.checkpointing else 0
    a_before_loss += cached_casts + autocast_bias_bytes(cfg, spec)
    # Alive at the end of the forward but not saved (transformers' KV cache, ...): with a loss computed
    # inside the model (labels=) they last through it; padded labels (8*b*(s+1)) live during it too.
    fwd = family.forward_terms(cfg, spec, w)
    fwd_bytes = sum(t.bytes for t in fwd)
    in_model_loss = fwd_bytes + 8 * b * (s + 1) if loss_kind == "labels" else 0
    fused_loss_point = fused.loss_point if fused is not None else 0
    fused_bwd_point = fused.backward_point if fused is not None else 0
    in_block = forward_block_points(cfg, spec, w, blk) if forward_points else {}
    # with the loss inside the model the forward phase ends at the head's forward hook (planner/arch/base.py loss):
    # what the family saves after the head (Gemma 2's logit soft-capping) is made in the loss phase
    after_head = family.after_head_bytes(cfg, spec, w) if loss_kind == "labels" and fused is None else 0
    dev_lines = {}
    if spec.device_type == "cuda":
        # 512-B rounding and the two cuBLAS workspaces measured on an H100 (docs/gpu.md); the step's CUDA terms
        # (dropout masks, SDPA's kernels, autocast's fp32 ops, foreach temporaries) held to the live bytes of every
        # recorded grid run on an H200 (tests/data/cuda/2026-11-27-h200, tests/test_cuda_*.py)
        dev_lines = cuda_lines(cuda_rounding_bytes(cfg, spec))
    # The phases (planner/estimate/step.py), above the base:
    step = Step(
        base=base, grads=grads, optimizer_tmp=opt_tmp,
        forward=accum_grads + max([a_before_loss + logits + fwd_bytes - after_head, *in_block.values()]),
        loss=accum_grads + a_before_loss + logits + logits_fp32_copy + ce_saved + in_model_loss + fused_loss_point,
        # nll_loss's backward has run (and released its saved target) when log_softmax's backward
        # allocates its output: the shifted labels are gone at that high point.
        backward=[accum_grads + activations - shifted_labels + ce_grads + fused_bwd_point, sweep, grads,
                  tied_embedding_accumulation(cfg, spec)],
        every_phase=dev_lines["allocator_rounding"] + CUBLAS_WORKSPACE_BYTES if dev_lines else 0)

    # What each phase's high point is made of (planner/estimate/categories.py): the candidate that wins, split
    fwd_end = a_before_loss + logits + fwd_bytes - after_head
    stash = activations - ce_saved - after_head  # what the forward has saved by its end
    # (exact where the forward's in-block points are modelled: elsewhere one of them may be the measured high point)
    fwd_split = {"gradient": accum_grads, "activation": stash,
                 "exact": not spec.checkpointing and forward_points and forward_points_modelled(cfg, spec, w),
                 "bounds": {"activation": [0, stash]}}
    if in_block and max(in_block.values()) > fwd_end:
        at = forward_point_activation(cfg, spec, w, max(in_block, key=in_block.get), blk)
        fwd_split = {"gradient": accum_grads, "activation": at, "exact": False,
                     "bounds": {"activation": [min(at, stash), max(at, stash)]}}
    ce_candidate = accum_grads + activations - shifted_labels + ce_grads + fused_bwd_point
    bwd = max(step.backward)
    if bwd == ce_candidate:
        bwd_split = {"gradient": accum_grads, "activation": activations - shifted_labels, "exact": True}
    elif bwd == max(backward_points.values()):
        bwd_split = sweep_split(lambda tweak: _backward_sweep(cfg, spec, w, blk, out, e_p, activations - ce_saved,
                                                              amp_weights, tweak=tweak, detail=True),
                                max(backward_points, key=backward_points.get), e_p, False, spec.checkpointing,
                                b * s * cfg.hidden * w.e_r, tied_head_bytes(cfg, spec))
    elif bwd != sweep:  # every grad (or, tied, the embedding's accumulation: two V*h transients beside them)
        bwd_split = {"gradient": grads, "activation": 0, "exact": True}
    else:  # a later micro-batch's sweep point over every existing grad
        later = _backward_sweep(cfg, spec, w, blk, out, e_p, activations - ce_saved, amp_weights, grads_exist=True)
        part = sweep_split(lambda tweak: _backward_sweep(cfg, spec, w, blk, out, e_p, activations - ce_saved,
                                                         amp_weights, grads_exist=True, tweak=tweak, detail=True),
                           max(later, key=later.get), e_p, True, spec.checkpointing, b * s * cfg.hidden * w.e_r)
        bwd_split = {**part, "gradient": accum_grads + part["gradient"]}
    # a rival within the estimate's bar may be the measured high point: the split is then approximate
    most = activations + (sum(t.bytes for t in blk) if spec.checkpointing else 0)  # (a recompute's set besides)
    splits = {"forward": contest(fwd_split, [fwd_end, *in_block.values()], base, stash),
              "loss": {"gradient": accum_grads, "activation": activations, "exact": True},
              "backward": contest(bwd_split, step.backward, base, most)}

    terms = blk + out + fwd
    notes = []
    if fused is not None:
        terms += [t for t in fused.saved if t.where == "loss"]
        terms += [Term(f"transient: {loss_kind} loss phase (one chunk's logits, fp32 copy, log-softmax)",
                       "see planner/estimate/losses.py", fused.loss_point, where="transient"),
                  Term(f"transient: {loss_kind} backward (one chunk recomputed and its grads)",
                       "see planner/estimate/losses.py", fused.backward_point, where="transient")]
        notes.append(f"{loss_kind}: the b*s*V logits never exist whole ({fused.chunk} tokens a chunk); "
                     f"extra compute: {fused.compute}")
    elif loss_kind == "labels":
        terms.append(Term("log_softmax output (fp32: ForCausalLMLoss upcasts the logits) + nll total_weight"
                          " + shifted labels", "4*b*s*V + 4 + 8*b*s", ce_saved))
    else:
        terms.append(Term("log_softmax output + nll total_weight", "b*s*V*e_ce + e_ce", ce_saved))
    if amp_weights:
        terms.append(Term("autocast weight copies (saved)", "sum(matmul weights) * 2", amp_weights))
    terms += [Term("transient: logits", "b*s*V*e_m", logits, where="transient"),
              Term("transient: cross-entropy backward gradients", "2*b*s*V*e_ce", ce_grads, where="transient"),
              Term("transient: optimizer step", opt_tmp_formula, opt_tmp, where="transient")]
    terms = [dict(vars(t)) for t in terms]  # its fields are plain values: asdict's deep copy is 10x the cost
    if spec.device_type == "cuda":
        notes.append(CUDA_NOTE)
    if spec.checkpointing:
        notes.append("checkpointing: only each block's input is kept in forward (L*b*s*h*e_r); "
                     "one block is recomputed at a time in backward")
    bnb_lines = (bnb_extra_lines(spec, [t.numel for t in tensor_inventory(cfg) if t.kind == "param"], notes)
                 if bnb_optim.is_bnb(spec.optimizer) else {})  # (bnb_extra_lines: {}, no note)
    est = step_record(
        step, params=params, buffers=buffers, inputs=inputs, optimizer=opt_state, activations=activations,
        transients={"logits": logits, "logits_fp32_copy": logits_fp32_copy, "cross_entropy_grads": ce_grads,
                    "optimizer_temporaries": opt_tmp, "gradscaler": scaler, **dev_lines, **bnb_lines},
        terms=terms, notes=notes, backward_points=backward_points)
    est.categories = estimate_categories(est, spec, splits)
    return est


def _recategorised(est: TrainEstimate, spec: TrainSpec) -> TrainEstimate:
    """A mode built on another step's record (offloading, checkpoint policies): its categories from its own phases
    (planner/estimate/categories.py; the forward, loss and backward split as bounds)."""
    est.categories = estimate_categories(est, spec)
    return est


def bnb_extra_lines(spec: TrainSpec, numels: list[int], notes: list[str]) -> dict[str, int]:
    """bitsandbytes' notes (appended to `notes`) and, for a paged optimizer on CUDA, its unified-memory state
    as a line outside peak_bytes (planner/estimate/bnb_optim.py says why it is not in the allocator's peak)."""
    if not bnb_optim.is_bnb(spec.optimizer):
        return {}
    notes.extend(bnb_optim.notes(spec.optimizer, numels, spec.device_type))
    if spec.optimizer in bnb_optim.PAGED:
        return {"paged_optimizer_state_not_counted": bnb_optim.paged_state_bytes(spec.optimizer, numels)}
    return {}
