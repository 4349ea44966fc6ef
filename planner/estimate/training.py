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

from dataclasses import asdict, dataclass, field

from ..accounting import DTYPE_BYTES, buffer_bytes, param_count, per_config, tensor_inventory
from ..config import GPT2Config, LlamaConfig, ModelConfig
from ..spec import TrainSpec
from .activations import Term, Widths, block_terms, outside_terms


@dataclass
class TrainEstimate:
    """Same keys as the measured record (planner.measure.training), so the two compare field by field."""
    params_bytes: int
    buffers_bytes: int
    inputs_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    peak_bytes: int
    peak_phase: str
    phase_peak_bytes: dict[str, int]
    transients: dict[str, int]
    terms: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The backward sweep's named high points (live bytes above the persistent base, grads created so far
    # included), so per-rank estimates (planner.estimate.distributed) can re-count weights and grads.
    backward_points: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def optimizer_state_bytes(cfg: ModelConfig, spec: TrainSpec) -> int:
    return _optimizer_state_bytes(cfg, spec.optimizer, spec.param_dtype)


@per_config
def _optimizer_state_bytes(cfg: ModelConfig, optimizer: str, param_dtype: str) -> int:
    """Adam(W): exp_avg + exp_avg_sq in the weights' dtype, plus a 0-d fp32 `step` per parameter tensor
    (torch/optim/adam.py _init_group). SGD with momentum: one momentum_buffer. Plain SGD: nothing."""
    e_p = DTYPE_BYTES[param_dtype]
    n_params = param_count(cfg)
    n_tensors = sum(1 for t in tensor_inventory(cfg) if t.kind == "param")
    if optimizer in ("adam", "adamw"):
        return 2 * n_params * e_p + 4 * n_tensors
    if optimizer == "sgd-momentum":
        return n_params * e_p
    return 0


def optimizer_temporary_bytes(cfg: ModelConfig, spec: TrainSpec) -> tuple[int, str]:
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


def autocast_weight_bytes(cfg: ModelConfig, spec: TrainSpec, blocks_only: bool = False) -> int:
    return _autocast_weight_bytes(cfg, spec.autocast_dtype is not None, blocks_only)


@per_config
def _autocast_weight_bytes(cfg: ModelConfig, amp: bool, blocks_only: bool) -> int:
    """Low-precision copies of the fp32 matmul weights that autocast caches and Linear saves for backward
    (aten autocast_mode.cpp cached_cast: fp32 leaf tensors that require grad). Embeddings are not cast;
    biases are cast but not saved. A tied lm_head casts the embedding matrix."""
    if not amp:
        return 0
    total = 0
    for t in tensor_inventory(cfg):
        if t.autocast and t.name.endswith("weight"):
            in_block = t.name.startswith(("trf_blocks.", "model.layers."))
            if in_block or not blocks_only:
                total += t.numel
    if getattr(cfg, "tie_word_embeddings", False):
        total += cfg.vocab_size * cfg.hidden_size
    return total * 2


# CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every block is a multiple of 512 B.
CUDA_BLOCK_BYTES = 512
# cuBLAS workspace, allocated through the caching allocator and so counted by max_memory_allocated
# (CublasHandlePool.cpp default ":4096:2:16:8" = 8,519,680 B; 32 MiB on Hopper). Not verified on a GPU.
CUBLAS_WORKSPACE_BYTES = 8_519_680
# The CUDA context (driver, kernels) is outside the allocator: ~300-500 MB with lazy module loading
# (PyTorch PR #86509; issue #109888). Shown as a separate line, never in peak_bytes.
CUDA_CONTEXT_BYTES = 400 * 2**20


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def cuda_rounding_bytes(cfg: ModelConfig, spec: TrainSpec) -> int:
    nbytes = 8 * spec.batch_size * spec.seq_len  # the two int64 index tensors
    return (_persistent_rounding_bytes(cfg, spec.optimizer, spec.param_dtype)
            + 2 * (_round_up(nbytes, CUDA_BLOCK_BYTES) - nbytes))


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
def _grad_numels(cfg: ModelConfig) -> tuple[int, int, int, int]:
    """(head: output projection + final norm, one block, a block's FFN down-projection) parameter counts:
    the grads that exist when the backward sweep reaches the first / last block's FFN."""
    inv = tensor_inventory(cfg)
    head = sum(t.numel for t in inv if t.kind == "param" and t.name.startswith(("out_head", "final_norm",
                                                                                 "lm_head", "model.norm")))
    if getattr(cfg, "tie_word_embeddings", False):
        head += cfg.vocab_size * cfg.hidden_size  # the tied head's grad is created at lm_head backward
    block = sum(t.numel for t in inv if t.kind == "param" and t.name.startswith(("trf_blocks.0.", "model.layers.0.")))
    down = sum(t.numel for t in inv if t.kind == "param" and t.name.startswith(("trf_blocks.0.ff.layers.2",
                                                                                 "model.layers.0.mlp.down_proj")))
    mlp = sum(t.numel for t in inv if t.kind == "param" and t.name.startswith(("trf_blocks.0.ff.",
                                                                                "model.layers.0.mlp.")))
    return head, block, down, mlp


