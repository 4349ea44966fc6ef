"""The fused losses' terms in the one step model (issue #24; planner/losses.py says what each loss is).

With chunked-ce or cce the head's matmul runs inside the loss on the final hidden states, so the phase dict of
planner/estimate/training.py changes in four places, each a term below:
  saved      what the forward keeps for the loss's backward, instead of the head's input, autocast's head copy
             and the b*s*V log-softmax output (ce_saved);
  loss       the loss phase's high point on top of the forward's saved set (the logits are never whole);
  backward   the loss backward's high point on top of the saved set and the grads made so far;
  compute    the extra work in plain words (a recomputed head matmul).
Each number is live bytes of the real code (planner/models/losses.py), read op by op from measured
timelines (planner.measure, CPU) of the tiny grid in docs/accuracy.md ("Fused losses").
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..arch.terms import Term
from .. import losses as _L
from ..losses import chunk_tokens


# the head's saves a fused loss replaces (full training: planner/arch outside_terms; fine-tuning:
# planner/estimate/finetune.py finetune_activations, finetune_book.py book_activations): the head's input, autocast's
# head copy, and Gemma 2's saved b*s*V tanh output of its final soft cap (the cap runs per chunk inside the loss)
HEAD_SAVES = ("lm_head input", "out_head input", "lm_head weight autocast copy", "final logit soft-capping")


# Cut Cross-Entropy's block under a soft cap (tanh(x / cap) * cap on each block, in the forward and again in the
# backward's recompute), live bytes at the block's high point, in fp32 words of bt*bv: forward 3 (the block's
# fp32 logits x, x / cap and tanh's output at once: `x = tanh(x / cap) * cap` keeps the old x until the
# assignment), backward 4 (tanh's output beside d and its temporaries). Measured op by op (live-bytes tracker)
# on gemma2 V1000 h64 b2 s32 (one 64 x 1000 block) at fp32, bf16 and bf16-AMP, full training and LoRA.
CCE_SOFTCAP_FWD_WORDS = 3
CCE_SOFTCAP_BWD_WORDS = 4


@dataclass
class FusedLoss:
    saved: list            # Terms: the loss's saved tensors (replace the head input and ce_saved)
    loss_point: int        # loss-phase transients on top of the saved set
    backward_point: int    # the loss backward's high point on top of the saved set (grads of W included)
    chunk: int             # tokens a chunk (chunked-ce) or a block (cce)
    compute: str


def fused_loss(loss: str, T: int, V: int, h: int, e_r: int, e_m: int, e_p: int, amp: bool,
               w_grad: bool = True, softcap: float | None = None) -> FusedLoss:
    """The loss's terms (fused_loss_plain), with a final-logit soft cap's per-chunk / per-block tensors added
    (softcap_extra) when the model caps its logits (Gemma 2)."""
    if not w_grad:
        return fused_loss_frozen_head(loss, T, V, h, e_r, e_m, amp, softcap)
    return fused_loss_plain(loss, T, V, h, e_r, e_m, e_p, amp, softcap)


def fused_loss_plain(loss: str, T: int, V: int, h: int, e_r: int, e_m: int, e_p: int, amp: bool,
                     softcap: float | None = None) -> FusedLoss:
    """T = b*s tokens, V vocabulary, h hidden; e_r the hidden states' width, e_m the matmul's (2 under AMP),
    e_p the weights' and grads'. w_grad: the head weight trains (full training); False for a frozen head
    (LoRA, QLoRA, frozen layers: fused_loss_frozen_head)."""
    up = 4 if e_m < 4 else 0        # `.float()` makes an fp32 copy of low-precision logits (aliases fp32 ones)
    w_cast = V * h * 2 if amp else 0  # autocast's low-precision copy of the head weight
    if loss == "cce":
        bt, bv = _L.cce_blocks(T, V)
        e_in = e_m                   # the embeddings go in the autocast dtype (a copy under AMP)
        saved = [Term("cce: embeddings e (autocast dtype)", "b*s*h*e_m", T * h * e_in, where="head"),
                 Term("cce: per-token log-sum-exp (fp32)", "4*b*s", 4 * T, where="loss")]
        if amp:
            saved.append(Term("cce: classifier c (autocast copy)", "V*h*2", w_cast, where="loss"))
        # forward (measured op by op): the target logits' gather c[targets] and the product e * c[targets]
        # (2*T*h*e_m), or a block's logits and their fp32 copy (logsumexp on the CPU allocates no bt*bv
        # temporary); the loop's last lse block and accumulator (2*bt*4) stay referenced; under AMP the fp32
        # hidden states the embeddings were cast from are alive through the loss (not saved)
        loss_point = ((T * h * e_r if amp else 0) + 2 * bt * 4
                      + max(2 * T * h * e_m, bt * bv * (e_m + up)))
        # backward: grad_e and grad_c made as zeros (T*h*e_m + V*h*e_m) and one block's logits, their fp32
        # copy and logits - lse (bt*bv*(e_m + up + 4)), or d, d*scale and its cast (bt*bv*(8 + up/2));
        # under AMP the grads' casts back to fp32 after the Function's saved copies are released:
        # grad_c in bf16 and fp32 and grad_e in bf16, less the saved set (V*h*4 - 4*T)
        blk_bwd = bt * bv * max(e_m + up + 4, 8 + (e_m if up else 0))
        if softcap is not None:  # the block's high points under the cap (measured: CCE_SOFTCAP_*)
            loss_point += bt * bv * (4 * CCE_SOFTCAP_FWD_WORDS - e_m - up)
            blk_bwd = max(blk_bwd, bt * bv * 4 * CCE_SOFTCAP_BWD_WORDS)
        bwd = T * h * e_m + V * h * e_m + blk_bwd
        if amp:
            bwd = max(bwd, V * h * 4 - 4 * T)
        return FusedLoss(saved, loss_point, bwd, bt,
                         "~+1 head matmul (the backward recomputes each block's logits: +1/3 of the head's "
                         "work; CCE's paper reports no slowdown with its kernels)")
    n = chunk_tokens(loss, T, V, h)
    saved = [Term("chunked-ce: hidden states (checkpoint input)", "b*s*h*e_r", T * h * e_r, where="head")]
    # loss: one chunk's logits, their fp32 copy and the log-softmax output; autocast's head copy is cached
    loss_point = w_cast + n * V * (e_m + up + 4)
    # a soft cap (Gemma 2): `logits = tanh(logits / cap) * cap` keeps the old logits referenced until the
    # assignment, so three n*V*e_m tensors are alive at the product (above the fp32 chunk's old high point);
    # the recomputed chunk's tanh saves its output (n*V*e_m) through the chunk's backward
    tanh_out = n * V * e_m if softcap is not None else 0
    if softcap is not None:
        loss_point = max(loss_point, w_cast + 3 * n * V * e_m)
    # The backward, chunk by chunk from the last (measured op by op, the peak's live tensors listed):
    #   lsm  log_softmax's backward in a recomputed chunk: its saved fp32 output, the nll gradient and its own
    #        output (3*n*V*4); under AMP with the recompute's W copy and another V*h*2 alive (2*w_cast) and
    #        the chunk's bf16 input
    #   mm   (AMP) the matmul's backward: bf16 grad of the logits, grads of the chunk and of W's copy, with the
    #        saved copies (3*w_cast + n*V*2 + 2*n*h*2)
    #   acc  (fp32, pure bf16) W's grad accumulated across chunks out of place (AccumulateGrad's input
    #        buffer): the sum so far, the chunk's grad and the new sum (3*V*h*e_p)
    # each with the hidden chunks' grads held for split's backward ((T - n)*h*e_r)
    grads_h = max(T - n, 0) * h * e_r
    if amp:
        bwd = grads_h + tanh_out + max(2 * w_cast + 3 * n * V * 4 + n * h * 2, 3 * w_cast + n * V * 2 + 2 * n * h * 2)
    else:
        more = T > n  # a W grad from an earlier chunk exists
        bwd = grads_h + max(3 * n * V * 4 + tanh_out + (V * h * e_p if more else 0), 3 * V * h * e_p if more else 0)
    return FusedLoss(saved, loss_point, bwd, n,
                     "~+1/3 of the head's matmul work (each chunk's logits recomputed in backward), "
                     "~0% of the step for a large model")


def fused_loss_frozen_head(loss: str, T: int, V: int, h: int, e_r: int, e_m: int, amp: bool,
                           softcap: float | None = None) -> FusedLoss:
    """The fused losses with a frozen head weight (fine-tuning: LoRA, QLoRA, frozen layers as peft users plug
    it in: the base model's last hidden state and the frozen head weight into the loss). No weight grad: the
    chunk's matmul saves nothing for W and no grad_W is accumulated; CCE makes no grad_c buffer (as
    cut-cross-entropy's cce_backward_kernel: dc only when c.requires_grad). Under autocast a frozen weight's copy
    is not cached (aten autocast_mode.cpp caches only leaves that require grad): each F.linear makes a fresh one,
    freed with the forward's chunk and made again by its recompute (saved for the input's grad)."""
    up = 4 if e_m < 4 else 0
    w_cast = V * h * 2 if amp else 0
    if loss == "cce":
        bt, bv = _L.cce_blocks(T, V)
        saved = [Term("cce: embeddings e (autocast dtype)", "b*s*h*e_m", T * h * e_m, where="head"),
                 Term("cce: per-token log-sum-exp (fp32)", "4*b*s", 4 * T, where="loss")]
        if amp:
            saved.append(Term("cce: classifier c (autocast copy of the frozen head)", "V*h*2", w_cast, where="loss"))
        loss_point = ((T * h * e_r if amp else 0) + 2 * bt * 4
                      + max(2 * T * h * e_m, bt * bv * (e_m + up)))
        # backward: grad_e only (T*h*e_m) and one block's logits, their fp32 copy and logits - lse, or d,
        # d*scale and its cast; under AMP grad_e's cast back to fp32 (T*h*4) once the Function returns
        blk_bwd = bt * bv * max(e_m + up + 4, 8 + (e_m if up else 0))
        if softcap is not None:  # (as in fused_loss_plain)
            loss_point += bt * bv * (4 * CCE_SOFTCAP_FWD_WORDS - e_m - up)
            blk_bwd = max(blk_bwd, bt * bv * 4 * CCE_SOFTCAP_BWD_WORDS)
        bwd = T * h * e_m + blk_bwd
        if amp:
            bwd = max(bwd, T * h * (e_m + 4) - w_cast - 4 * T)
        return FusedLoss(saved, loss_point, bwd, bt,
                         "~+1/2 of the head's matmul work with a frozen head (the backward recomputes each "
                         "block's logits; no weight grad)")
    n = chunk_tokens(loss, T, V, h)
    saved = [Term("chunked-ce: hidden states (checkpoint input)", "b*s*h*e_r", T * h * e_r, where="head")]
    loss_point = n * V * (e_m + up + 4)
    grads_h = max(T - n, 0) * h * e_r
    tanh_out = 0
    if softcap is not None:  # (as in fused_loss_plain: three n*V*e_m at the cap's product; tanh's saved output)
        loss_point = max(loss_point, 3 * n * V * e_m)
        tanh_out = n * V * e_m
    # backward of a recomputed chunk: log_softmax's saved fp32 output, the nll gradient and its own output
    # (3*n*V*4); under AMP the recompute's weight copy beside them
    bwd = grads_h + w_cast + 3 * n * V * 4 + tanh_out
    return FusedLoss(saved, loss_point, bwd, n,
                     "~+1/2 of the head's matmul work with a frozen head (each chunk's logits recomputed in "
                     "backward; no weight grad), ~0% of the step for a large model")


def finetune_fused(cfg, spec, w, terms: list, loss: str) -> tuple[list, int, FusedLoss]:
    """The fine-tuning forward's saved set (planner/estimate/finetune.py finetune_activations) with a fused loss:
    the head's saves (its input when it trains, autocast's weight copy) and the b*s*V log-softmax output
    replaced by the loss's own saves. Returns the terms, the bytes saved for the loss, and the loss's terms."""
    from ..accounting import tensor_inventory
    from ..arch import family_of
    from ..finetune import trainable_names

    keep = trainable_names(family_of(cfg), cfg, spec)  # (None: everything trains)
    head_trains = any(keep is None or t.name in keep for t in tensor_inventory(cfg)
                      if t.kind == "param" and t.role == "head")
    T, V, h = spec.batch_size * spec.seq_len, cfg.vocab_size, cfg.hidden
    e_p = 2 if spec.param_dtype == "bfloat16" else 4
    family = family_of(cfg)
    fused = fused_loss(loss, T, V, h, w.e_r, w.e_m, e_p, w.amp, w_grad=head_trains, softcap=family.logit_softcap(cfg))
    if head_trains and w.amp and loss != "cce":
        # autocast caches the trainable head's copy through the forward and the loss (autocast_cache_bytes
        # counts it once the head's own saved copy is gone); the full-training formula counts it in the loss
        fused.loss_point -= V * h * 2
    if head_trains and w.amp and loss == "cce":
        # the Function saves autocast's cached copy: the cache does not hold another
        fused.saved = [replace(t, name=t.name + " (trains: autocast-cached)") if t.name.startswith("cce: classifier c")
                       else t for t in fused.saved]
    kept = [t for t in terms if not (t.where == "loss" or t.name.startswith(HEAD_SAVES))]
    kept += fused.saved
    return kept, sum(t.bytes for t in fused.saved if t.where == "loss"), fused
