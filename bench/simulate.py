"""`python -m planner bench simulate`: the formula (planner.estimate.training) against a simulation of the real
step on fake tensors (planner.measure.simulate) for every preset at realistic full-size settings, on any machine.

Each row runs in a fresh child (planner.runner.run_worker, payload kind "simulate"), so its time and peak RSS
are the simulator's own (torch's import included). No torch in this process.
"""
from __future__ import annotations

import datetime
import platform
from dataclasses import asdict

from planner.config import PRESETS, config_to_dict
from planner.estimate.training import estimate_training
from planner.spec import TrainSpec

FORMULA_BAR_PCT = 1.0  # issue #11: the formula within 1% of the simulation at full size

# One or two realistic runs per preset: the sizes people train at, the precisions and memory savers they use.
FULL_SIZE_ROWS: list[tuple[str, TrainSpec]] = [
    ("gpt2-small", TrainSpec(8, 1024, "fp32", "adamw")),
    ("gpt2-medium", TrainSpec(4, 1024, "bf16-amp", "adamw", checkpointing=True)),
    ("gpt2-large", TrainSpec(4, 1024, "fp16-amp", "adamw")),
    ("gpt2-xl", TrainSpec(2, 1024, "fp32", "adamw")),
    ("gpt2-xl", TrainSpec(1, 1024, "bf16-amp", "adamw")),
    ("tinyllama-1.1b", TrainSpec(4, 2048, "bf16-amp", "adamw")),
    ("llama-3.2-1b", TrainSpec(4, 2048, "bf16-amp", "adamw", checkpointing=True)),
    ("llama-2-7b", TrainSpec(1, 4096, "bf16", "adamw", checkpointing=True)),
    ("llama-3-8b", TrainSpec(1, 4096, "bf16", "adamw")),
    ("llama-3-8b", TrainSpec(1, 4096, "bf16-amp", "adamw")),
    # One per other Hugging Face family (issue #11 item 5), at a size people fine-tune or pre-train them.
    ("mistral-7b-v0.1", TrainSpec(1, 4096, "bf16", "adamw", checkpointing=True)),
    ("qwen2.5-0.5b", TrainSpec(4, 2048, "bf16-amp", "adamw")),
    ("qwen3-8b", TrainSpec(1, 4096, "bf16", "adamw", checkpointing=True)),
    ("gemma-2b", TrainSpec(2, 2048, "bf16-amp", "adamw", checkpointing=True)),
    ("gemma-2-2b", TrainSpec(1, 2048, "bf16", "adamw")),
    ("phi-3-mini-4k", TrainSpec(1, 4096, "bf16", "adamw", checkpointing=True)),
    ("hf-gpt2", TrainSpec(8, 1024, "fp32", "adamw")),
    ("hf-gpt2-xl", TrainSpec(1, 1024, "bf16-amp", "adamw")),
    # The sparse MoE families (issue #20 item 2): pure bf16 with checkpointing (the combine's fp32 weighted product
    # under Mixtral's fp32 routing weights) and bf16-AMP (the experts in fp32, the shared expert's gate).
    ("mixtral-8x7b", TrainSpec(1, 4096, "bf16", "adamw", checkpointing=True)),
    ("qwen1.5-moe-a2.7b", TrainSpec(1, 4096, "bf16-amp", "adamw", checkpointing=True)),
    ("qwen3-30b-a3b", TrainSpec(1, 4096, "bf16", "adamw", checkpointing=True)),
]
MOE_ROWS = FULL_SIZE_ROWS[-3:]
QUICK_ROWS = [("gpt2-small", TrainSpec(1, 128, "bf16-amp", "adamw")),
              ("llama-3.2-1b", TrainSpec(1, 256, "bf16", "sgd", checkpointing=True))]


def label(name: str, spec: TrainSpec) -> str:
    return (f"{name} b{spec.batch_size} s{spec.seq_len} {spec.precision} {spec.optimizer}"
            f"{' ckpt' if spec.checkpointing else ''}")


