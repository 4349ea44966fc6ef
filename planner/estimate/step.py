"""The step's phases, built once for every mode (issue #19 item 1; no torch).

One training step, as planner.measure.training's tracker splits it (research/pytorch-memory-facts.md 1.1-1.6):
  forward    the persistent base + what the forward holds at its high point (saved activations, logits, ...)
  loss       the base + the loss's high point
  backward   the base + the largest of the backward's candidates (the cross-entropy's backward, the sweep's
             in-block high points, every grad at its end, ...)
  optimizer  the base + the grads + optimizer.step()'s temporaries
  zero_grad  the base + the grads
The peak is the largest phase (the first of equal ones, in that order) and its phase is reported with it.

Every mode supplies its own terms to `Step` and gets its phases from `phases`: full training
(planner/estimate/training.py), fine-tuning masks (frozen layers, LoRA: finetune.py; a family whose block is
not the decoder's, the book's GPT-2: its planner/arch file's `finetune_step`), a quantized base (quantized.py,
through `shifted`), and data / tensor parallelism per rank (distributed.py: a rank's own base and candidates,
or the single-device phases `shifted` by what the rank adds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .record import TrainEstimate

PHASES = ("forward", "loss", "backward", "optimizer", "zero_grad")  # the tracker's order (planner/measure)


@dataclass
class Step:
    """A step's terms, in bytes: `base` is alive in every phase (weights, buffers, the batch, optimizer state,
    GradScaler; FSDP: a rank's shards); forward / loss are the high points above it; backward the candidates
    above it (the largest wins); `grads` the .grad tensors alive after the backward; `every_phase` what every
    phase adds besides (CUDA: the allocator's rounding and the cuBLAS workspace, planner/estimate/training.py)."""
    base: int
    grads: int
    forward: int
    loss: int
    backward: list[int] = field(default_factory=list)
    optimizer_tmp: int = 0
    every_phase: int = 0


def phases(step: Step) -> dict[str, int]:
    """Live bytes at each phase's high point (module doc)."""
    base = step.base
    phase = {
        "forward": base + step.forward,
        "loss": base + step.loss,
        "backward": base + max(step.backward),
        "optimizer": base + step.grads + step.optimizer_tmp,
        "zero_grad": base + step.grads,
    }
    if step.every_phase:
        for k in phase:
            phase[k] += step.every_phase
    return phase


def peak(phase: dict[str, int]) -> tuple[str, int]:
    """(phase, bytes) of the largest phase; the first of equal ones."""
    name = max(phase, key=phase.get)
    return name, phase[name]


def shifted(phase: dict[str, int], every: int = 0, forward: int = 0, loss: int = 0, after_backward: int = 0,
            backward_at_least: tuple[int, ...] = ()) -> dict[str, int]:
    """Another step's phases with a mode's own terms on top: `every` added to each phase (a quantized base's
    weights, a mesh's rank map, DDP's buckets), `forward` / `loss` to those phases, `after_backward` to the
    optimizer and zero_grad phases (grads held differently), and backward raised to new candidates (absolute)."""
    out = {k: v + every for k, v in phase.items()}
    out["forward"] += forward
    out["loss"] += loss
    for k in ("optimizer", "zero_grad"):
        out[k] += after_backward
    if backward_at_least:
        out["backward"] = max(out["backward"], *backward_at_least)
    return out


def record(step: Step, *, params: int, buffers: int, inputs: int, optimizer: int, activations: int,
           transients: dict[str, int], terms: list[dict], notes: list[str],
           backward_points: dict[str, int]) -> TrainEstimate:
    """The single-device record (planner/estimate/record.py: the measured record's keys) of a step."""
    phase = phases(step)
    peak_phase, peak_bytes = peak(phase)
    return TrainEstimate(
        params_bytes=params, buffers_bytes=buffers, inputs_bytes=inputs, grads_bytes=step.grads,
        optimizer_bytes=optimizer, activations_bytes=activations, peak_bytes=peak_bytes,
        peak_phase=peak_phase, phase_peak_bytes=phase, transients=transients, terms=terms, notes=notes,
        backward_points=backward_points)
