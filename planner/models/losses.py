"""The fused losses' real code (planner/losses.py says what each is and whom it follows): the model's final
hidden states and its head weight in, a mean cross-entropy out; the b*s*V logits never exist whole. Beside the
models (torch, no planner registry), so the family files can call them from their loss methods."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .. import losses as _L
from ..losses import chunk_tokens


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                softcap: float | None = None) -> torch.Tensor:
    """One chunk: its logits (F.linear: autocast casts to the low-precision dtype), soft-capped per chunk when
    the model soft-caps its logits (Gemma 2: Gemma2ForCausalLM's logits / cap, tanh, * cap, in the logits'
    dtype; Liger's fused linear cross-entropy applies its softcap the same way, per chunk), upcast to fp32 as
    transformers' ForCausalLMLoss and torchtune do, summed cross-entropy."""
    logits = F.linear(hidden, weight)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, loss: str,
                          softcap: float | None = None) -> torch.Tensor:
    """Mean cross-entropy over chunks of N tokens, each chunk under torch.utils.checkpoint (non-reentrant):
    the forward saves only the chunk's inputs; the backward recomputes its logits, one chunk at a time."""
    h = hidden.flatten(0, -2)
    t = targets.flatten()
    n = chunk_tokens(loss, h.shape[0], weight.shape[0], weight.shape[1])
    total = None
    for hc, tc in zip(h.split(n), t.split(n)):
        part = checkpoint(_chunk_loss, hc, weight, tc, softcap, use_reentrant=False)
        total = part if total is None else total + part
    return total / h.shape[0]


class _CutCrossEntropy(torch.autograd.Function):
    """Cut Cross-Entropy (arXiv 2411.09009, Algorithms 1-3) in plain torch: the forward keeps each token's
    log-sum-exp over the vocabulary (computed block by block, online) and the target logit (an indexed dot
    product); the backward recomputes each (token, vocabulary) block's logits, softmax minus the one-hot
    target, and adds its part to grad_e (tokens x h) and grad_c (V x h), each only when its input requires grad
    (a frozen head: no grad_c, as the library). Nothing V-wide is saved."""

    @staticmethod
    def forward(ctx, e, c, targets, softcap=None):
        bt, bv = _L.cce_blocks(e.shape[0], c.shape[0])
        lse = torch.empty(e.shape[0], dtype=torch.float32, device=e.device)
        for i in range(0, e.shape[0], bt):
            acc = None
            for j in range(0, c.shape[0], bv):
                x = (e[i:i + bt] @ c[j:j + bv].T).float()
                if softcap is not None:  # cce_lse_forward.py: tanh(x / softcap) * softcap on each block
                    x = torch.tanh(x / softcap) * softcap
                blk = x.logsumexp(-1)
                del x
                acc = blk if acc is None else torch.logaddexp(acc, blk)
            lse[i:i + bt] = acc
        target_logit = (e * c[targets]).sum(-1).float()  # indexed_dot.py: e_i . c_{x_i}
        if softcap is not None:  # cce.py: the target logit soft-capped too
            target_logit = torch.tanh(target_logit / softcap) * softcap
        ctx.softcap = softcap
        ctx.save_for_backward(e, c, targets, lse)
        return (lse - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        e, c, targets, lse = ctx.saved_tensors
        bt, bv = _L.cce_blocks(e.shape[0], c.shape[0])
        scale = grad / e.shape[0]
        # as cce_backward_kernel (cce_backward.py): a gradient buffer only for an input that requires grad
        # (a frozen head under LoRA / QLoRA / frozen layers gets none)
        grad_e = torch.zeros_like(e) if ctx.needs_input_grad[0] else None
        grad_c = torch.zeros_like(c) if ctx.needs_input_grad[1] else None
        for i in range(0, e.shape[0], bt):
            ei, ti = e[i:i + bt], targets[i:i + bt]
            for j in range(0, c.shape[0], bv):
                if ctx.softcap is None:
                    d = ((ei @ c[j:j + bv].T).float() - lse[i:i + bt, None]).exp_()
                else:  # cce_backward.py: the softmax of the capped logits times the cap's derivative 1 - tanh^2
                    th = torch.tanh((ei @ c[j:j + bv].T).float() / ctx.softcap)
                    d = (th * ctx.softcap - lse[i:i + bt, None]).exp_()
                hit = (ti >= j) & (ti < j + bv)
                rows = torch.arange(d.shape[0], device=d.device)
                d[rows, (ti - j).clamp(0, d.shape[1] - 1)] -= hit.to(d.dtype)  # minus the one-hot target
                if ctx.softcap is not None:
                    d = d * (1 - th * th)
                    del th
                d = (d * scale).to(e.dtype)
                if grad_e is not None:
                    grad_e[i:i + bt] += d @ c[j:j + bv]
                if grad_c is not None:
                    grad_c[j:j + bv] += d.T @ ei
        return grad_e, grad_c, None, None


def cut_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                      softcap: float | None = None) -> torch.Tensor:
    """As a user calls cut-cross-entropy's linear_cross_entropy(e, c, targets): under autocast the embeddings
    and the classifier go in the autocast dtype (the library runs its kernels in the inputs' dtype)."""
    e = hidden.flatten(0, -2)
    dev = e.device.type
    c = weight
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        e, c = e.to(dt), c.to(dt)
    with torch.autocast(dev, enabled=False):
        return _CutCrossEntropy.apply(e, c, targets.flatten(), softcap)


def fused_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, loss: str,
               softcap: float | None = None) -> torch.Tensor:
    """softcap: the model's final-logit soft cap (Gemma 2), applied as linear_cross_entropy(..., softcap=)
    applies it (cce) or per chunk (chunked-ce); None for the models that do not cap."""
    if loss == "cce":
        return cut_cross_entropy(hidden, weight, targets, softcap)
    return chunked_cross_entropy(hidden, weight, targets, loss, softcap)
