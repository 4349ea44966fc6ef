"""Will it fit, and what do I change so it fits? (no torch; every answer comes from estimate_training)

max_batch_size / max_seq_len bisect on the estimated peak (which grows with batch and sequence). advice()
evaluates each single change and the useful combinations, and ranks those that fit by their cost.
"""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from dataclasses import dataclass

from .config import ConfigError, ModelConfig
from .estimate.training import estimate_training
from .spec import TrainSpec

# Cost rank of each change, cheapest first, and what it costs. The order is this project's judgement:
# free > same maths but slower > more compute > lower precision > a different optimizer > a different task.
CHANGES = {
    "sdpa": (0, "none: the same attention maths in a fused kernel (no s x s tensors)"),
    "grad-accum": (1, "same gradients; smaller micro-batches run slower per sample (smaller matmuls)"),
    "checkpointing": (2, "recomputes each block's forward in backward: ~1 extra forward per step"),
    "bf16-amp": (3, "matmuls in bf16 (8-bit mantissa); fp32 master weights keep updates exact; usually no loss change"),
    "fp16-amp": (4, "matmuls in fp16 with dynamic loss scaling (GradScaler); overflow-skipped steps possible"),
    "sgd-momentum": (5, "a different optimizer: needs its own learning rate; often slower to converge than AdamW"),
    "bf16": (6, "weights, grads and optimizer states in bf16: updates below ~1/256 of a weight are lost"),
    "shorter-seq": (7, "less context per sample: the model learns shorter dependencies"),
}


@dataclass
class Option:
    changes: list[str]
    spec: dict
    attention: str
    peak_bytes: int
    fits: bool
    cost_rank: int
    cost: str


def _peak(cfg: ModelConfig, spec: TrainSpec) -> int:
    return estimate_training(cfg, spec).peak_bytes


def max_batch_size(cfg: ModelConfig, spec: TrainSpec, budget: int, limit: int = 1 << 20) -> tuple[int, str]:
    """The largest batch whose estimated peak fits `budget` (spec.batch_size is ignored); 0 with the reason."""
    at = lambda b: _peak(cfg, dataclasses.replace(spec, batch_size=b))
    if at(1) > budget:
        one = estimate_training(cfg, dataclasses.replace(spec, batch_size=1))
        fixed = one.params_bytes + one.buffers_bytes + one.optimizer_bytes + one.grads_bytes
        why = ("the weights, grads and optimizer states alone" if fixed > budget
               else "batch 1 (its activations and transients)")
        return 0, f"{why} need more than the budget: peak at batch 1 is {one.peak_bytes:,} B > {budget:,} B"
    lo, hi = 1, 2
    while hi <= limit and at(hi) <= budget:
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) <= budget else (lo, mid)
    return lo, f"batch {lo + 1} would need {at(lo + 1):,} B" if lo < limit else "search limit reached"


def max_seq_len(cfg: ModelConfig, spec: TrainSpec, budget: int) -> tuple[int, str]:
    """The longest sequence (up to the model's context) whose estimated peak fits at spec.batch_size."""
    at = lambda s: _peak(cfg, dataclasses.replace(spec, seq_len=s))
    if at(1) > budget:
        return 0, f"even a sequence of 1 needs {at(1):,} B > {budget:,} B"
    lo, hi = 1, cfg.max_seq_len + 1
    if at(cfg.max_seq_len) <= budget:
        return cfg.max_seq_len, "the model's full context fits"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) <= budget else (lo, mid)
    return lo, f"seq_len {lo + 1} would need {at(lo + 1):,} B"


def _variants(cfg: ModelConfig, spec: TrainSpec, budget: int):
    """(changes, spec, attention) for each single change and the useful pairs."""
    singles = []
    if cfg.attention == "eager":
        singles.append((["sdpa"], spec, "sdpa"))
    for k in (2, 4, 8, 16):
        if spec.batch_size % k == 0:
            singles.append((["grad-accum"], dataclasses.replace(spec, batch_size=spec.batch_size // k,
                                                                  grad_accum=spec.grad_accum * k), cfg.attention))
    if not spec.checkpointing:
        singles.append((["checkpointing"], dataclasses.replace(spec, checkpointing=True), cfg.attention))
    for prec in ("bf16-amp", "fp16-amp", "bf16"):
        if spec.precision != prec:
            singles.append(([prec], dataclasses.replace(spec, precision=prec), cfg.attention))
    if spec.optimizer in ("adam", "adamw"):
        singles.append((["sgd-momentum"], dataclasses.replace(spec, optimizer="sgd-momentum"), cfg.attention))
    s, _ = max_seq_len(cfg, spec, budget)
    if 0 < s < spec.seq_len:
        singles.append((["shorter-seq"], dataclasses.replace(spec, seq_len=s), cfg.attention))
    out = list(singles)
    base = [v for v in singles if v[0][0] in ("sdpa", "checkpointing", "bf16-amp")]
    for i, a in enumerate(base):
        for b in base[i + 1:]:
            merged = dataclasses.replace(b[1], checkpointing=a[1].checkpointing or b[1].checkpointing)
            out.append((a[0] + b[0], merged, "sdpa" if "sdpa" in a[0] + b[0] else cfg.attention))
    if len(base) == 3:
        out.append((["sdpa", "checkpointing", "bf16-amp"],
                    dataclasses.replace(spec, checkpointing=True, precision="bf16-amp"), "sdpa"))
    return out