def _ffn_width(cfg: ModelConfig) -> int:
    return 4 * cfg.emb_dim if isinstance(cfg, GPT2Config) else cfg.intermediate_size


def attention_backward_s2_bytes(cfg: ModelConfig, w: Widths) -> int:
    """Net bytes per b*a*s^2 that an eager/math attention backward adds on top of the block's saved set,
    read off the op-by-op timeline (planner.measure.tracker) at its high point, _softmax_backward_data:
    - softmax without dropout (Llama eager; GPT eager with p=0): the probabilities' gradient and the
      softmax backward's output, fp32 in Llama (softmax(dtype=float32)), where below fp32 the freed bf16
      copy of the probabilities offsets 2 B: 8 - e_m; in GPT both are e_m wide: 2*e_m.
    - with dropout (GPT): the dropout output and keep-mask die before the softmax backward runs, which
      offsets the two gradients: 0 (measured +0.1..0.35 B, within the bar). SDPA's math fallback below
      fp32 peaks earlier, at the matmul backward, where the probabilities' fp32 gradient (4 B) joins
      the saved set (fp32 itself: ~0, as eager).
    """
    if isinstance(cfg, LlamaConfig):
        return 8 - (w.e_m if w.e_m < 4 else 0)
    if cfg.drop_rate == 0:
        return 2 * w.e_m
    return 4 if (cfg.attention == "sdpa" and w.e_m < 4) else 0


