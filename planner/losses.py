"""The loss kernels that never hold the b*s*V logits whole (issue #24; no torch): their names and chunk sizes.

`--loss chunked-ce[:N]`  cross-entropy over chunks of N tokens: each chunk's logits are computed from the final
                         hidden states and the head weight inside torch.utils.checkpoint (use_reentrant=False),
                         so the forward keeps nothing of a chunk but its loss and backward recomputes one
                         chunk's logits at a time. The chunking follows Liger-Kernel's
                         LigerFusedLinearCrossEntropyFunction (src/liger_kernel/ops/fused_linear_cross_entropy.py:
                         logits per chunk from hidden @ W.T); the gradient comes from a per-chunk checkpoint (one
                         more head matmul per chunk in backward) where Liger computes it inside the forward.
                         torchtune's CEWithChunkedOutputLoss is not followed: its chunks are the model's own
                         output, so every chunk's logits exist at once (it saves only the fp32 upcast).
`--loss cce`             Cut Cross-Entropy's algorithm (apple/ml-cross-entropy, arXiv 2411.09009): the forward
                         computes each token's log-sum-exp block by block (tokens x vocabulary) and keeps only
                         it (b*s fp32); the backward recomputes each block's logits and adds its part of the
                         hidden states' and the head's gradients. cut-cross-entropy 25.1.1's only non-Triton path
                         (torch_compile.py) computes e @ c.T whole, so on the CPU a plain-torch equivalent of the
                         Triton kernels' algorithm runs here (planner/models/losses.py); the library's own run
                         is left to the CUDA check.
"""
from __future__ import annotations

import re

from .validation import ConfigError

FUSED_LOSSES = ("chunked-ce", "cce")
_CHUNKED_RE = re.compile(r"^chunked-ce(?::(\d+))?$")
# CCE's plain-torch blocks: tokens x vocabulary entries per block. The Triton kernels' blocks are 16..256 wide
# (cce_lse_forward.py / cce_backward.py autotune); plain torch on the CPU pays a Python loop per block, so larger
# blocks of the same algorithm: each block's transients are at most a few CCE_BLOCK_TOKENS*CCE_BLOCK_VOCAB floats.
CCE_BLOCK_TOKENS = 256
CCE_BLOCK_VOCAB = 4096


def is_fused(loss: str) -> bool:
    """True for a loss that takes the hidden states and the head weight (never the whole logits)."""
    return loss == "cce" or bool(_CHUNKED_RE.match(loss or ""))


def check_loss(loss: str) -> None:
    m = _CHUNKED_RE.match(loss)
    if loss.startswith("chunked-ce") and (m is None or (m.group(1) is not None and int(m.group(1)) <= 0)):
        raise ConfigError(f"--loss chunked-ce takes an optional positive chunk size in tokens "
                          f"(chunked-ce:N), got {loss!r}")


def liger_chunk_tokens(n_tokens: int, vocab: int, hidden: int) -> int:
    """Liger-Kernel's chunk size (fused_linear_cross_entropy.py): inc_factor = cdiv(V, H); chunk_size =
    next_power_of_2(cdiv(BT, inc_factor)), so one chunk's logits are about as large as the hidden states."""
    inc = -(-vocab // hidden)
    c = -(-n_tokens // inc)
    return 1 << max(c - 1, 0).bit_length()


def chunk_tokens(loss: str, n_tokens: int, vocab: int, hidden: int) -> int:
    """Tokens per chunk of a chunked-ce loss (N given, or Liger's rule), at most the b*s tokens there are."""
    m = _CHUNKED_RE.match(loss)
    n = int(m.group(1)) if m and m.group(1) else liger_chunk_tokens(n_tokens, vocab, hidden)
    return min(n, n_tokens)


def cce_blocks(n_tokens: int, vocab: int) -> tuple[int, int]:
    return min(CCE_BLOCK_TOKENS, n_tokens), min(CCE_BLOCK_VOCAB, vocab)


def cuda_amp_cross_entropy(spec, w, loss_kind: str) -> bool:
    """F.cross_entropy on the autocast-dtype logits under CUDA autocast (spec: a TrainSpec; w: its Widths,
    planner/arch/terms.py). cross_entropy_loss is on the CPU's fp32 autocast list but not on CUDA's, so on CUDA it
    runs in its composite form (aten/src/ATen/native/LossNLL.cpp cross_entropy_loss:
    nll_loss_nd(log_softmax(self, class_dim, self.scalar_type()), ...)): log_softmax with an
    explicit dtype keeps the logits' e_m (fp32_set_opt_dtype leaves a given dtype alone), and nll_loss, on CUDA's
    fp32 list (autocast_mode.cpp KERNEL_CUDA(nll_loss, fp32)), saves autocast's fp32 copy of that output. Measured
    on an H200 (tests/data/cuda/2026-11-27-h200, explain.jsonl.gz: the book's GPT-2 V1000 h120 b3 s200 fp16-AMP,
    (loss): _log_softmax fp16 (b*s, V) and _to_copy fp32 (b*s, V) saved; the backward's top at nll_loss_backward's
    fp32 output, before NllLossBackward releases the fp32 copy)."""
    return spec.device_type == "cuda" and w.amp and loss_kind == "cross-entropy"
