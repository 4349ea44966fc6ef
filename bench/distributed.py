"""Benchmark of the per-rank figures (issue #13): estimate vs real gloo ranks vs fake-tensor simulation.

    python -m planner bench distributed [--quick] [--out FILE]

Part 1, on this machine: tiny GPT-2 and Llama configs over {DDP, FSDP2 reshard True / False, a bf16
MixedPrecisionPolicy} x {AdamW, SGD, checkpointing} (each mode on two models) on 2 and 4 real gloo ranks
(planner.distributed.run_ranks, each rank a child process), each also simulated under FakeTensorMode
(planner.distributed.run_simulation). Per rank: estimate vs measured peak (bar 2%), simulated vs
measured (bar 0.1%).
Part 2 (not with --quick): the formula against the simulation for published shapes too large to run
here, llama-3-8b and Llama-2-70B at 8 and 64 ranks (bar 2%).
No torch in this process: measurements and simulations run in children.
"""
from __future__ import annotations

import datetime
import platform
from dataclasses import asdict

from planner.config import GPT2Config, LlamaConfig, ModelConfig, PRESETS, config_to_dict
from planner.estimate.distributed import estimate_distributed
from planner.parallel import ParallelSpec
from planner.spec import TrainSpec

ESTIMATE_BAR_PCT = 2.0
SIMULATE_BAR_PCT = 0.1

# Odd vocabularies and a context that 4 does not divide: padded dim-0 shards and a last rank with fewer rows.
TINY_GPT = GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3, n_layers=2, drop_rate=0.1)
TINY_GPT_V = GPT2Config(vocab_size=1001, context_length=50, emb_dim=64, n_heads=4, n_layers=3, drop_rate=0.0,
                        attention="sdpa")
TINY_LLAMA = LlamaConfig(vocab_size=301, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
TINY_LLAMA_E = LlamaConfig(vocab_size=2000, hidden_size=64, intermediate_size=172, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128,
                           attention="eager", tie_word_embeddings=True)
# Issue #23's case family (the third opinion): each rank builds the model from its config, then every decoder layer
# and the root are fully_shard-ed; a GQA Llama with checkpointing in bf16-AMP on 2 ranks, and a Qwen2 with a tied
# embedding and SGD in fp32 on 4 ranks (a vocabulary 4 does not divide: padded shards). These rows also run one
# step under torch's FSDPMemTracker on every rank (its peak beside the planner's).
from planner.arch.qwen2 import Qwen2Config  # noqa: E402

TINY_QWEN_TIED = Qwen2Config(vocab_size=503, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             tie_word_embeddings=True)
THIRD_OPINION_ROWS = [
    ("llama V301 h48 GQA fsdp bf16-amp ckpt adamw x2", TINY_LLAMA, TrainSpec(2, 16, "bf16-amp", "adamw", checkpointing=True),
     ParallelSpec(2, "fsdp")),
    ("llama V2000 h64 GQA tied fsdp bf16-amp ckpt sgd x4", TINY_LLAMA_E, TrainSpec(1, 32, "bf16-amp", "sgd", checkpointing=True),
     ParallelSpec(4, "fsdp")),
    ("qwen2 V503 h64 tied fsdp fp32 sgd x4", TINY_QWEN_TIED, TrainSpec(2, 32, "fp32", "sgd"), ParallelSpec(4, "fsdp")),
    ("qwen2 V503 h64 tied fsdp fp32 adamw x2", TINY_QWEN_TIED, TrainSpec(2, 32, "fp32", "adamw"), ParallelSpec(2, "fsdp")),
]

# Llama-2-70B as published (meta-llama/Llama-2-70b-hf config.json): 80 layers, GQA with 8 KV heads.
LLAMA_2_70B = LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=4096,
                          rms_norm_eps=1e-5)

