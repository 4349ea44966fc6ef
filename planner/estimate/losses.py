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

from dataclasses import dataclass

from ..arch.terms import Term
from .. import losses as _L
from ..losses import chunk_tokens


@dataclass
class FusedLoss:
    saved: list            # Terms: the loss's saved tensors (replace the head input and ce_saved)
    loss_point: int        # loss-phase transients on top of the saved set
    backward_point: int    # the loss backward's high point on top of the saved set (grads of W included)
    chunk: int             # tokens a chunk (chunked-ce) or a block (cce)
    compute: str


def fused_loss(loss: str, T: int, V: int, h: int, e_r: int, e_m: int, e_p: int, amp: bool) -> FusedLoss:
    """T = b*s tokens, V vocabulary, h hidden; e_r the hidden states' width, e_m the matmul's (2 under AMP),
    e_p the weights' and grads'."""
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
        bwd = grads_h + max(2 * w_cast + 3 * n * V * 4 + n * h * 2, 3 * w_cast + n * V * 2 + 2 * n * h * 2)
    else:
        more = T > n  # a W grad from an earlier chunk exists
        bwd = grads_h + max(3 * n * V * 4 + (V * h * e_p if more else 0), 3 * V * h * e_p if more else 0)
    return FusedLoss(saved, loss_point, bwd, n,
                     "~+1/3 of the head's matmul work (each chunk's logits recomputed in backward), "
                     "~0% of the step for a large model")
