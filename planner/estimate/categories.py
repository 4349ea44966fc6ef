"""The estimate's `categories` block (issue #19 item 3): per phase, the bytes by the category names the measured
and simulated records use (planner/measure/export.py phase_categories, MemTracker's names: parameter, buffer,
inputs, optimizer state, gradient, activation, temporary), from the estimate's own figures (no torch).

What the estimate splits exactly, phase by phase:
  - parameter, buffer, inputs, optimizer state (with fp16's GradScaler state): the same in every phase;
  - gradient: in the forward and the loss the earlier micro-batches' grads (gradient accumulation) else none
    (TrainingStep zeroes them with set_to_none); at the optimizer step and zero_grad every trainable grad;
  - optimizer: its step's temporaries (the for-loop's or foreach's), no activation;
  - zero_grad: no activation, no temporary.
In the forward, the loss and the backward the estimate's high point is one sum of saved and transient tensors
(planner/estimate/training.py, finetune.py: the phase dict's max of named points), so there `activation` and
`temporary` are None and `activation and temporary` holds their sum (in the backward, whose sweep makes the
grads as it goes, `gradient, activation and temporary`); `total` is the phase's peak.
"""
from __future__ import annotations

PERSISTENT = ("parameter", "buffer", "inputs", "optimizer state")


def estimate_categories(est, spec) -> dict[str, dict[str, int | None]]:
    """Phase -> category -> bytes (None where the estimate does not split the phase's high point)."""
    persistent = {"parameter": est.params_bytes, "buffer": est.buffers_bytes, "inputs": est.inputs_bytes,
                  "optimizer state": est.optimizer_bytes + est.transients.get("gradscaler", 0)}
    base = sum(persistent.values())
    accum = est.grads_bytes if getattr(spec, "grad_accum", 1) > 1 else 0
    out = {}
    for phase, total in est.phase_peak_bytes.items():
        row = dict(persistent)
        if phase in ("optimizer", "zero_grad"):
            tmp = est.transients.get("optimizer_temporaries", 0) if phase == "optimizer" else 0
            row.update({"gradient": est.grads_bytes, "activation": 0, "temporary": tmp})
        elif phase in ("forward", "loss"):
            row.update({"gradient": accum, "activation": None, "temporary": None,
                        "activation and temporary": total - base - accum})
        else:  # the backward sweep makes grads as it goes: its point is one sum
            row.update({"gradient": None, "activation": None, "temporary": None,
                        "gradient, activation and temporary": total - base})
        row["total"] = total
        out[phase] = row
    return out
