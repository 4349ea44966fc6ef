"""The estimate's `categories` block (issue #19 item 3, issue #34 item 4): per phase, the bytes by the category names
the measured and simulated records use (planner/measure/export.py phase_categories, MemTracker's names: parameter,
buffer, inputs, optimizer state, gradient, activation, temporary), from the estimate's own figures (no torch).

The categories are the measurement's (planner/measure/events.py), at each phase's high point:
  - parameter, buffer, inputs, optimizer state (with fp16's GradScaler state): the same in every phase;
  - gradient: a parameter's .grad (what becomes one by the end of the step): in the forward and the loss the earlier
    micro-batches' grads (gradient accumulation) else none (TrainingStep zeroes them with set_to_none); in the
    backward the grads made so far; at the optimizer step and zero_grad every trainable grad;
  - activation: made in the forward or the loss and still alive when the backward starts (the tensors autograd
    saved: the stash), or made by a backward recompute (checkpointing) and alive when that recompute returns;
  - temporary: the rest (the logits and the loss's buffers, grads of activations in flight, workspaces, the
    optimizer's temporaries; on CUDA the allocator's rounding and the cuBLAS workspaces, which the live-bytes
    categories do not see).
An estimator says, per phase, which of its candidates is the high point and splits it (`splits`: phase ->
{"gradient", "activation"} above the persistent base; temporary = the rest): full training
(planner/estimate/training.py) and fine-tuning (finetune.py, as the record's `splits` attribute), from their terms.
Each row says how it was split in its `split` key: "exact" where the winning candidate is one whose parts the
estimator knows (the end of the forward without checkpointing, the loss, the cross-entropy's backward, every grad,
the optimizer step, zero_grad: held to the measurement by tests/test_categories.py), "approximate" elsewhere, with
`bounds` {"activation": [low, high]} the activation is known to lie within (the
forward's in-block points, the backward sweep's in-block points: sweep_split; the modes built on another step's
record: bound_split). The gradient, activation and temporary of a row always sum to its peak above the
persistent categories, each at least 0.
"""
from __future__ import annotations

import dataclasses

PERSISTENT = ("parameter", "buffer", "inputs", "optimizer state")
# the fields of planner/estimate/record.py SweepContext that are saved bytes (the stash, or a recompute's saved set)
SAVED_FIELDS = ("current", "mlp_saved", "norm_mlp_saved", "casts_mlp", "saved_after_loss", "casts_head",
                "norm_attn_saved", "attn_in_saved", "rope_bytes")


