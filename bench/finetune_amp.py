"""Fine-tuning under autocast (issue #19 item 2): frozen layers and peft's LoRA with fp16-AMP and bf16-AMP,
estimated (planner/estimate/finetune.py, `w.amp`) and measured on every transformers family that fine-tunes.

    python -m planner bench finetune-amp [--quick] [--out docs/accuracy.md]

Rows: each family's tiny configs (planner/arch/<family>.py grid_configs) x every other fine-tuning
mode (bench.main FINETUNE_MODES; the rest on the next shape), checkpointing off/on, the autocast dtype (bf16-amp / fp16-amp), the attention
kernel and AdamW/SGD alternating; fp32 master weights (the Trainer's `bf16=True` / `fp16=True`: the model stays
fp32, autocast runs the matmuls in the low dtype, fp16 adds the GradScaler). Measured in this process
(planner.measure.training: the exact live tensor bytes of a steady-state step, step 3).
"""
from __future__ import annotations

import datetime
import platform
from dataclasses import replace

from planner.spec import TrainSpec

AMP_BAR_PCT = 1.0  # issue #19: LoRA + bf16-AMP and fp16-AMP rows within 1% for every family
SECTION = "# Fine-tuning under autocast: estimate vs measurement"


def finetune_amp_grid(quick: bool = False, families_: tuple[str, ...] | None = None) -> list[tuple]:
    """(label, config, spec) rows, one per family x shape x a quarter of the modes (the others on the other
    shapes); the walked families (bench.main FINETUNE_WALKED_FAMILIES: Phi-3, the MoE families) two
    (checkpointing off and on) per shape x every walked mode on their first two shapes; quick: every 7th row."""
    from planner.arch import families
    from .main import FINETUNE_FAMILIES, FINETUNE_MODES, FINETUNE_WALKED_FAMILIES, walked_modes

    rows = []
    i = 0
    for family in families_ or FINETUNE_FAMILIES + FINETUNE_WALKED_FAMILIES:
        fam = families()[family]
        walked = family in FINETUNE_WALKED_FAMILIES
        for n, (label, cfg, b, s) in enumerate(fam.grid_configs()[:2] if walked else fam.grid_configs()):
            kernels = [k for k in ("eager", "sdpa") if k in fam.attention_kinds(cfg)]
            for m, (mode, kw) in enumerate(walked_modes(fam, cfg) if walked else FINETUNE_MODES):
                if kw.get("train_layers") == "head" and fam.tied(cfg):
                    continue
                if not walked and (m + n + 1) % 4:
                    continue  # a quarter of the modes on each shape, each mode on one of the four shapes
                for _ in range(2 if walked else 1):  # a walked family: checkpointing off and on (i alternates it)
                    i += 1
                    # one row per (shape, mode): checkpointing, the autocast dtype, the kernel and the optimizer
                    # each alternate along the grid, so every pair of them is met within a family
                    ckpt = i % 2 == 1
                    precision = ("bf16-amp", "fp16-amp")[(i // 2) % 2]
                    attention = kernels[(i // 4) % len(kernels)]
                    optimizer = ("adamw", "sgd")[(i // 3) % 2]
                    spec = TrainSpec(batch_size=b, seq_len=s, precision=precision, optimizer=optimizer,
                                     checkpointing=ckpt, **kw)
                    rows.append((f"{family} {label} {mode} {attention} {precision}{' ckpt' if ckpt else ''} "
                                 f"{optimizer}", replace(cfg, attention=attention), spec))
    return rows[::7] if quick else rows


def amp_markdown(results: list[dict], device: str) -> str:
    """The section: the worst |error| per part of the grid (mode, dtype, checkpointing, family), then every row."""
    from .main import FINETUNE_MODES, FINETUNE_WALKED_MODES
    from .common import _cpu_count, _torch_version, _version

    def mode_of(label: str) -> str:
        for mode, _ in sorted(FINETUNE_MODES + FINETUNE_WALKED_MODES, key=lambda m: -len(m[0])):
            if f" {mode} " in label:
                return mode
        return "?"

    groups: dict[str, list[dict]] = {}
    for r in results:
        label = r["config"]
        groups.setdefault(label.split(" ", 1)[0], []).append(r)
        groups.setdefault(mode_of(label), []).append(r)
        groups.setdefault("bf16-amp" if " bf16-amp" in label else "fp16-amp", []).append(r)
        groups.setdefault("checkpointing" if " ckpt" in label else "no checkpointing", []).append(r)
    from .common import FINETUNE_GAP_BAR_PCT

    modelled = [r for r in results if not r.get("gap")]
    worst = max(abs(r["error_pct"]) for r in modelled)
    gap_rows = [r for r in results if r.get("gap")]
    gap_line = (f" {len(gap_rows)} more rows (marked *gap*: a combination whose high point is not modelled, as "
                f"planner/estimate/finetune.py known_gap says) reach {max(abs(r['error_pct']) for r in gap_rows):.3f}% (their bar: "
                f"{FINETUNE_GAP_BAR_PCT}%)." if gap_rows else "")
    lines = [SECTION + f" ({device})", "",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {_cpu_count()} cores, "
             f"Python {platform.python_version()}, torch {_torch_version()}, transformers {_version('transformers')}, "
             f"peft {_version('peft')}.",
             "Command: `python -m planner bench finetune-amp`. Each row builds the family's tiny model in fp32, "
             "freezes it but the trainable subset (`--train-layers`) or wraps it with peft's `get_peft_model` (fp32 "
             "adapters), and runs the step under `torch.autocast(dtype=bfloat16|float16)` (fp16: with the "
             "GradScaler), measuring the exact peak of live tensor storage bytes of a steady-state step (step 3, in "
             "one process).", "",
             f"**{len(modelled)} rows, worst |error| {worst:.3f}%** (bar: {AMP_BAR_PCT}%).{gap_line}", "",
             "With eager attention and no checkpointing the forward's high point inside the last block's attention "
             "is modelled (planner/estimate/finetune.py _forward_attention_point: at the softmax, the fp32 masked "
             "scores and softmax output beside RoPE's fp32 q, repeat_kv's fp32 K/V copies, the masks and the K/V "
             "cache); it decides the step where b*a*s^2 outweighs b*s*V (the s256 eager rows), and with a fused "
             "loss the final norm's point does (_forward_final_norm_point); under checkpointing the same point "
             "(_forward_attention_point_ckpt) sets the forward phase. Not modelled: under checkpointing the forward "
             "phase's in-block points with SDPA and on the b4 s8 rows (the est. forward phase is below the measured "
             "one there), below the backward in every row.", "",
             "| part of the grid | rows | worst \\|error\\| % |", "|---|---:|---:|"]
    for name, rows in groups.items():
        lines.append(f"| {name} | {len(rows)} | {max(abs(r['error_pct']) for r in rows):.3f} |")
    lines += ["", "| config | estimate (B) | measured (B) | error % | est. phase | meas. phase |",
              "|---|---:|---:|---:|---|---|"]
    for r in results:
        lines.append(f"| {r['config']}{' *gap*' if r.get('gap') else ''} | {r['estimate_bytes']:,} | {r['measured_bytes']:,} | "
                     f"{r['error_pct']:+.3f} | {r['estimated_phase']} | {r['measured_phase']} |")
    return "\n".join(lines) + "\n"


def main(quick: bool = False, out: str | None = None, device: str = "cpu", progress=print,
         recorded=None) -> int:
    """The section from measured rows: `recorded` (the command line passes bench/recorded.py's: the full
    grid on the CPU measured once into tests/data/measured/finetune-amp.jsonl, the file tests/test_recorded.py
    re-estimates on every run) returns the recorded rows; without it (--quick, another device) the rows are
    measured here and not recorded."""
    from .main import run_accuracy
    from .common import write_section

    if recorded is None:
        results = run_accuracy(finetune_amp_grid(quick), device=device, in_process=True, progress=progress)
    else:
        from planner.config import config_from_dict
        from planner.estimate.training import estimate_training

        results = []
        for row in recorded():
            est = estimate_training(config_from_dict(row["config"]), TrainSpec(**row["spec"]))
            results.append({"config": row["label"], "estimate_bytes": est.peak_bytes, "measured_bytes": row["peak_bytes"],
                            "error_pct": 100.0 * (est.peak_bytes - row["peak_bytes"]) / row["peak_bytes"],
                            "estimated_phase": est.peak_phase, "measured_phase": row["peak_phase"]})
    from .common import finetune_gap

    by_label = {label: (label, cfg, spec) for label, cfg, spec in finetune_amp_grid(quick)}
    for r in results:
        row = by_label.get(r["config"])
        r["gap"] = row is not None and finetune_gap(row) is not None
    text = amp_markdown(results, device)
    print(text)
    if out:
        write_section(out, text)
    worst = max(abs(r["error_pct"]) for r in results if not r["gap"])
    print(f"worst |error| {worst:.3f}% ({'meets' if worst <= AMP_BAR_PCT else 'MISSES'} the {AMP_BAR_PCT}% bar; "
          f"{sum(r['gap'] for r in results)} gap rows apart)")
    return 0
