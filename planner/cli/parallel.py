"""The data-parallel part of `python -m planner` (no torch): flags, and estimate / measure / simulate of
one step per rank.

    python -m planner estimate train MODEL RUN --world-size N --parallel ddp|fsdp [FSDP/DDP options] [--json]
    python -m planner measure  train MODEL RUN --device cpu|cuda --world-size N --parallel ddp|fsdp [...]
    python -m planner simulate train MODEL RUN [--world-size N --parallel ddp|fsdp [...]] [--json]
    python -m planner estimate|measure|simulate train MODEL RUN --world-size N --parallel tp [--loss-parallel]
    python -m planner estimate|measure|simulate train MODEL RUN --world-size N --parallel fsdp+tp --tp T
    FSDP: [--reshard-after-forward true|false] [--mp-param-dtype bf16|fp16|fp32] [--mp-reduce-dtype ...]
          [--cpu-offload]
    DDP:  [--gradient-as-bucket-view]

RUN's --batch-size is the batch per rank. The records have the per-rank figures ("ranks" measured or
simulated, "rank_groups" estimated) and, at the top level, the largest rank's peak_bytes and peak_phase.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from ..config import ConfigError, config_to_dict
from ..parallel import PARALLEL_MODES, ParallelSpec, mp_dtype
from ..units import fmt_bytes

EXIT_INVALID = 2
_FLAGS = ("world_size", "parallel", "reshard_after_forward", "mp_param_dtype", "mp_reduce_dtype", "cpu_offload",
          "gradient_as_bucket_view", "tp", "loss_parallel", "sequence_parallel")


def _bool(text: str) -> bool:
    v = text.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data parallel (per-rank memory)")
    g.add_argument("--world-size", type=int, help="number of ranks (processes, one device each; default: none, one device)")
    g.add_argument("--parallel", choices=PARALLEL_MODES, help="ddp: DistributedDataParallel; fsdp: FSDP2 fully_shard "
                                                              "on every block and the root (default: none, one device)")
    g.add_argument("--reshard-after-forward", type=_bool, default=None, metavar="true|false",
                   help="FSDP: free the gathered weights after forward (true, ~ZeRO-3; the default) or keep them "
                        "until backward (false, ~ZeRO-2)")
    g.add_argument("--mp-param-dtype", help="FSDP MixedPrecisionPolicy param_dtype: bf16, fp16 or fp32 "
                                            "(default: none, the weights' dtype)")
    g.add_argument("--mp-reduce-dtype", help="FSDP MixedPrecisionPolicy reduce_dtype: bf16, fp16 or fp32 "
                                             "(default: none, the param dtype)")
    g.add_argument("--cpu-offload", action="store_true", help="FSDP CPUOffloadPolicy: sharded weights, gradients "
                                                               "and optimizer state in host RAM")
    g.add_argument("--gradient-as-bucket-view", action="store_true", help="DDP: gradients as views into the buckets")
    g.add_argument("--tp", type=int, help="fsdp+tp: the tensor-parallel size (world size / TP data-parallel groups); "
                                          "tp: equal to --world-size (no default: fsdp+tp needs it)")
    g.add_argument("--loss-parallel", action="store_true", help="tp, fsdp+tp: the head's output stays sharded on the "
                                                                 "vocabulary (torch's loss_parallel)")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="tp: SequenceParallel on the norms, the residual stream sharded on the sequence (torchtitan "
                        "applies it by default; off here so earlier figures keep their values)")


def parallel_requested(args) -> bool:
    return any(getattr(args, k, None) not in (None, False) for k in _FLAGS)


def parse_parallel(args) -> ParallelSpec:
    if args.parallel is None:
        given = [f"--{k.replace('_', '-')}" for k in _FLAGS if getattr(args, k, None) not in (None, False)]
        raise ConfigError(f"{', '.join(given)} need{'s' if len(given) == 1 else ''} --parallel ddp, fsdp, tp or fsdp+tp")
    if args.world_size is None:
        raise ConfigError(f"--parallel {args.parallel} needs --world-size N")
    reshard = True if args.reshard_after_forward is None else args.reshard_after_forward
    if args.parallel == "ddp" and args.reshard_after_forward is not None:
        raise ConfigError("--reshard-after-forward only applies to --parallel fsdp")
    return ParallelSpec(world_size=args.world_size, parallel=args.parallel, reshard_after_forward=reshard,
                        mp_param_dtype=mp_dtype(args.mp_param_dtype), mp_reduce_dtype=mp_dtype(args.mp_reduce_dtype),
                        cpu_offload=args.cpu_offload, gradient_as_bucket_view=args.gradient_as_bucket_view,
                        tp=getattr(args, "tp", None), loss_parallel=bool(getattr(args, "loss_parallel", False)),
                        sequence_parallel=bool(getattr(args, "sequence_parallel", False)))


def _estimate(cfg, spec, pspec) -> dict:
    from ..estimate.distributed import estimate_distributed

    return {"model": config_to_dict(cfg), "run": asdict(spec), **estimate_distributed(cfg, spec, pspec).to_dict()}


def _print_groups(rec: dict, key: str = "rank_groups") -> None:
    for g in rec[key]:
        lo, hi = (g["first_rank"], g["last_rank"]) if key == "rank_groups" else g.get("ranks_like_this", [g["rank"]] * 2)
        who = f"rank {lo}" if lo == hi else f"ranks {lo}-{hi}"
        print(f"  {who:<16} peak {fmt_bytes(g['peak_bytes']):>11} in {g['peak_phase']}")


def fewest_record(cfg, spec, pspec, budget_text: str) -> dict:
    """`estimate train --parallel ... --budget SIZE`: the fewest devices of that size that fit the run (batch per
    rank), with the same solver and the same budget for tensors as the Planner page (planner.fit.fewest_ranks;
    on cuda less the CUDA context and the allocator's reserve)."""
    from ..fit import cuda_context_bytes, fewest_ranks, tensor_budget
    from ..units import parse_budget

    budget = parse_budget(budget_text)
    usable = tensor_budget(budget, spec.device, spec.checkpointing)
    fewest, why = fewest_ranks(cfg, spec, pspec, usable)
    return {"budget_bytes": budget, "cuda_context_bytes": cuda_context_bytes(spec.device),
            "tensor_budget_bytes": usable, "fewest_ranks": fewest, "fewest_reason": why}


def cmd_estimate(args, cfg, spec) -> int:
    pspec = parse_parallel(args)
    rec = _estimate(cfg, spec, pspec)
    if getattr(args, "budget", None):
        rec["fit"] = fewest_record(cfg, spec, pspec, args.budget)
    if args.json:
        print(json.dumps(rec))
        return 0
    print(f"{ParallelSpec(**rec['parallel']).label}: per-rank peak {fmt_bytes(rec['peak_bytes'])} "
          f"({rec['peak_bytes']:,} B) in {rec['peak_phase']} (rank {rec['peak_rank']}); one device: "
          f"{fmt_bytes(rec['single_device']['peak_bytes'])}")
    _print_groups(rec)
    if rec["host_bytes"]:
        print(f"host RAM per rank (offload): {fmt_bytes(rec['host_bytes'])}")
    ref = rec["reference"]
    print(f"for comparison, model states only ({ref['closest']}): ZeRO paper "
          f"{fmt_bytes(ref['zero_paper'][ref['closest']])}"
          + (f", DeepSpeed {fmt_bytes(ref['deepspeed'][ref['closest']])}" if ref['closest'] in ref['deepspeed'] else ""))
    if "fit" in rec:
        f = rec["fit"]
        print(f"budget {fmt_bytes(f['budget_bytes'])} per device: {fmt_bytes(f['tensor_budget_bytes'])} for tensors; "
              f"fewest devices that fit ({pspec.parallel}, batch {spec.batch_size} per rank): "
              + (f"{f['fewest_ranks']} ({f['fewest_reason']})" if f["fewest_ranks"] else f"none ({f['fewest_reason']})"))
    return 0


def _with_estimate(rec: dict, est: dict) -> dict:
    """Attach the estimate; each rank gets its group's estimate and error."""
    rec["estimate"] = {k: est[k] for k in ("peak_bytes", "peak_phase", "peak_rank", "phase_peak_bytes", "rank_groups",
                                           "host_bytes")}
    for r in rec["ranks"]:
        g = next(g for g in est["rank_groups"] if g["first_rank"] <= r["rank"] <= g["last_rank"])
        r["estimate_bytes"] = g["peak_bytes"]
        r["error_pct"] = 100.0 * (g["peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"]
    rec["error_pct"] = 100.0 * (est["peak_bytes"] - rec["peak_bytes"]) / rec["peak_bytes"]
    return rec


def cmd_measure(args, cfg, spec) -> int:
    from ..distributed import check_real_ranks, run_ranks

    pspec = parse_parallel(args)
    est = _estimate(cfg, spec, pspec)
    check_real_ranks(pspec, spec.device, est["peak_bytes"] + est["host_bytes"])
    if getattr(args, "memory_limit", None):
        raise ConfigError("--memory-limit applies to single-device measurements only")
    show_progress = args.json and args.progress
    outcome = run_ranks(config_to_dict(cfg), asdict(spec), pspec, timeout_s=args.timeout,
                        on_event=lambda e: print(json.dumps(e), flush=True) if show_progress else None)
    return _report(args, outcome, est, "measured")


def cmd_simulate(args, cfg, spec) -> int:
    from ..distributed import run_simulation

    if spec.device_type != "cpu":
        raise ConfigError("simulate runs the CPU kernels on fake tensors; use --device cpu (fake CUDA tensors need a "
                          "CUDA build of torch)")
    pspec = parse_parallel(args) if parallel_requested(args) else None
    est = _estimate(cfg, spec, pspec) if pspec else None
    outcome = run_simulation(config_to_dict(cfg), asdict(spec), pspec, timeout_s=args.timeout)
    if est is None:
        from ..estimate.training import estimate_training

        single = estimate_training(cfg, spec)
        est = {"peak_bytes": single.peak_bytes, "peak_phase": single.peak_phase, "peak_rank": 0,
               "phase_peak_bytes": single.phase_peak_bytes, "host_bytes": 0,
               "rank_groups": [{"first_rank": 0, "last_rank": 0, "peak_bytes": single.peak_bytes}]}
    return _report(args, outcome, est, "simulated")


def _report(args, outcome, est: dict, verb: str) -> int:
    if outcome.exit_code == EXIT_INVALID:
        raise ConfigError(outcome.record.get("error", "invalid request"))
    if outcome.exit_code:
        rec = {**outcome.record, "stderr_tail": outcome.stderr[-1500:]}
        if args.json:
            print(json.dumps(rec))
        else:
            print(f"{verb[:-1]}ing failed in phase {rec.get('phase')}: {rec['error']}", file=sys.stderr)
        return outcome.exit_code
    rec = _with_estimate(outcome.record, est)
    if args.json:
        print(json.dumps(rec))
        return 0
    print(f"{verb} per-rank peak {fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes']:,} B) in {rec['peak_phase']} "
          f"(rank {rec['peak_rank']} of {rec['world_size']}); estimated {fmt_bytes(est['peak_bytes'])}; "
          f"error {rec['error_pct']:+.2f}%")
    _print_groups(rec, "ranks")
    return 0
