"""`--gpu` and the compute fields of `estimate train|infer --json` (issue #35): flops_per_step, and with a GPU of the
catalog the roofline's step_time_s and tokens_per_s (planner/estimate/compute.py, planner/gpus.py)."""
from __future__ import annotations

import argparse


def _add_gpu(p: argparse.ArgumentParser) -> None:
    from ..gpus import GPUS

    p.add_argument("--gpu", metavar="NAME", default=None,
                   help="price the step on this GPU (planner/gpus.py: " + ", ".join(GPUS) + "): step_time_s and "
                        "tokens_per_s from a roofline over its published peaks (not a measurement; default: none, no time is priced)")


def compute_fields(cfg, spec, gpu_name, infer: bool = False) -> dict:
    """`flops_per_step` (planner/estimate/compute.py: what FlopCounterMode counts on the step), and with --gpu the
    roofline's `step_time_s` and `tokens_per_s` (issue #35). A bad GPU name: ConfigError (exit 2)."""
    from ..estimate import compute
    from ..gpus import gpu as lookup

    g = lookup(gpu_name) if gpu_name else None
    if infer:
        out = {"flops_per_step": compute.infer_flops(cfg, spec)["flops_per_step"]}
        priced = compute.price_infer(cfg, spec, g) if g else None
    else:
        out = {"flops_per_step": compute.train_flops(cfg, spec)["flops_per_step"]}
        priced = compute.price(cfg, spec, g) if g else None
    if priced:
        out.update({"gpu": g.name, "step_time_s": priced["step_time_s"], "tokens_per_s": priced["tokens_per_s"],
                    "step_time_basis": priced["basis"],
                    "step_time_parts": {k: v["time_s"] for k, v in priced["parts"].items()}})
    return out