def run_simulate_bench(rows=FULL_SIZE_ROWS, timeout_s: float = 600, progress=print) -> list[dict]:
    from planner.runner import run_worker

    results = []
    for name, spec in rows:
        cfg = PRESETS[name]
        est = estimate_training(cfg, spec)
        out = run_worker({"kind": "simulate", "config": config_to_dict(cfg), "spec": asdict(spec)}, timeout_s=timeout_s)
        if out.exit_code:
            raise RuntimeError(f"{label(name, spec)}: simulation failed: {out.record.get('error')}")
        sim = out.record
        row = {"config": label(name, spec), "formula_bytes": est.peak_bytes, "simulated_bytes": sim["peak_bytes"],
               "error_pct": 100.0 * (est.peak_bytes - sim["peak_bytes"]) / sim["peak_bytes"],
               "formula_phase": est.peak_phase, "simulated_phase": sim["peak_phase"], "ops": sim["ops"],
               "worst_phase": max(((p, 100.0 * (est.phase_peak_bytes[p] - v) / v) for p, v in sim["phase_peak_bytes"].items()
                                   if v), key=lambda pe: abs(pe[1])),
               "sim_time_s": sim["sim_time_s"], "sim_peak_rss_bytes": sim["sim_peak_rss_bytes"]}
        results.append(row)
        progress(f"{len(results):2d}/{len(rows)} {row['error_pct']:+8.4f}%  {row['simulated_bytes'] / 2**30:8.2f} GiB  "
                 f"{row['sim_time_s']:6.1f} s  RSS {row['sim_peak_rss_bytes'] / 2**20:6.0f} MiB  {row['config']}")
    return results


def simulate_markdown(results: list[dict]) -> str:
    from .common import _cpu_count, _torch_version

    worst = max(abs(r["error_pct"]) for r in results)
    lines = ["# Formula vs simulation at full size (cpu)", "",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {_cpu_count()} cores, "
             f"Python {platform.python_version()}, torch {_torch_version()}.",
             "Command: `python -m planner bench simulate --out docs/accuracy.md`. Simulated = the real training step "
             "(the one `measure` runs) on fake tensors, its exact peak of live tensor bytes (planner/measure/simulate.py; equal "
             "to the measurement to the byte on the grid above); nothing is allocated, so every row runs on this machine "
             "whatever its size. Time and RSS are the simulating child's own (wall time of its build, warm-up and "
             "tracked steps; peak RSS of the whole process, torch included).", "",
             f"**{len(results)} runs, worst |formula - simulated| {worst:.4f}%** (bar: {FORMULA_BAR_PCT}%). "
             "Worst phase: the phase whose peak the formula misses most (formula - simulated, %), a check beyond the bar.",
             "", "| run | formula (B) | simulated (B) | simulated (GiB) | error % | formula phase | sim. phase "
             "| worst phase | ops | time (s) | RSS (MiB) |",
             "|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['config']} | {r['formula_bytes']:,} | {r['simulated_bytes']:,} | "
                     f"{r['simulated_bytes'] / 2**30:.2f} | {r['error_pct']:+.4f} | {r['formula_phase']} | "
                     f"{r['simulated_phase']} | {r['worst_phase'][0]} {r['worst_phase'][1]:+.2f} | {r['ops']:,} | "
                     f"{r['sim_time_s']:.1f} | "
                     f"{r['sim_peak_rss_bytes'] / 2**20:,.0f} |")
    return "\n".join(lines) + "\n"


def main(quick: bool = False, out: str | None = None) -> int:
    from .common import write_section

    results = run_simulate_bench(QUICK_ROWS if quick else FULL_SIZE_ROWS)
    text = simulate_markdown(results)
    print(text)
    worst = max(abs(r["error_pct"]) for r in results)
    print(f"worst |error| {worst:.4f}% ({'meets' if worst <= FORMULA_BAR_PCT else 'MISSES'} the {FORMULA_BAR_PCT}% bar)")
    if out:
        write_section(out, text)
    return 0 if worst <= FORMULA_BAR_PCT else 1
