"""The estimate of the checkpointing policies every:K and selective (issue #24; no torch), built from the
full-checkpointing estimate (planner/estimate/training.py) and, for every:K, the unCheckpointed one.

every:K (transformers' every_n_layers: blocks i with i % K == 0 checkpointed, planner/checkpointing.py)
  The model runs in checkpointing mode; a checkpointed block keeps its input (b*s*h*e_r), the others their whole
  saved set and, under autocast, their low-precision weight copies. So the forward and loss phases are full's plus,
  per uncheckpointed block, its saved set minus its input (its weight copies are in full's autocast cache already),
  and the loss backward's start full's plus its saved set and weight copies minus its input. The backward sweep
  walks the blocks from the last: at block i it holds the saved sets of blocks 0..i-1, the grads of blocks
  i+1..L-1 and the head, and block i's own high points (the family's block_points, as in the full estimate for a
  checkpointed block, as in the unCheckpointed one for the others). Between blocks of one kind the total is
  linear in i, so every block is evaluated (L terms of arithmetic).
selective (torchtitan's op policy through create_selective_checkpoint_contexts)
  Every block is checkpointed and keeps, besides its input, the outputs of the ops the policy saves
  (planner/checkpointing.py selective_saved over the family's selective_ops): the forward, loss and backward-start
  points are full's plus L such caches; at block i of the sweep blocks 0..i-1 hold theirs (the current block's
  cached outputs are the recompute's own tensors: no extra).
With fine-tuning (LoRA, frozen layers) the fine-tuning step models the policy itself (planner/estimate/finetune.py
policy_terms / policy_kept: the uncheckpointed blocks' fine-tuning saved sets, selective's outputs with LoRA's
adapter matmuls counted in the every-second-mm rule, gradient accumulation included; a quantized base, QLoRA,
through its fp32 twin, whose quantized Linears are bitsandbytes' gemm_4bit custom op, neither saved nor counted);
the book's GPT-2 fine-tunes through its own walk (planner/arch/gpt2_book.py _checkpointed: every:K's uncheckpointed
blocks keep their saved sets, selective's blocks the outputs the policy saves, in the book's op order).
Gradient accumulation (full training): a later micro-batch runs with every .grad of the earlier ones alive; its
forward and loss are full's (which count them), its sweep is built the same way from full training's later sweep
(every new grad a transient added in place, none "made so far"), plus those grads (measured exact, llama, Gemma 2
and Qwen 3 at 4 blocks, every:2 and selective, fp32 and bf16-AMP, accum 2 and 3, and the book's GPT-2 at accum 2,
its own later points in planner/arch/gpt2_book.py block_points: bench checkpoint-policies).
Measured against both (bench checkpoint-policies): the estimate is held to 1% of the live-bytes peak.
"""
from __future__ import annotations

import dataclasses

from ..accounting import DTYPE_BYTES
from ..arch import family_of
from ..arch.base import resolved_loss
from ..checkpointing import checkpointed_blocks, every_k, recompute_flops, selective_saved
from ..validation import ConfigError
from .activations import Widths, block_terms
from . import step


def check_policy_estimable(cfg, spec) -> None:
    """One line for what the policy estimate does not model."""
    policy = spec.checkpoint_policy
    # (fine-tuning a decoder family is modelled in planner/estimate/finetune.py policy_terms / policy_kept, a
    # quantized base through its fp32 twin there, whose policy sees bitsandbytes' custom ops: policy_ops; the
    # book's GPT-2 in its own walk, planner/arch/gpt2_book.py _checkpointed; gradient accumulation in full
    # training below, estimate_policy's later micro-batch)
    if policy == "selective" and family_of(cfg).selective_ops(cfg, spec, Widths.of(spec)) is None:
        raise ConfigError(f"selective checkpointing is not modelled for the {family_of(cfg).name} family")