MODES = [  # (label, parallel kwargs, run kwargs)
    ("ddp", dict(parallel="ddp"), dict(optimizer="adamw")),
    ("ddp ckpt", dict(parallel="ddp"), dict(optimizer="sgd", checkpointing=True)),
    ("fsdp", dict(parallel="fsdp"), dict(optimizer="adamw")),
    ("fsdp ckpt", dict(parallel="fsdp"), dict(optimizer="sgd", checkpointing=True)),
    ("fsdp no-reshard", dict(parallel="fsdp", reshard_after_forward=False), dict(optimizer="adamw")),
    ("fsdp no-reshard ckpt", dict(parallel="fsdp", reshard_after_forward=False),
     dict(optimizer="sgd-momentum", checkpointing=True)),
    ("fsdp mp bf16/fp32", dict(parallel="fsdp", mp_param_dtype="bfloat16", mp_reduce_dtype="float32"),
     dict(optimizer="adamw")),
    ("fsdp mp bf16 ckpt", dict(parallel="fsdp", mp_param_dtype="bfloat16"), dict(optimizer="sgd", checkpointing=True)),
]


# Which modes each model runs (indices into MODES): every mode twice over the four models, 2 and 4 ranks
# alternating; a full product takes hours with gloo ranks sharing 2 cores.
PLAN = {0: (0, 2, 5, 6), 1: (1, 3, 4, 7), 2: (2, 1), 3: (6, 5)}


def grid(quick: bool = False) -> list[tuple[str, ModelConfig, TrainSpec, ParallelSpec]]:
    rows = []
    models = [("gpt2 V500 h48 p0.1", TINY_GPT, 2, 32), ("llama V301 h48", TINY_LLAMA, 2, 16),
              ("gpt2 V1001 h64 sdpa", TINY_GPT_V, 2, 24), ("llama V2000 h64 eager tied", TINY_LLAMA_E, 1, 32)]
    k = 0
    for i, (name, cfg, b, s) in enumerate(models):
        for j in PLAN[i]:
            mode, pkw, rkw = MODES[j]
            n = 2 if k % 2 == 0 else 4
            k += 1
            rows.append((f"{name} {mode} x{n}", cfg, TrainSpec(b, s, **rkw), ParallelSpec(n, **pkw)))
    from .tensor_parallel import tp_grid

    if quick:
        return [rows[k] for k in (1, 6)] + THIRD_OPINION_ROWS[:1] + tp_grid(quick=True)[:1]
    return rows + THIRD_OPINION_ROWS + tp_grid()