def _backward_sweep(cfg: ModelConfig, spec: TrainSpec, w: Widths, blk: list[Term], out: list[Term], e_p: int,
                    saved_after_loss: int, amp_weights: int, grads_exist: bool = False) -> dict[str, int]:
    """Live bytes (without the persistent base) at the in-block high points of the first and last block.

    grads_exist: a later micro-batch of gradient accumulation, where every .grad already exists (and is
    counted by the caller); new grads are then only transients added in place, so the grads "made so
    far" by the sweep are not counted again."""
    b, s, L, h = spec.batch_size, spec.seq_len, cfg.layers, cfg.hidden
    f, bsh = _ffn_width(cfg), b * s * cfg.hidden
    head_n, block_n, down_n, mlp_n = _grad_numels(cfg)
    blk_bytes = sum(t.bytes for t in blk)
    head_bytes = sum(t.bytes for t in out if t.where == "head")
    embed_bytes = sum(t.bytes for t in out if t.where == "embed")
    mlp_saved = sum(t.bytes for t in blk if t.where == "mlp")
    norm2_saved = sum(t.bytes for t in blk if t.name.startswith(("LayerNorm", "RMSNorm"))) // 2
    casts_blk = autocast_weight_bytes(cfg, spec, blocks_only=True) // L     # one block's bf16 weight copies
    casts_head = amp_weights - (0 if spec.checkpointing else L * casts_blk)  # the output head's copy
    casts_mlp = 2 * mlp_n if w.amp else 0                                     # ~ the MLP's weight copies
    # At the softmax backward only the output projection's and the post-attention norm's grads exist.
    out_proj_n = (cfg.emb_dim * cfg.emb_dim + cfg.emb_dim if isinstance(cfg, GPT2Config)
                  else cfg.num_attention_heads * cfg.head_dim * cfg.hidden_size * (1 + cfg.attention_bias))
    attn_n = out_proj_n + _norm_numel(cfg)

    g = 0 if grads_exist else e_p  # bytes per parameter of grads the sweep itself creates
    # With grads already there, a new weight grad is computed in full, then added in place: one FFN
    # weight's grad is the transient at the MLP's points.
    pending = f * h * e_p if grads_exist else 0
    if spec.checkpointing:  # the others keep only their stashed input; the current block is recomputed
        others_last = embed_bytes + (L - 1) * b * s * h * w.e_r
    else:
        others_last = saved_after_loss - head_bytes - blk_bytes - casts_blk - casts_head
    others_first = embed_bytes
    current = blk_bytes + casts_blk
    if spec.checkpointing and isinstance(cfg, LlamaConfig) and w.e_r < 4:
        # The stashed block input is its own tensor here: bf16 RMSNorm saves an fp32 copy, not the input.
        current += bsh * w.e_r

    resid_mask = bsh * (1 if spec.device_type == "cuda" else w.e_m) if (
        isinstance(cfg, GPT2Config) and cfg.drop_rate > 0) else 0
    ffn = current + down_n * e_p + bsh * w.e_r + 2 * b * s * f * w.e_m - resid_mask - (2 * f * h if w.amp else 0)
    mlp_done = current - mlp_saved - casts_mlp + mlp_n * g + pending + bsh * (w.e_r + w.e_m) + b * s * f * w.e_m
    points = {"ffn": ffn, "mlp_done": mlp_done}
    if isinstance(cfg, LlamaConfig):  # the post-attention RMSNorm's fp32 backward, as the final norm's
        points["norm"] = current - mlp_saved - casts_mlp + mlp_n * g + pending + bsh * w.e_r + 16 * bsh
    if cfg.attention == "eager" or (cfg.attention == "sdpa" and isinstance(cfg, GPT2Config) and cfg.drop_rate > 0
                                    and spec.device_type == "cpu"):
        s2 = b * cfg.heads * s * s
        points["attention"] = (current - mlp_saved - casts_mlp - norm2_saved - resid_mask
                               - bsh * w.e_m  # the output projection's input copy, freed by its backward
                               + (mlp_n + attn_n) * g + bsh * w.e_r + attention_backward_s2_bytes(cfg, w) * s2)
    grads_last = 0 if grads_exist else head_n * e_p
    if isinstance(cfg, LlamaConfig):
        # The final RMSNorm's backward runs in fp32 (HF's RMSNorm upcasts) and holds four fp32 b*s*h
        # temporaries at once (measured), after the lm_head's backward has freed its input.
        lm_head_input = bsh * w.e_m
        points_head = saved_after_loss - lm_head_input - casts_head + grads_last + bsh * w.e_m + 16 * bsh
    else:
        points_head = 0
    grads_first = 0 if grads_exist else (head_n + (L - 1) * block_n) * e_p
    out_ = {"final norm": points_head}
    for name, value in points.items():
        out_[f"last block {name}"] = others_last + grads_last + value
        out_[f"first block {name}"] = others_first + grads_first + value
    return out_


def _norm_numel(cfg: ModelConfig) -> int:
    """Parameters of one norm: LayerNorm scale + shift, RMSNorm weight."""
    return 2 * cfg.hidden if isinstance(cfg, GPT2Config) else cfg.hidden