def advice(cfg: ModelConfig, spec: TrainSpec, budget: int, costs: dict[str, float] | None = None) -> list[Option]:
    """Every option with its peak, whether it fits, and its cost; those that fit first, cheapest first.

    costs: step-time ratios measured here (measure_costs); when both are known, checkpointing and gradient
    accumulation are ranked by them instead of by the static order in CHANGES."""
    costs = costs or {}
    rank = {c: r for c, (r, _) in CHANGES.items()}
    if "checkpointing" in costs and "grad-accum" in costs and costs["checkpointing"] < costs["grad-accum"]:
        rank["checkpointing"], rank["grad-accum"] = rank["grad-accum"], rank["checkpointing"]
    options = []
    for changes, new_spec, attention in _variants(cfg, spec, budget):
        peak = _peak(dataclasses.replace(cfg, attention=attention), new_spec)
        words = []
        for c in changes:
            text = CHANGES[c][1]
            if c in costs:
                what = "2 micro-batches of half the batch, " if c == "grad-accum" else ""
                text += (f" (measured here, {what}2-block proxy: step time x{costs[c]:.2f})" if costs[c] >= 1.02
                         else f" (measured here, {what}2-block proxy: within timing noise)")
            if c == "grad-accum":
                text += f" ({new_spec.grad_accum} micro-batches of {new_spec.batch_size})"
            if c == "shorter-seq":
                text += f" (seq_len {new_spec.seq_len} instead of {spec.seq_len})"
            words.append(f"{c}: {text}")
        options.append(Option(changes=changes, spec=dataclasses.asdict(new_spec), attention=attention,
                              peak_bytes=peak, fits=peak <= budget,
                              cost_rank=sum(rank[c] + 1 for c in changes), cost="; ".join(words)))
    options.sort(key=lambda o: (not o.fits, o.cost_rank, o.peak_bytes))
    return options


def default_budget(device: str) -> tuple[int, str]:
    """The GPU's total memory minus the CUDA context (nvidia-smi), else the RAM available now."""
    if device.startswith("cuda"):
        from .estimate.training import CUDA_CONTEXT_BYTES

        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise ConfigError("no GPU memory figure here (nvidia-smi not found): give --budget")
        index = device.split(":")[1] if ":" in device else "0"
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", index],
                             capture_output=True, text=True, timeout=10)
        if out.returncode:
            raise ConfigError(f"nvidia-smi could not read GPU {index}: give --budget")
        total = int(out.stdout.strip().splitlines()[0]) * 2**20
        return total - CUDA_CONTEXT_BYTES, "GPU memory (nvidia-smi) minus the CUDA context estimate"
    import psutil

    return psutil.virtual_memory().available, "RAM available now"


def measure_costs(cfg: ModelConfig, spec: TrainSpec, timeout_s: float = 300) -> dict[str, float]:
    """Step-time ratios measured here on a 2-block proxy of the model (same widths, the run's batch and
    sequence, scaled down until the proxy's peak is under 2 GiB): checkpointing over plain, and two
    micro-batches of half the batch over one full batch. This machine's costs, not a rule of thumb."""
    from .arch import family_of
    from .config import config_to_dict
    from .runner import run_worker

    proxy = family_of(cfg).with_layers(cfg, 2)
    base = dataclasses.replace(spec, grad_accum=1, device="cpu")
    while _peak(proxy, base) > 2 * 2**30 and (base.batch_size > 1 or base.seq_len > 64):
        base = (dataclasses.replace(base, batch_size=base.batch_size // 2) if base.batch_size > 1
                else dataclasses.replace(base, seq_len=base.seq_len // 2))
    variants = {"plain": base, "checkpointing": dataclasses.replace(base, checkpointing=True)}
    if base.batch_size >= 2:
        variants["grad-accum"] = dataclasses.replace(base, batch_size=base.batch_size // 2, grad_accum=2)
    times = {}
    for name, run in variants.items():
        out = run_worker({"config": config_to_dict(proxy), "spec": dataclasses.asdict(run)}, timeout_s=timeout_s)
        if out.exit_code:
            return {}
        times[name] = out.record["step_time_s"]
    return {k: v / times["plain"] for k, v in times.items() if k != "plain" and times["plain"] > 0}


def gpu_info() -> dict | None:
    """The first GPU's name and memory from nvidia-smi (no torch import), or None on a CPU-only machine."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode or not out.stdout.strip():
        return None
    name, total = out.stdout.strip().splitlines()[0].rsplit(",", 1)
    return {"name": name.strip(), "total_bytes": int(total) * 2**20}


def fit_report(cfg, spec, budget: int, batch_given: bool, costs: dict | None = None) -> dict:
    """The fit answer as the CLI prints it and the app shows it (one place, so both agree)."""
    rec: dict = {"budget_bytes": budget}
    if batch_given:
        rec["max_seq_len"], rec["reason"] = max_seq_len(cfg, spec, budget)
        target = spec
    else:
        rec["max_batch_size"], rec["reason"] = max_batch_size(cfg, spec, budget)
        # To go bigger: what would double the largest batch (or make batch 1 fit).
        target = dataclasses.replace(spec, batch_size=max(1, 2 * rec["max_batch_size"]))
    rec["run"] = dataclasses.asdict(target)
    rec["peak_bytes"] = estimate_training(cfg, target).peak_bytes
    rec["fits"] = rec["peak_bytes"] <= budget
    rec["advice"] = [dataclasses.asdict(o) for o in advice(cfg, target, budget, costs)]
    if costs:
        rec["measured_costs"] = costs
    return rec