def run_grid(rows, progress=print) -> list[dict]:
    from planner.distributed import run_ranks, run_simulation

    results = []
    for label, cfg, spec, pspec in rows:
        est = estimate_distributed(cfg, spec, pspec)
        third = any(label == r[0] for r in THIRD_OPINION_ROWS)
        meas = run_ranks(config_to_dict(cfg), asdict(spec), pspec, timeout_s=600, third_opinion=third)
        if meas.exit_code:
            raise RuntimeError(f"{label}: {meas.record.get('error')}\n{meas.stderr[-1500:]}")
        sim = run_simulation(config_to_dict(cfg), asdict(spec), pspec, timeout_s=600)
        if sim.exit_code:
            raise RuntimeError(f"{label} (simulated): {sim.record.get('error')}\n{sim.stderr[-1500:]}")
        for r in meas.record["ranks"]:
            g = next(g for g in est.rank_groups if g["first_rank"] <= r["rank"] <= g["last_rank"])
            twin = next(x for x in sim.record["ranks"] if x["ranks_like_this"][0] <= r["rank"] <= x["ranks_like_this"][1])
            row = {"config": label, "rank": r["rank"], "estimate_bytes": g["peak_bytes"], "measured_bytes": r["peak_bytes"],
                   "simulated_bytes": twin["peak_bytes"], "estimated_phase": g["peak_phase"],
                   "measured_phase": r["peak_phase"], "single_device_bytes": est.single_device["peak_bytes"],
                   "error_pct": 100.0 * (g["peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"],
                   "sim_error_pct": 100.0 * (twin["peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"],
                   "fsdp_mem_tracker_bytes": r.get("fsdp_mem_tracker_peak_bytes"), "mesh_bytes": r.get("mesh_bytes", 0),
                   "late_release_peak_bytes": r.get("late_release_peak_bytes")}
            results.append(row)
            progress(f"{len(results):3d} {row['error_pct']:+7.3f}% sim {row['sim_error_pct']:+7.3f}%  {label} rank {r['rank']}")
    return results


def large_rows() -> list[tuple[str, ModelConfig, TrainSpec, ParallelSpec]]:
    """torchtitan's recipe for these models: fp32 weights, bf16 MixedPrecisionPolicy with fp32 reduce,
    per-block activation checkpointing, AdamW; batch 1 x 4096 per rank (8192 for Llama 3)."""
    rows = []
    for name, cfg, seq in (("llama-3-8b", PRESETS["llama-3-8b"], 8192), ("Llama-2-70B", LLAMA_2_70B, 4096)):
        for n in (8, 64):
            spec = TrainSpec(1, seq, "fp32", "adamw", checkpointing=True)
            pspec = ParallelSpec(n, "fsdp", mp_param_dtype="bfloat16", mp_reduce_dtype="float32")
            rows.append((f"{name} b1 s{seq} ckpt adamw fsdp mp bf16/fp32 x{n}", cfg, spec, pspec))
    # Issue #23: FSDP2 x TP on a 2-D mesh, torchtitan's layout for these models (TP 8 inside a node), at 64 and
    # 1,024 ranks; the 1,024-rank 70B row's simulation is also timed (one rank's view: every rank has the same
    # shapes here, so one rank is simulated).
    for name, cfg, seq in (("llama-3-8b", PRESETS["llama-3-8b"], 8192), ("Llama-2-70B", LLAMA_2_70B, 4096)):
        for dp in (8, 128):
            spec = TrainSpec(1, seq, "fp32", "adamw", checkpointing=True)
            pspec = ParallelSpec(dp * 8, "fsdp+tp", tp=8, mp_param_dtype="bfloat16", mp_reduce_dtype="float32")
            rows.append((f"{name} b1 s{seq} ckpt adamw {pspec.label} ({dp * 8} ranks)", cfg, spec, pspec))
    return rows


def run_large(rows, progress=print) -> list[dict]:
    from planner.distributed import run_simulation

    out = []
    for label, cfg, spec, pspec in rows:
        est = estimate_distributed(cfg, spec, pspec)
        sim = run_simulation(config_to_dict(cfg), asdict(spec), pspec, timeout_s=3600)
        if sim.exit_code:
            raise RuntimeError(f"{label} (simulated): {sim.record.get('error')}\n{sim.stderr[-1500:]}")
        s = sim.record
        ref = est.reference
        row = {"config": label, "estimate_bytes": est.peak_bytes, "simulated_bytes": s["peak_bytes"],
               "error_pct": 100.0 * (est.peak_bytes - s["peak_bytes"]) / s["peak_bytes"],
               "estimated_phase": est.peak_phase, "simulated_phase": s["peak_phase"],
               "simulated_ranks": s.get("simulated_ranks", len(s["ranks"])),
               "simulation_wall_s": s.get("simulation_wall_s"), "simulation_cpu_s": s.get("simulation_cpu_s"),
               "simulation_rss_bytes": s.get("simulation_peak_rss_bytes"),
               "simulation_process_cpu_s": s.get("simulation_process_cpu_s"),
               "simulation_concurrent_processes": s.get("simulation_concurrent_processes"),
               "simulation_load_avg_1min": s.get("simulation_load_avg_1min"),
               "world_size": pspec.world_size, "zero3_paper_bytes": ref["zero_paper"]["ZeRO-3"],
               "zero3_deepspeed_bytes": ref["deepspeed"]["ZeRO-3"]}
        out.append(row)
        progress(f"{row['error_pct']:+7.3f}%  {label}")
    return out


def _gib(b: int) -> str:
    return f"{b / 2**30:,.2f}"


PARTS = {  # `bench distributed --family PART`: one part of the grid, in its own section of the file
    "tp": "# Tensor parallel and FSDP2 + TP: per-rank peak, estimate vs real gloo ranks vs simulation",
    "fsdp-third": "# FSDP2's case family of issue #23: per-rank peak, estimate vs real gloo ranks vs FSDPMemTracker",
}
TITLE = "# Data parallel: per-rank peak, estimate vs real gloo ranks vs simulation"


def markdown(results: list[dict], large: list[dict], part: str | None = None) -> str:
    from .common import _cpu_count, _torch_version

    worst = max(abs(r["error_pct"]) for r in results)
    worst_sim = max(abs(r["sim_error_pct"]) for r in results)
    configs = len({r["config"] for r in results})
    lines = [PARTS.get(part, TITLE), "",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {_cpu_count()} cores, "
             f"torch {_torch_version()}. Command: `python -m planner bench distributed"
             f"{f' --family {part}' if part else ''}`."
             + (" TP: torchtitan's plan (planner/measure/tensor_parallel.py) on transformers' modules; FSDP2 + TP: "
                "fully_shard on the dp dimension of a (dp, tp) mesh after it." if part == "tp" else ""),
             "Measured = exact peak of live tensor storage bytes on each real gloo rank (step 5 of a fresh rank "
             "process; DDP's buckets and FSDP2's resized storages included). Simulated = the same steps under "
             "FakeTensorMode with the fake process group, one rank per distinct shard layout.", "",
             f"**{configs} configs, {len(results)} ranks: worst |estimate error| {worst:.3f}% (bar "
             f"{ESTIMATE_BAR_PCT}%), worst |simulated - measured| {worst_sim:.4f}% (bar {SIMULATE_BAR_PCT}%).**", "",
             "| config | rank | estimate (B) | measured (B) | error % | simulated (B) | sim % | est. phase | meas. phase | one device (B) |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in results:
        lines.append(f"| {r['config']} | {r['rank']} | {r['estimate_bytes']:,} | {r['measured_bytes']:,} | "
                     f"{r['error_pct']:+.3f} | {r['simulated_bytes']:,} | {r['sim_error_pct']:+.4f} | "
                     f"{r['estimated_phase']} | {r['measured_phase']} | {r['single_device_bytes']:,} |")
    third = [r for r in results if r.get("fsdp_mem_tracker_bytes") is not None]
    if third:
        lines += ["", "## A third opinion on FSDP2: torch's FSDPMemTracker", "",
                  "The same ranks, one more step under torch's own `FSDPMemTracker` "
                  "(torch/distributed/_tools/fsdp2_mem_tracker.py: sharded and unsharded parameters, gradients, "
                  "all-gather and reduce-scatter buffers, activations, temporaries, optimizer state). It does not "
                  "see the DeviceMesh's rank map (`torch.arange(N, dtype=torch.int)`, 4·N bytes on the CPU), which the "
                  "planner counts (a tracker running from the model's construction on finds it, and nothing else, "
                  "outside the step). A step in which gloo's worker thread released a collective's buffer after "
                  "FSDP2 had dropped it peaks higher (last column, when one was seen); measure runs such a step again "
                  "and keeps the lowest peak, FSDP2's own schedule.", "",
                  "| config | rank | measured (B) | FSDPMemTracker (B) | + rank map (B) | measured - (FSDPMemTracker + map) | estimate % | late-release step (B) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in third:
            late = r.get("late_release_peak_bytes")
            lines.append(f"| {r['config']} | {r['rank']} | {r['measured_bytes']:,} | {r['fsdp_mem_tracker_bytes']:,} | "
                         f"{r['mesh_bytes']:,} | {r['measured_bytes'] - r['fsdp_mem_tracker_bytes'] - r['mesh_bytes']:+,} | "
                         f"{r['error_pct']:+.3f} | {f'{late:,}' if late and late > r['measured_bytes'] else '-'} |")
    if large:
        lines += ["", "## Published shapes: formula vs simulation", "",
                  "Too large to run here; simulated on fake tensors (nothing allocated). The ZeRO paper's and "
                  "DeepSpeed's ZeRO-3 figures count model states only (no activations, no gathered layers "
                  "beyond DeepSpeed's 4x largest layer), for comparison.", "",
                  "| config | estimate (GiB) | simulated (GiB) | error % | phase | ZeRO paper ZeRO-3 (GiB) | DeepSpeed ZeRO-3 (GiB) |",
                  "|---|---:|---:|---:|---|---:|---:|"]
        for r in large:
            lines.append(f"| {r['config']} | {_gib(r['estimate_bytes'])} | {_gib(r['simulated_bytes'])} | "
                         f"{r['error_pct']:+.3f} | {r['simulated_phase']} | {_gib(r['zero3_paper_bytes'])} | "
                         f"{_gib(r['zero3_deepspeed_bytes'])} |")
        timed = [r for r in large if r.get("simulation_wall_s") is not None and r.get("world_size", 0) >= 1024]
        if timed:
            lines += ["", "## Simulating a 1,024-rank step", "",
                      "One simulation child (`planner.measure.distributed --simulate`): the simulated ranks' wall time "
                      "(model built on fake tensors, mesh, TP plan and FSDP2, two steps a rank: one warm-up, one tracked) and the "
                      "child's RSS high-water mark (VmHWM). Bars: 60 s and 2 GiB. CPU time is the process's own "
                      "(user + system): the wall time grows with the machine's load, the CPU time does not. A layout's "
                      "further distinct ranks are simulated in fresh processes beside the first, one per spare core "
                      "(planner.measure.distributed._FreshRanks; their CPU time includes their own imports); a simulated FSDP2 / TP rank runs 2 steps (one "
                      "warm-up, one tracked: _steady_after_one_step). Idle-equivalent wall: the largest process's "
                      "CPU time when every process has a core (else their sum); the load is the 1-minute load "
                      "average when the simulation ended.", "",
                      "| config | ranks | ranks simulated | wall (s) | CPU (s) | CPU per simulated rank (s) | RSS (GiB) "
                      "| CPU per process (s) | processes at once | idle-equivalent wall (s) | load (1 min) |",
                      "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
            for r in timed:
                cpu = r.get("simulation_cpu_s") or 0.0
                procs = r.get("simulation_process_cpu_s") or [cpu]
                at_once = r.get("simulation_concurrent_processes") or 1
                idle = max(procs) if at_once >= len(procs) else sum(procs)
                load = r.get("simulation_load_avg_1min")
                lines.append(f"| {r['config']} | {r['world_size']:,} | {r['simulated_ranks']} | "
                             f"{r['simulation_wall_s']:.1f} | {cpu:.1f} | {cpu / max(1, r['simulated_ranks']):.1f} | "
                             f"{r['simulation_rss_bytes'] / 2**30:.2f} | {' + '.join(f'{c:.1f}' for c in procs)} | "
                             f"{at_once} | {idle:.1f} | {f'{load:.1f}' if load is not None else '-'} |")
    return "\n".join(lines) + "\n"


def main(quick: bool = False, out: str | None = None, part: str | None = None) -> int:
    from planner.config import ConfigError

    if part is not None and part not in PARTS:
        raise ConfigError(f"bench distributed --family: one of {', '.join(PARTS)} (default: the whole grid)")
    rows, big = grid(quick), ([] if quick else large_rows())
    if part == "tp":
        rows = [r for r in rows if r[3].parallel in ("tp", "fsdp+tp")]
        big = [r for r in big if r[3].parallel == "fsdp+tp"]
    elif part == "fsdp-third":
        names = {r[0] for r in THIRD_OPINION_ROWS}
        rows, big = [r for r in rows if r[0] in names], []
    results = run_grid(rows)
    large = run_large(big)
    text = markdown(results, large, part)
    print(text)
    if out:  # its own section of the file (docs/accuracy.md holds the other benchmarks' too)
        from .common import write_section

        write_section(out, text)
    worst = max(abs(r["error_pct"]) for r in results + large)
    worst_sim = max(abs(r["sim_error_pct"]) for r in results)
    ok = worst <= ESTIMATE_BAR_PCT and worst_sim <= SIMULATE_BAR_PCT
    print(f"worst |estimate error| {worst:.3f}%, worst |simulated - measured| {worst_sim:.4f}%: "
          f"{'meets' if ok else 'MISSES'} the bars")
    return 0 if ok else 1