def estimate_policy(cfg, spec, estimate_training, grad_numels, autocast_weight_bytes, later_sweep_points):
    """every:K or selective; estimate_training, grad_numels (parameter counts by role), autocast_weight_bytes and
    later_sweep_points (a later micro-batch's sweep) are planner.estimate.training's, passed in (no import circle)."""
    check_policy_estimable(cfg, spec)
    family = family_of(cfg)
    policy = spec.checkpoint_policy
    full_spec = dataclasses.replace(spec, checkpoint_policy="full")
    full = estimate_training(cfg, full_spec)
    w = Widths.of(spec, loss_upcast=family.loss_upcast(cfg, spec))
    b, s, L, h = spec.batch_size, spec.seq_len, cfg.layers, cfg.hidden
    e_p = DTYPE_BYTES[spec.param_dtype]
    ckpt_in = b * s * h * w.e_r  # a checkpointed block's stashed input
    grads = full.grads_bytes
    base = full.phase_peak_bytes["zero_grad"] - grads  # weights, buffers, inputs, optimizer state (+ CUDA lines)
    # the loss backward's start in the full estimate (training.py "backward": activations + the loss's grads)
    shifted = 8 * b * s if resolved_loss(family, spec) == "labels" else 0
    fused_bwd = sum(t["bytes"] for t in full.terms if t["name"].startswith("transient:") and "backward (one chunk" in t["name"])
    start = full.activations_bytes - shifted + full.transients["cross_entropy_grads"] + fused_bwd
    g_blk = grad_numels(cfg)["block"] * e_p
    fp = full.backward_points
    ops = family.selective_ops(cfg, spec, w)
    extra_n = 0
    tail = 0
    if policy == "selective":
        from .finetune import selective_tail

        cache = selective_saved(ops)
        kept = [cache] * L                      # what each block keeps besides its input
        # the block's last matmul output the policy cached stays alive through its backward beside the recompute
        # (the recompute stops before that op: planner/estimate/finetune.py selective_tail; its weight needs grad,
        # so it packs); measured: llama V97 h48 L4 b2 s96 selective, the backward b*s*h*e_m low without it
        tail = selective_tail(cfg, spec, w, block_terms(cfg, full_spec, w))
        extra_fwd = extra_start = L * cache
        none_points = {}
        kinds = ["c"] * L
        note = (f"selective checkpointing: every block keeps its input and the outputs torchtitan's policy saves "
                f"({cache:,} B a block: every second aten.mm and the fused attention kernel's where the policy's "
                "list names it: not CUDA's cuDNN or math kernels), the rest is "
                "recomputed in backward")
    else:
        k = every_k(policy)
        ckpt = set(checkpointed_blocks(policy, L))
        none = estimate_training(cfg, dataclasses.replace(spec, checkpointing=False, checkpoint_policy="full"))
        blk = sum(t.bytes for t in block_terms(cfg, full_spec, w))
        casts_blk = autocast_weight_bytes(cfg, spec, blocks_only=True) // L
        n_non = L - len(ckpt)
        # what an uncheckpointed block keeps in checkpointing mode beyond its saved set (no KV cache there: Phi-3's
        # v stays a view of the fused qkv output; planner/arch/<family>.py uncheckpointed_block_extra)
        extra_n = family.uncheckpointed_block_extra(cfg, spec, w) if hasattr(family, "uncheckpointed_block_extra") else 0
        blk += extra_n
        kept = [0 if i in ckpt else blk + casts_blk - ckpt_in for i in range(L)]
        extra_fwd = n_non * (blk - ckpt_in)  # their weight copies are in full's autocast cache already
        extra_start = n_non * (blk + casts_blk - ckpt_in)
        none_points = none.backward_points
        kinds = ["c" if i in ckpt else "n" for i in range(L)]
        note = (f"checkpointing every {k} blocks (transformers' every_n_layers): blocks 0, {k}, ... keep their input "
                f"only ({len(ckpt)} of {L}), the other {n_non} keep their saved tensors")
    saved_n = sum(t.bytes for t in block_terms(cfg, dataclasses.replace(spec, checkpointing=False,
                                                                        checkpoint_policy="full"), w))
    saved_n += autocast_weight_bytes(cfg, spec, blocks_only=True) // L
    # the sweep: point(i) = block i's last-block point - what that estimate held in blocks 0..L-2 + what blocks
    # 0..i-1 hold here + the grads of blocks i+1..L-1 (a last-block point holds none of them)
    points = {"final norm": fp["final norm"] + sum(kept)}
    points.update(_sweep(fp, none_points, kinds, kept, ckpt_in, saved_n, extra_n, g_blk, L, tail))
    # gradient accumulation: a later micro-batch runs with every .grad of the earlier ones alive (`accum`, full's
    # forward and loss phases count them already); its sweep adds each new grad in place, a transient (full
    # training's later sweep, planner/estimate/training.py _backward_sweep grads_exist), so no block's grads are
    # "made so far"; its loss backward starts with them too
    accum = grads if spec.grad_accum > 1 else 0
    if accum:
        fl = later_sweep_points(cfg, full_spec)
        nl = (later_sweep_points(cfg, dataclasses.replace(spec, checkpointing=False, checkpoint_policy="full"))
              if policy != "selective" else {})
        later = {"final norm": fl["final norm"] + sum(kept)}
        later.update(_sweep(fl, nl, kinds, kept, ckpt_in, saved_n, extra_n, 0, L, tail))
        points.update({f"later micro-batch: {k}": accum + v for k, v in later.items()})
    # the masks no checkpointed layer takes die with the forward (planner/arch/gemma2.py checkpoint_mask_count: every:K
    # with K even leaves Gemma 2's full-attention layers uncheckpointed); full's figures hold every mask until block 0
    unkept = ((family.mask_count(cfg) - family.checkpoint_mask_count(cfg, spec)) * b * s * s * w.e_r
              if hasattr(family, "checkpoint_mask_count") else 0)
    if unkept:
        # (block 0's points are full's first-block ones, the full mask let go already; an uncheckpointed block's,
        # from the estimate without checkpointing, are left as they are)
        def lowered(name):
            name = name.removeprefix("later micro-batch: ")
            return name == "final norm" or (kinds[int(name.split()[1])] == "c" and not name.startswith("block 0 "))
        points = {name: v - unkept if lowered(name) else v for name, v in points.items()}
        extra_fwd -= unkept
        extra_start -= unkept
    # full checkpointing's phases with what the policy keeps beyond it (planner/estimate/step.py)
    phase = step.shifted(full.phase_peak_bytes, forward=extra_fwd, loss=extra_fwd,
                         backward_at_least=(base + accum + start + extra_start, base + max(points.values())))
    if unkept:  # (below full's own backward, whose candidates held the mask: the new ones and every grad's)
        phase["backward"] = max(base + accum + start + extra_start, base + max(points.values()), phase["zero_grad"])
    peak_phase = step.peak(phase)[0]
    notes = [n for n in full.notes if not n.startswith("checkpointing:")] + [note]
    share = recompute_share(cfg, spec)
    if share is not None:
        notes.append(f"recompute: ~{100.0 * share:.0f}% more matmul and attention FLOPs than the step without "
                     "checkpointing (" + RECOMPUTE_SOURCE + ")")
    return dataclasses.replace(full, activations_bytes=full.activations_bytes + extra_start, peak_bytes=phase[peak_phase],
                               peak_phase=peak_phase, phase_peak_bytes=phase, notes=notes, backward_points=points,
                               terms=full.terms + [{"name": f"{policy}: kept beyond full checkpointing",
                                                    "formula": "see planner/estimate/ckpt_policy.py",
                                                    "bytes": extra_start, "per_layer": False, "where": "block",
                                                    "part": ""}])


