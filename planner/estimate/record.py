"""The estimate's record and the backward sweep's context, shared by every estimator (no torch).

TrainEstimate has the keys of the measured record (planner/measure/training.py), so the two compare field
by field; SweepContext is what the backward sweep knows at a block, for a family's in-block high points
(planner/arch/<family>.py block_points).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
    categories: dict[str, dict] = field(default_factory=dict)  # per phase, by category (estimate/categories.py)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SweepContext:
    """What the backward sweep knows at a block, for the family's in-block high points (bytes unless
    said): `current` the block's saved set and its autocast weight copies; `mlp_saved` and
    `norm_mlp_saved` the parts its MLP and pre-MLP norm saved; `casts_mlp` the MLP's weight copies;
    `g` bytes per parameter of the grads this backward creates (0 when they exist already: a later
    micro-batch); `pending` one MLP weight's grad computed before it is added in place (that case);
    counts of parameters (`*_n`) by role; `norm_attn_saved` / `attn_in_saved` what the block's input
    norm and its attention input projections saved; after the loss: `saved_after_loss`, `casts_head`,
    `grads_last`."""
    b: int
    s: int
    h: int
    L: int
    bsh: int
    e_p: int
    g: int
    pending: int
    current: int
    mlp_saved: int
    norm_mlp_saved: int
    casts_mlp: int
    mlp_n: int
    down_n: int
    attn_n: int
    saved_after_loss: int
    casts_head: int
    grads_last: int
    block_n: int
    norm_attn_n: int
    norm_attn_saved: int
    attn_in_saved: int
    mlp_in_weight: int
    attn_in_n: int = 0
    first: bool = False      # the first block (the last one backward reaches): shared inputs die in it
    rope_bytes: int = 0      # saved tensors shared by all blocks (RoPE's cos/sin), freed by the first block
    post_mlp_saved: int | None = None  # a norm after the MLP (Gemma 2's post-feedforward norm): what it saved
    post_attn_saved: int | None = None  # a norm after the attention (Gemma 2's post-attention norm): the same
    # in this step (fine-tuning's own set); None: the family's full-training set
    block_terms: tuple = ()  # the block's saved Terms (names, parts) in this step, for a family's point that
    # depends on what exactly is saved (planner/arch/moe.py's recompute point)