def estimate_training(cfg: ModelConfig, spec: TrainSpec) -> TrainEstimate:
    w = Widths.of(spec)
    e_p = DTYPE_BYTES[spec.param_dtype]
    b, s, V, L = spec.batch_size, spec.seq_len, cfg.vocab_size, cfg.layers
    bsV = b * s * V

    params = param_count(cfg) * e_p
    buffers = buffer_bytes(cfg, spec.param_dtype)
    inputs = 2 * 8 * b * s  # input ids and targets, int64
    grads = params          # one .grad per parameter, in the parameter's dtype
    opt_state = optimizer_state_bytes(cfg, spec)
    scaler = 8 if spec.precision == "fp16-amp" else 0  # GradScaler's 0-d fp32 scale and int32 growth tracker

    blk = block_terms(cfg, spec, w)
    out = outside_terms(cfg, spec, w)
    blk_bytes = sum(t.bytes for t in blk)
    out_bytes = sum(t.bytes for t in out)
    ce_saved = bsV * w.e_ce + w.e_ce  # log_softmax output, nll_loss's 0-d total_weight
    if spec.checkpointing:
        # Non-reentrant checkpoint saves only each block's input; everything else is recomputed.
        ckpt_input = b * s * cfg.hidden * w.e_r
        saved_blocks = L * ckpt_input
        amp_weights = autocast_weight_bytes(cfg, spec) - autocast_weight_bytes(cfg, spec, blocks_only=True)
    else:
        saved_blocks = L * blk_bytes
        amp_weights = autocast_weight_bytes(cfg, spec)
    activations = saved_blocks + out_bytes + amp_weights + ce_saved

    logits = bsV * w.e_m
    logits_fp32_copy = bsV * 4 if w.amp else 0
    ce_grads = 2 * bsV * w.e_ce  # nll_loss_backward output and _log_softmax_backward_data output
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
    a_before_loss += cached_casts
    phase = {
        "forward": base + accum_grads + a_before_loss + logits,
        "loss": base + accum_grads + a_before_loss + logits + logits_fp32_copy + bsV * w.e_ce,
        "backward": base + max(accum_grads + activations + ce_grads, sweep, grads),
        "optimizer": base + grads + opt_tmp,
        "zero_grad": base + grads,
    }
    cuda_lines = {}
    if spec.device_type == "cuda":
        # [GPU-verify] terms from PyTorch source, not yet checked against max_memory_allocated.
        cuda_lines = {"allocator_rounding": cuda_rounding_bytes(cfg, spec), "cublas_workspace": CUBLAS_WORKSPACE_BYTES,
                      "cuda_context_not_counted": CUDA_CONTEXT_BYTES}
        for k in phase:
            phase[k] += cuda_lines["allocator_rounding"] + CUBLAS_WORKSPACE_BYTES
    peak_phase = max(phase, key=phase.get)

    terms = blk + out + [Term("log_softmax output + nll total_weight", "b*s*V*e_ce + e_ce", ce_saved)]
    if amp_weights:
        terms.append(Term("autocast weight copies (saved)", "sum(matmul weights) * 2", amp_weights))
    terms += [Term("transient: logits", "b*s*V*e_m", logits, where="transient"),
              Term("transient: cross-entropy backward gradients", "2*b*s*V*e_ce", ce_grads, where="transient"),
              Term("transient: optimizer step", opt_tmp_formula, opt_tmp, where="transient")]
    terms = [dict(vars(t)) for t in terms]  # its fields are plain values: asdict's deep copy is 10x the cost
    notes = []
    if spec.device_type == "cuda":
        notes.append("CUDA: 512-B allocator rounding and one cuBLAS workspace are included; the CUDA context "
                     f"(~{CUDA_CONTEXT_BYTES // 2**20} MiB) is not, as max_memory_allocated does not count it. "
                     "These CUDA terms come from PyTorch's source and are not yet verified on a GPU.")
    if spec.checkpointing:
        notes.append("checkpointing: only each block's input is kept in forward (L*b*s*h*e_r); "
                     "one block is recomputed at a time in backward")
    return TrainEstimate(
        params_bytes=params, buffers_bytes=buffers, inputs_bytes=inputs, grads_bytes=grads,
        optimizer_bytes=opt_state, activations_bytes=activations, peak_bytes=phase[peak_phase],
        peak_phase=peak_phase, phase_peak_bytes=phase,
        transients={"logits": logits, "logits_fp32_copy": logits_fp32_copy, "cross_entropy_grads": ce_grads,
                    "optimizer_temporaries": opt_tmp, "gradscaler": scaler, **cuda_lines},
        terms=terms, notes=notes, backward_points=backward_points)