def _sweep(fp, none_points, kinds, kept, ckpt_in, saved_n, extra_n, g_blk, L, tail=0) -> dict[str, int]:
    """The backward sweep's in-block points, block by block: fp are full checkpointing's points (first and last
    block), none_points the step's without checkpointing (the uncheckpointed blocks'), kept what each block keeps
    beyond its input, g_blk one block's grads (0 in a later micro-batch: they exist already), tail what a
    checkpointed block holds beside its recompute through its backward (selective's cached last matmul output)."""
    points = {}
    names = {kind: [n[len("last block "):] for n in pts if n.startswith("last block ")]
             for kind, pts in (("c", fp), ("n", none_points))}
    held = 0
    for i in range(L):
        for name in names[kinds[i]]:
            if i == 0:  # block 0 is checkpointed under both policies; nothing below it
                value = fp[f"first block {name}"] + tail
            elif kinds[i] == "c":
                value = fp[f"last block {name}"] - (L - 1) * ckpt_in + held + (L - 1 - i) * g_blk + tail
            else:
                value = none_points[f"last block {name}"] - (L - 1) * saved_n + held + (L - 1 - i) * g_blk + extra_n
            points[f"block {i} {name}"] = value
        held += ckpt_in + kept[i]
    return points


RECOMPUTE_SOURCE = ("the recomputed ops' FLOPs over the step's, forward + backward ~ 3x the forward: Kaplan et al. "
                    "2020, arXiv 2001.08361; the ops as planner/arch/<family>.py selective_ops lists them")


def recompute_share(cfg, spec) -> float | None:
    """The checkpointing policy's extra compute as a share of the step without checkpointing: recomputed FLOPs
    (planner/checkpointing.py recompute_flops: full = every block's forward, every:K = the checkpointed blocks',
    selective = every block's ops but the saved ones) over the step's 3 x (L blocks + the head's 2*b*s*h*V).
    None: no checkpointing, or the family does not list its ops."""
    if not spec.checkpointing:
        return None
    from .finetune import policy_ops  # (with LoRA: the adapters' matmuls too)

    ops = policy_ops(cfg, spec, Widths.of(spec))
    if ops is None:
        return None
    b, s = spec.batch_size, spec.seq_len
    fwd = cfg.layers * sum(f for *_, f in ops) + 2 * b * s * cfg.hidden * cfg.vocab_size
    return recompute_flops(spec.checkpoint_policy, ops, cfg.layers) / (3 * fwd)
