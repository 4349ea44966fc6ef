"""Saved activations of one forward pass, term by term (no torch).

Each term is a group of tensors autograd saves for backward, with its formula. The coefficients come
from a saved-tensor inventory (torch.autograd.graph.saved_tensors_hooks, deduplicated by storage) of
the real models in planner.models, at several shapes, for every precision and attention mode; the
accuracy benchmark (`python -m planner bench accuracy`) holds the sum to the measured peak.

Symbols: b batch, s sequence, h hidden, a heads, d head dim, f FFN width, V vocab, c context length,
L layers. Byte widths: e_r residual stream (the weights' dtype: embeddings output it), e_m matmul
inputs/outputs (the autocast dtype under AMP, else e_r), e_ce the loss (fp32 under CPU autocast,
where cross_entropy is on the fp32 list), e_k dropout keep-mask (fp32 noise on CPU, 1-byte bool on CUDA).
"""
from __future__ import annotations

from ..arch.terms import Term, Widths  # re-exported: the estimators' names for them


def block_terms(cfg, spec: TrainSpec, w: Widths) -> list[Term]:
    """One block's saved tensors, from the config's architecture file (planner/arch)."""
    from ..arch import family_of

    return family_of(cfg).block_terms(cfg, spec, w)


def outside_terms(cfg, spec: TrainSpec, w: Widths) -> list[Term]:
    """Saved tensors outside the blocks, from the config's architecture file (planner/arch)."""
    from ..arch import family_of

    return family_of(cfg).outside_terms(cfg, spec, w)