def sweep_split(sweep, name: str, e_p: int, grads_exist: bool, recomputed: bool = False,
                ctx_input: int = 0, tied_head: int = 0) -> dict:
    """The gradient and activation of the backward sweep's point `name` (planner/estimate/training.py
    _backward_sweep). `sweep(tweak)` runs the sweep with its context passed through `tweak` and returns each point
    as (the other blocks' saved bytes, the grads made before the block, the family's value). The family's points
    are linear in the context: the value less the value with every saved field at 0 is the block's saved bytes still
    alive (activation); the value's growth with one byte more per grad element, times e_p, is the grads the block
    has made (gradient). In a later micro-batch (grads_exist) the caller counts every .grad; what the sweep makes
    then is added in place (temporary). recomputed (full checkpointing): a block's saved set is its recompute's,
    which the measurement mostly counts as temporary: non-reentrant checkpoint stops the recompute as soon as the
    last tensor the backward needs is made (torch/utils/checkpoint.py _StopRecomputationError, inside the MLP's down
    projection), so the MLP's forward hooks never return and planner/measure/events.py's module stack keeps them:
    its _end_recompute (at an empty stack) then never runs before the phase's end, and nothing recomputed after is
    an activation. Only the first block recomputed (the last block) has its input norm's and attention's recomputed
    tensors tagged activation (their modules returned at an empty stack, before the MLP's early stop): measured,
    llama V97 h32 b2 s256 eager fp32 checkpointed, 3,035,140 B of activation at the last block's attention backward
    (the recomputed probabilities among them) where the first block's points hold the inputs only. The point value
    here is the blocks' inputs (ctx_input: the block's own, b*s*h*e_r); the bounds reach the recompute's set.
    tied_head: a tied head's grad, which the sweep's grads count but the engine holds apart from .grad until the
    embedding's backward (a temporary). The split is `exact: False`: the family's points name no category, and the
    grid of tests/test_categories.py bounds what this reading misses."""
    def zero_saved(ctx):
        return dataclasses.replace(ctx, **{f: 0 for f in SAVED_FIELDS},
                                   post_mlp_saved=0, post_attn_saved=0)

    seen = {}

    def look(ctx):
        seen.update(current=ctx.current, after_loss=ctx.saved_after_loss)
        return ctx

    others, grads_before, value = sweep(look)[name]
    if recomputed and name != "final norm":  # the block's own stashed input is alive through its backward
        saved = ctx_input
    else:
        saved = value - sweep(zero_saved)[name][2]
    # the bounds: at least the other blocks' saved tensors (and under checkpointing the block's own input), at most
    # the block's whole saved set besides (under checkpointing its recompute's, which the measurement counts as
    # activation where the recompute's modules returned: planner/measure/events.py)
    least = others + (ctx_input if recomputed and name != "final norm" else 0)
    most = seen["after_loss"] if name == "final norm" else others + seen["current"] + (ctx_input if recomputed else 0)
    bounds = {"activation": [min(least, others + saved), max(others + saved, most)]}
    if grads_exist:
        return {"gradient": 0, "activation": others + saved, "exact": False, "bounds": bounds}

    def one_more(ctx):
        return dataclasses.replace(ctx, e_p=ctx.e_p + 1, g=ctx.g + 1 if ctx.g else 0,
                                   grads_last=ctx.grads_last // ctx.e_p * (ctx.e_p + 1))
    made = (sweep(one_more)[name][2] - value) * e_p
    return {"gradient": max(0, grads_before + made - tied_head), "activation": others + saved, "exact": False,
            "bounds": bounds}


# The estimate's accuracy bar (every recorded CPU grid within 1% of the measurement: tests/test_recorded.py): two
# candidates for a phase's high point closer than this may trade places in the measurement.
CONTEST_PCT = 1.0


def contest(split: dict, candidates: list[int], base: int, most: int) -> dict:
    """`split` of the highest of `candidates` (bytes above `base`), approximate when another candidate is within
    CONTEST_PCT of the phase's total: the measured high point may be that one's moment, whose activation lies
    between 0 and `most` (the largest the phase holds)."""
    top = sorted(candidates, reverse=True)
    if split.get("exact", True) and len(top) > 1 and top[0] - top[1] <= CONTEST_PCT / 100 * (base + top[0]):
        return {**split, "exact": False, "bounds": {"activation": [0, max(most, split["activation"])]}}
    return split


def estimate_categories(est, spec, splits: dict[str, dict[str, int]] | None = None) -> dict[str, dict]:
    """Phase -> category -> bytes (module doc); each phase's categories sum to its peak (`total`)."""
    persistent = {"parameter": est.params_bytes, "buffer": est.buffers_bytes, "inputs": est.inputs_bytes,
                  "optimizer state": est.optimizer_bytes + est.transients.get("gradscaler", 0)}
    base = sum(persistent.values())
    accum = est.grads_bytes if getattr(spec, "grad_accum", 1) > 1 else 0
    splits = splits or getattr(est, "splits", None) or {}
    out = {}
    for phase, total in est.phase_peak_bytes.items():
        row = dict(persistent)
        above = total - base
        exact = True
        if phase in ("optimizer", "zero_grad"):
            part = {"gradient": est.grads_bytes, "activation": 0}
        elif phase in splits:
            part = splits[phase]
            exact = part.get("exact", True)
        else:
            part, exact = bound_split(est, phase, above, accum), False
        grad = max(0, min(part["gradient"], above))
        act = max(0, min(part["activation"], above - grad))  # (an approximate split never goes below 0)
        row.update({"gradient": grad, "activation": act, "temporary": above - grad - act})
        row["total"] = total
        row["split"] = "exact" if exact else "approximate"
        if not exact:  # what the approximate activation is known to lie within (the temporary: the rest)
            lo, hi = (part.get("bounds") or {}).get("activation", (0, above - grad))
            row["bounds"] = {"activation": [max(0, min(lo, act)), max(act, min(hi, above - grad))]}
        out[phase] = row
    return out


def bound_split(est, phase: str, above: int, accum: int) -> dict[str, int]:
    """A phase whose estimator does not split its high point (approximate): the earlier micro-batches' grads (the
    backward read as the cross-entropy's backward, before the sweep makes any) and the whole stash
    (`activations_bytes`) as far as the phase holds them; the rest temporary."""
    grad = min(accum, above)
    act = max(0, min(est.activations_bytes, above - grad))
    return {"gradient": grad, "activation": act, "bounds": {"activation": [0, above - grad]}}
