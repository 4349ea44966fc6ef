"""`python -m planner`: the JSON command line scripts and CI rely on (its flags and keys are a contract).

    python -m planner estimate train MODEL RUN [--device cpu|cuda[:N]] [--gpu NAME] [--json]
        (flops_per_step always; with --gpu NAME, planner/gpus.py: step_time_s and tokens_per_s, a roofline)
    python -m planner measure  train MODEL RUN --device cpu|cuda[:N] [--json] [--timeout S] [--progress]
    python -m planner estimate|measure train ... --world-size N --parallel ddp|fsdp [PARALLEL]   (per rank)
    python -m planner estimate|measure|simulate train ... --world-size N --parallel tp|fsdp+tp [--tp T] [--loss-parallel]
    python -m planner simulate train MODEL|--module FILE.py:FUNCTION RUN [--world-size N --parallel ddp|fsdp [PARALLEL]] [--device ...] [--json] [--timeout S] [--progress]
    python -m planner simulate whatif MODEL|--module FILE.py:FUNCTION RUN [--points 2x16,3x40,...] [--holdout 7x64,...] [--out FIT.json] [--json] [--progress]
    python -m planner estimate|measure train --module FILE.py:FUNCTION [--input-shape 3x224x224] RUN   (planner/cli/module.py)
    python -m planner estimate load  MODEL --method METHOD|all [--device cpu|cuda[:N]] [--dtype DTYPE] [--json]
    python -m planner measure  load  MODEL --method METHOD|all --device ... [--dtype DTYPE] [--checkpoint PATH] [--json] [--progress]
    python -m planner fit MODEL --seq-len N [--batch-size N] [RUN options] [--budget SIZE] [--measure-costs] [--json]
    python -m planner plan MODEL (--seq-len N [--tokens-per-step T] [--allow lora,qlora] | --infer --prompt-len P --new-tokens N) --budget SIZE|--gpu NAME [--gpus N] [--json]
    python -m planner bench accuracy|speed|loading|families|simulate|distributed|gpu|gpu-doc|finetune|finetune-8bit|longest-context|losses|checkpoint-policies [--quick] [--out FILE] [--family NAME]
    python -m planner bench finetune --family gpt2   (the book's GPT-2 fine-tuning rows)
    python -m planner bench distributed --family tp|fsdp-third   (only the TP / FSDP2 + TP rows, or issue #23's FSDP2 case family)
    MODEL: --model PRESET | --config FILE.json
    RUN:   --batch-size N --seq-len N --precision fp32|fp16-amp|bf16-amp|bf16
           --optimizer sgd|sgd-momentum|adam|adamw|adamw-8bit|paged-adamw-8bit|paged-adamw
           [--checkpointing] [--attention eager|sdpa]
           [--grad-accum N] [--optimizer-impl default|foreach|for-loop|fused]
           [--loss default|labels|cross-entropy]
           [--train-layers all|head|last:N]
           [--lora-r R [--lora-alpha A] [--lora-dropout P] [--lora-targets q_proj,v_proj,...|all-linear]]
           [--quantize-base nf4|fp4|int8 [--double-quant]]   (QLoRA: needs --lora-r; implies --precision bf16)
    PARALLEL: [--reshard-after-forward true|false] [--mp-param-dtype D] [--mp-reduce-dtype D] [--cpu-offload]
              [--gradient-as-bucket-view]   (planner/cli/parallel.py)

Exit codes: 0 success; 2 invalid input (one line on stderr, no traceback); 3 a measurement that ran
out of memory or time, or whose process was killed (JSON with an "error" field on stdout); 130 / 143
stopped by SIGINT (Ctrl-C) / SIGTERM, after every process of the run has ended (one line on stderr);
141 stdout closed early by its reader (`| head`), quietly.
Byte figures are integers in bytes. Progress goes to stderr (one line a step), never into stdout's JSON.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from dataclasses import asdict, replace

from . import parallel as cli_parallel
from ..api import check_ram_guard  # the guard the Training step page applies too (RAM_GUARD_FRACTION)
from ..bnb import require_bitsandbytes
from .compute import _add_gpu, compute_fields  # --gpu and flops_per_step (issue #35): planner/cli/compute.py
from .args import (ESTIMATE_KEYS, EXIT_FAILED, EXIT_INVALID, _add_model, _add_run, _estimate_record, _print_table,
                       default_precision, parse_train, policy_estimated, progress)
from ..config import ConfigError, config_to_dict, resolve_model, with_dtype
from ..spec import check_device
from ..units import fmt_bytes, parse_budget, parse_size



class UsageError(Exception):
    pass


class Stopped(BaseException):
    """SIGINT or SIGTERM: unwinds the command (run_worker ends its worker on the way) to main's exit 128 + N."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Help(argparse.HelpFormatter):
    """Each option's default after its help text (none for flags, required options and per-model defaults)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(message)


def _add_load(p: argparse.ArgumentParser, measure: bool = False) -> None:
    from ..config import CHECKPOINT_DTYPES
    from ..estimate.loading import METHODS

    p.add_argument("--method", required=True, choices=METHODS + ("all",),
                   help="a loading method of the book's notebook, safetensors, or all of them (required)")
    p.add_argument("--device", required=measure, default=None if measure else "cpu",
                   help="where the weights go: cpu, cuda or cuda:N" + (" (required)" if measure else ""))
    p.add_argument("--dtype", choices=CHECKPOINT_DTYPES,
                   help="the checkpoint's dtype (default: the config's torch_dtype, else float32)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on stdout (bytes as integers); all methods: {\"results\": [...]}")
    if measure:
        p.add_argument("--checkpoint", help="your own .pth / .safetensors file or HF folder (read, never written); "
                                            "default: checkpoints generated for the model, cached")
        p.add_argument("--cache", help="folder for the generated checkpoints (default: ~/.cache/torch-memory-planner, "
                                       "or $PLANNER_CACHE)")
        p.add_argument("--timeout", type=float, default=600.0, help="seconds before a method's child is killed (exit 3)")
        p.add_argument("--progress", action="store_true",
                       help="with --json: a JSON progress line on stdout before each method, before the result")


def build_parser() -> _Parser:
    parser = _Parser(prog="python -m planner", description="Torch Memory Planner: will a PyTorch training run fit "
                     "in memory, and what to change so it fits.")
    top = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    def command(group, name: str, text: str) -> _Parser:
        return group.add_parser(name, help=text, description=text)

    est = command(top, "estimate", "Estimate memory from the model config alone, in microseconds (no torch)."
                  ).add_subparsers(dest="what", required=True, parser_class=_Parser, metavar="WHAT")
    p = command(est, "train", "The peak memory of one training step, phase by phase and term by term.")
    _add_model(p)
    _add_run(p, seq_required=False)
    _add_gpu(p)
    cli_parallel.add_parallel_args(p)
    p.add_argument("--budget", help="with --parallel: the memory of one device (80GB, 24GiB, bytes): the record adds "
                                    "`fit`, the fewest devices of that size that fit the run, as the Planner page "
                                    "answers it (default: none; one device: `fit --budget`)")
    from .module import add_module_args  # --module: answered from its what-if fit (planner/cli/module.py)

    add_module_args(p)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="--module: seconds before a fit's simulating child is killed, per point (exit 3)")
    p.add_argument("--progress", action="store_true", help="--module with --json: JSON progress lines before the result")
    p.add_argument("--refit", action="store_true", help="--module: make the what-if fit again, even if one is kept")
    from .infer import add_infer  # estimate|measure|simulate infer: planner/cli/infer.py

    add_infer(est, command, "estimate")
    p = command(est, "load", "The device and CPU peaks of loading the weights with a method, or every method.")
    _add_model(p)
    _add_load(p)
    mea = command(top, "measure", "Measure the same quantities on a real run, in a child process."
                  ).add_subparsers(dest="what", required=True, parser_class=_Parser, metavar="WHAT")
    p = command(mea, "train", "Run one real training step in a child process; measured against estimated.")
    _add_model(p)
    _add_run(p, device_required=True, seq_required=False)
    from .module import add_module_args  # --module: the real step of your model (planner/cli/module.py)

    add_module_args(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the child is killed (exit 3)")
    p.add_argument("--memory-limit", help="cap the child's extra address space (e.g. 2GiB) to rehearse a smaller "
                                          "machine (default: no cap)")
    p.add_argument("--progress", action="store_true", help="with --json: JSON progress lines before the result")
    from .simulate import add_export_args  # --memory-snapshot, --trace (planner/measure/export.py)

    add_export_args(p)
    cli_parallel.add_parallel_args(p)
    add_infer(mea, command, "measure")
    p = command(mea, "load", "Load real checkpoints with a method, or every method, each in a fresh child "
                             "process; measured against estimated.")
    _add_model(p)
    _add_load(p, measure=True)
    from .simulate import add_simulate  # simulate train: planner/cli/simulate.py

    add_simulate(top, command)
    p = command(top, "fit", "The largest batch (or, with --batch-size, the longest sequence) that fits a memory "
                            "budget, and what to change so a run fits.")
    _add_model(p)
    _add_run(p, batch_required=False)
    p.add_argument("--budget", help="memory budget: bytes or units (24GiB, 800MB); default: the GPU's total "
                                    "memory on cuda (the CUDA context then comes off as its own line), else this "
                                    "machine's total RAM")
    p.add_argument("--measure-costs", action="store_true",
                   help="measure checkpointing's and gradient accumulation's step-time cost here (a 2-block proxy)")
    p.add_argument("--replay-reserve", action="store_true",
                   help="on cuda: keep free the caching allocator's reserve a replay of the answer's own simulated "
                        "run finds (simulate --device cuda: needs a CUDA build and device), not the measured share")
    from .plan import add_plan  # the plan search (issue #35): planner/cli/plan.py

    add_plan(top, command)
    b = command(top, "bench", "Run a benchmark and print its markdown table (the tables in docs/).")
    b.add_argument("what", choices=("accuracy", "speed", "loading", "families", "simulate", "distributed", "gpu", "gpu-doc",
                                    "finetune", "finetune-8bit", "finetune-amp", "longest-context", "record", "export", "losses",
                                    "checkpoint-policies", "inference", "offload", "modules", "fitted", "fitted-speed",
                                    "offload-activations", "inference-quantized", "inference-caches"),
                   help="accuracy: estimate vs measured steps; loading: every loading method; speed: estimate timings; "
                        "families: every Hugging Face family's grid; finetune: trainable subsets and LoRA (issue #12), then finetune-8bit: bitsandbytes AdamW8bit rows; finetune-amp: frozen layers and LoRA under fp16-AMP and bf16-AMP (issue #19); longest-context: Llama-3.1-8B QLoRA beside Unsloth's published figures; simulate: formula vs simulation at full size; distributed: per-rank estimate vs ranks; gpu: the CUDA check (issue #14); gpu-doc: its table; export: the memory snapshot's and trace's time and size (issue #22); modules: your own modules, simulate vs measure and the what-if's held-out check (issue #20); fitted / fitted-speed: any transformers causal LM by config.json, fitted estimate vs measurement and first-answer timings (issue #20)")
    b.add_argument("--family", help="families: only this one (planner/arch arch name, e.g. qwen3; default: all; with --out its table "
                                         "replaces its own in the section, the others kept); inference: only this "
                                         "family's grid rows (no full-size rows); record --grid families: "
                                         "only these (comma-separated), put in the kept file in place of their rows")
    b.add_argument("--quick", action="store_true", help="a small grid (what the tests run)")
    b.add_argument("--out", help="write the table as markdown to this file (default: print only)")
    b.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    b.add_argument("--out-json", help="gpu / gpu-doc: the folder of the raw JSON-lines records (default gpu-records)")
    b.add_argument("--parts", default="grid,realistic,loading,recorded,infer",
                   help="gpu: which parts to run, comma-separated from grid, realistic, loading, recorded (every "
                        "recorded CPU grid on cuda), infer (the inference grids on cuda), techniques (issue #24's losses, "
                        "checkpointing policies and offloading on cuda) (default: all but techniques)")
    b.add_argument("--grid", default="all",
                   help="record: the grid whose rows are measured into tests/data/measured/<grid>.jsonl (accuracy, "
                        "families, finetune, finetune-book, qlora, 8bit, finetune-amp) or all; tests/test_recorded.py re-estimates them; "
                        "offload-activations: offgrid runs the off-grid sweep (estimate vs simulate, every RMS family)")
    b.add_argument("--new-rows", action="store_true",
                   help="checkpoint-policies: measure only the rows the --out file's section lacks; the others keep "
                        "their measured and simulated bytes from it (every row estimated again), and its full-size "
                        "table is kept")
    b.add_argument("--from-records", action="store_true",
                   help="record: measure nothing; write the grid's section (all: every recorded grid's) from its "
                        "recorded rows, re-estimated with the code as it is (bench/recorded.py)")
    return parser


def cmd_estimate_train(args) -> int:
    if getattr(args, "budget", None) and not cli_parallel.parallel_requested(args):
        raise ConfigError("estimate train --budget answers the fewest devices of a --parallel run; for one device: "
                          "python -m planner fit --budget SIZE")
    if getattr(args, "module", None):
        from .module import cmd_estimate_module

        return cmd_estimate_module(args)
    cfg, spec = parse_train(args)
    from ..fitted import is_fitted

    if is_fitted(cfg):  # no formula family: a fit of simulations (planner/cli/fitted.py)
        from .fitted import cmd_estimate_fitted

        return cmd_estimate_fitted(args, cfg, spec)
    if cli_parallel.parallel_requested(args):
        return cli_parallel.cmd_estimate(args, cfg, spec)
    from ..gpus import gpu as lookup_gpu

    if getattr(args, "gpu", None):
        lookup_gpu(args.gpu)  # a bad name: exit 2 before any estimate
    rec = _estimate_record(cfg, spec)
    rec.update(compute_fields(cfg, spec, getattr(args, "gpu", None)))
    if args.json:
        print(json.dumps(rec))
    else:
        _print_table(rec, ESTIMATE_KEYS)
        print("phase peaks:", ", ".join(f"{k} {fmt_bytes(v)}" for k, v in rec["phase_peak_bytes"].items()))
        print(f"FLOPs per step: {rec['flops_per_step']:,}" + (
            f"; on {rec['gpu']}: {rec['step_time_s']:.4g} s a step, {rec['tokens_per_s']:,.0f} tokens/s "
            "(roofline, not a measurement)" if "step_time_s" in rec else ""))
        if "host_activation_offload" in rec.get("transients", {}):  # --offload-activations: the host's own line
            from ..estimate.offload_act import DEVICE_NOTE

            print(f"host (offloaded activations): {fmt_bytes(rec['transients']['host_activation_offload'])}; "
                  f"the peak above is the {DEVICE_NOTE}")
        if "host_optimizer_offload" in rec.get("transients", {}):  # --offload-optimizer: the host's own line
            print(f"host (offloaded optimizer): {fmt_bytes(rec['transients']['host_optimizer_offload'])}; the peak "
                  "above is the device's")
    return 0


def cmd_measure_train(args) -> int:
    from ..runner import run_worker

    if getattr(args, "module", None):
        from .module import cmd_measure_module

        return cmd_measure_module(args)
    cfg, spec = parse_train(args)
    require_bitsandbytes(spec.optimizer)  # the measuring child imports it; the estimate does not
    from ..finetune import check_quantize_runnable

    check_quantize_runnable(spec)
    from ..estimate.offload import refuse_run

    refuse_run(spec)  # --offload-optimizer: the combinations the estimate refuses (plain-torch equivalent)
    from .simulate import export_paths

    exports = export_paths(args)
    from ..fitted import is_fitted

    fitted = is_fitted(cfg)  # issue #20: no formula family; the kept fit's answer, if any, is the estimate
    if fitted and cli_parallel.parallel_requested(args):
        raise ConfigError(f"{cfg.model_type}: --world-size / --parallel needs a formula family")
    if cli_parallel.parallel_requested(args):
        return cli_parallel.cmd_measure(args, cfg, spec)
    if fitted:
        from .fitted import estimate_block, guard_peak

        guard = guard_peak(cfg, spec, args.timeout) if spec.device_type == "cpu" else 0
        est = estimate_block(cfg, spec)
        estimated = est is not None
    else:
        estimated = policy_estimated(cfg, spec)  # planner/estimate/ckpt_policy.py
        # a policy not estimated here: the RAM guard takes the run without checkpointing, which keeps more
        est = _estimate_record(cfg, spec if estimated else replace(spec, checkpointing=False, checkpoint_policy="full"))
        guard = est["peak_bytes"]
    if spec.device_type == "cpu":
        check_ram_guard(guard, f"the {'simulated' if fitted else 'estimated'} peak")
    payload = {"config": config_to_dict(cfg), "spec": asdict(spec)}
    if exports:
        payload["exports"] = exports
    if args.memory_limit:
        try:
            payload["memory_limit_bytes"] = parse_size(args.memory_limit)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def on_event(event: dict) -> None:
        if event.get("event") != "progress":
            return
        if args.json and args.progress:
            print(json.dumps(event), flush=True)
        elif not args.json:
            progress(f"measuring: {event.get('stage')}")

    outcome = run_worker(payload, timeout_s=args.timeout, on_event=on_event)
    if outcome.exit_code == EXIT_INVALID:
        raise ConfigError(outcome.record.get("error", "invalid request"))
    rec = {k: v for k, v in outcome.record.items() if k != "event"}
    if not estimated:
        est = None
        rec["estimate"] = None
    elif fitted:
        rec["estimate"] = est
    else:
        rec["estimate"] = {k: est[k] for k in ESTIMATE_KEYS + ["phase_peak_bytes", "basis"]}
        if "host_activation_offload" in est.get("transients", {}):  # --offload-activations
            rec["estimate"]["host_activation_offload_bytes"] = est["transients"]["host_activation_offload"]
        if "host_optimizer_offload" in est.get("transients", {}):  # --offload-optimizer
            rec["estimate"]["host_optimizer_offload_bytes"] = est["transients"]["host_optimizer_offload"]
    if outcome.exit_code == 0 and est is not None:
        rec["error_pct"] = 100.0 * (est["peak_bytes"] - rec["peak_bytes"]) / rec["peak_bytes"]
    else:
        rec.setdefault("stderr_tail", outcome.stderr[-1500:])
    if args.json:
        print(json.dumps(rec))
    elif outcome.exit_code == 0:
        print(f"measured peak {fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes']:,} B) in {rec['peak_phase']}"
              + (f"; estimated {fmt_bytes(est['peak_bytes'])}; error {rec['error_pct']:+.2f}%" if est else
                 "; not estimated (no fit kept yet: `estimate train` makes one)" if fitted else
                 "; not estimated (checkpointing policy)"))
        print(f"peak RSS {fmt_bytes(rec['peak_rss_bytes'])}; step time {rec['step_time_s']:.3f} s")
        if "host_activation_offload_bytes" in rec:  # --offload-activations: the host copies, apart
            print(f"host (offloaded activations) {fmt_bytes(rec['host_activation_offload_bytes'])} "
                  f"({rec['host_activation_offload_bytes']:,} B); {rec['device_figure_note']}")
        if "host_optimizer_offload_bytes" in rec:  # --offload-optimizer: the host copies and states, apart
            print(f"host (offloaded optimizer) {fmt_bytes(rec['host_optimizer_offload_bytes'])} "
                  f"({rec['host_optimizer_offload_bytes']:,} B); {rec['device_figure_note']}")
    else:
        print(f"measurement failed in phase {rec.get('phase')}: {rec['error']}", file=sys.stderr)
    return outcome.exit_code


LOAD_KEYS = ["peak_device_bytes", "peak_cpu_bytes", "peak_cpu_anon_bytes", "peak_cpu_file_bytes", "checkpoint_bytes"]


def _methods(method: str) -> list[str]:
    from ..estimate.loading import METHODS

    return list(METHODS) if method == "all" else [method]


def _check_loadable(cfg) -> None:
    from ..arch import family_of

    if family_of(cfg).basis != "formula":  # issue #20: no parameter inventory without building the model
        raise ConfigError(f"{cfg.model_type}: weight loading is estimated and measured from a formula family's "
                          "parameter inventory; no family file reads this model_type")


def cmd_estimate_load(args) -> int:
    from ..estimate.loading import estimate_loading

    cfg = with_dtype(resolve_model(args.model, args.config), args.dtype)
    _check_loadable(cfg)
    check_device(args.device)
    recs = [estimate_loading(cfg, m, args.device).to_dict() for m in _methods(args.method)]
    if args.json:
        print(json.dumps({"model": config_to_dict(cfg), **(recs[0] if args.method != "all" else {"results": recs})}))
    elif args.method != "all":
        _print_table(recs[0], LOAD_KEYS + ["formula_device", "formula_cpu"])
        for note in recs[0]["notes"]:
            print("note:", note)
    else:
        print(f"checkpoint ({recs[0]['dtype']}) {fmt_bytes(recs[0]['checkpoint_bytes'])}, loaded to {args.device}")
        print(f"{'method':<17} {'device peak':>11} {'CPU peak':>11} {'CPU anon':>11} {'CPU file':>11}  device formula")
        for r in recs:
            print(f"{r['method']:<17} " + " ".join(f"{fmt_bytes(r[k]):>11}" for k in LOAD_KEYS[:4])
                  + f"  {r['formula_device']}")
        for note in dict.fromkeys(n for r in recs for n in r["notes"]):
            print("note:", note)
    return 0


def cmd_measure_load(args) -> int:
    from pathlib import Path

    from ..estimate.loading import check_cache_disk, estimate_loading
    from ..routines_paths import default_cache_dir
    from ..runner import checkpoint_folder, measure_load, user_checkpoint_folder

    cfg = with_dtype(resolve_model(args.model, args.config), args.dtype)
    _check_loadable(cfg)
    check_device(args.device)
    cache = Path(args.cache) if args.cache else default_cache_dir()
    methods = _methods(args.method)
    total = len(methods) + (0 if args.checkpoint else 1)  # writing the checkpoints, then one step per method
    done = []

    def step(stage: str) -> None:  # a JSON progress line with --json --progress, else a line on stderr
        if args.json and args.progress:
            print(json.dumps({"event": "progress", "stage": stage, "fraction": len(done) / total}), flush=True)
        elif not args.json:
            progress(stage)
        done.append(stage)

    info = None
    if args.checkpoint:
        folders = {m: user_checkpoint_folder(Path(args.checkpoint), m, cache) for m in methods}
        info = checkpoint_size(folders[methods[0]])
    else:
        if args.device.startswith("cpu"):
            check_ram_guard(max(estimate_loading(cfg, m, args.device).peak_cpu_bytes for m in methods),
                            "loading's largest CPU peak")
        plan = check_cache_disk(cfg, cache)
        step("checkpoints cached" if plan["cached"] else f"writing checkpoints ({fmt_bytes(plan['total_bytes'])} on disk)")
        try:
            folder = checkpoint_folder(config_to_dict(cfg), cache)
        except RuntimeError as exc:
            if args.json:
                print(json.dumps({"error": str(exc), "phase": "write"}))
            print(f"planner: {exc}", file=sys.stderr)
            return EXIT_FAILED
        folders = {m: folder for m in methods}
    records, code = [], 0
    for i, m in enumerate(methods, start=1):
        step(f"measuring {m} ({i}/{len(methods)})")
        outcome = measure_load(config_to_dict(cfg), m, args.device, folders[m], timeout_s=args.timeout)
        if outcome.exit_code == EXIT_INVALID:
            raise ConfigError(outcome.record.get("error", "invalid request"))
        rec = {k: v for k, v in outcome.record.items() if k != "event"}
        rec["method"] = m
        rec["estimate"] = {k: v for k, v in estimate_loading(cfg, m, args.device).to_dict().items() if k in LOAD_KEYS}
        if info:
            rec["checkpoint"] = info
        records.append(rec)
        code = max(code, outcome.exit_code)
    if args.json:
        print(json.dumps(records[0] if len(records) == 1 else {"results": records}))
    else:
        for r in records:
            if "error" in r:
                print(f"{r['method']:>17}: failed: {r['error']}", file=sys.stderr)
                continue
            e = r["estimate"]
            print(f"{r['method']:>17}: device {fmt_bytes(r['peak_device_bytes'])} (est. {fmt_bytes(e['peak_device_bytes'])}), "
                  f"CPU RSS {fmt_bytes(r['peak_cpu_bytes'])} (est. {fmt_bytes(e['peak_cpu_bytes'])}), "
                  f"{r['load_time_s']:.2f} s, weights match: {r['weights_match']}")
    return code


def cmd_fit(args) -> int:
    from ..fit import default_budget, fit_report, measure_costs

    batch_given = args.batch_size is not None
    if not batch_given:
        args.batch_size = 1
    cfg, spec = parse_train(args)
    if args.measure_costs:
        require_bitsandbytes(spec.optimizer)
    if args.budget:
        budget, source = parse_budget(args.budget), "--budget"
    else:
        budget, source = default_budget(args.device)
    from ..fitted import is_fitted

    if is_fitted(cfg):  # issue #20: answered from the model's fit of simulations (planner/cli/fitted.py)
        if args.measure_costs or args.replay_reserve:
            raise ConfigError(f"{cfg.model_type}: --measure-costs and --replay-reserve need a formula family")
        from .fitted import fit_report_fitted

        rec = {**fit_report_fitted(cfg, spec, budget, batch_given, args), "budget_source": source}
    else:
        costs = measure_costs(cfg, spec, on_step=None if args.json else progress) if args.measure_costs else None
        if args.replay_reserve:
            if not spec.device.startswith("cuda"):
                raise ConfigError("--replay-reserve is the CUDA caching allocator's reserve: give --device cuda")
            from ..fit import fit_report_replayed

            rec = {**fit_report_replayed(cfg, spec, budget, batch_given, costs), "budget_source": source}
        else:
            rec = {**fit_report(cfg, spec, budget, batch_given, costs), "budget_source": source}
    if args.json:
        print(json.dumps(rec))
        return 0
    r = rec["run"]
    print(f"budget {fmt_bytes(budget)} ({source})")
    if rec.get("cuda_context_bytes"):
        reserve = rec.get("allocator_reserve_bytes", 0)
        print(f"  minus the CUDA context {fmt_bytes(rec['cuda_context_bytes'])} (outside the allocator)"
              + (f" and the allocator's reserve {fmt_bytes(reserve)} ({rec.get('allocator_reserve_source', '')})"
                 if reserve else "")
              + f": {fmt_bytes(budget - rec['cuda_context_bytes'] - reserve)} for tensors")
    if batch_given:
        print(f"longest sequence that fits at batch {r['batch_size']}: {rec['max_seq_len']} ({rec['reason']})")
        print(f"batch {r['batch_size']} x seq {r['seq_len']}: peak {fmt_bytes(rec['peak_bytes'])}, "
              + ("fits" if rec["fits"] else f"over the budget by {fmt_bytes(rec['peak_bytes'] - budget)}"))
    elif rec["max_batch_size"]:
        print(f"largest batch that fits at seq {r['seq_len']}: {rec['max_batch_size']}, peak "
              f"{fmt_bytes(rec['peak_bytes'])} ({rec['reason']})")
    else:
        print(f"no batch fits at seq {r['seq_len']}: {rec['reason']}")
    if not rec["fits"]:
        print(f"options for batch {r['batch_size']} x seq {r['seq_len']}, those that fit first, cheapest first:")
        for o in rec["advice"][:10]:
            host = f" + host {fmt_bytes(o['host_bytes'])}" if o.get("host_bytes") else ""  # a budget of its own
            print(f"  {'FITS ' if o['fits'] else 'no   '} {fmt_bytes(o['peak_bytes']):>11}{host}  {o['cost']}")
        for u in rec.get("unranked", []):  # a CPU run's offloads: the device and the host are the same RAM
            print(f"  {u['label']}: {u['why']}")
    return 0


def checkpoint_size(folder) -> dict | None:
    """Size a user's checkpoint without loading it: a safetensors header is read here; a .pth needs torch,
    so it is sized in the child (its measurement record carries file_bytes)."""
    from pathlib import Path

    from ..estimate.loading import safetensors_header_sizes

    path = Path(folder) / "model.safetensors"
    if not path.exists():
        return None
    try:
        sizes = safetensors_header_sizes(path)
    except (OSError, ValueError) as exc:  # a truncated or corrupt header (JSONDecodeError is a ValueError)
        raise ConfigError(f"cannot read {path.resolve().name}: not a valid safetensors file ({exc})") from None
    return {"tensors": len(sizes), "bytes": sum(sizes.values()), "largest": max(sizes.items(), key=lambda kv: kv[1])}


def load_bench():
    """The benchmarks' package: the top-level bench/ beside planner/ in the repository (test and benchmark
    scaffolding, not part of the product, so imported here only, lazily). The repository goes first on sys.path
    when bench/ sits beside this planner/, so `python -m planner bench` works from any directory; without it (an
    installed planner, no repository) the command is refused (exit 2)."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if (root / "bench" / "__init__.py").is_file() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        return importlib.import_module("bench.main")
    except ModuleNotFoundError as exc:
        if exc.name not in ("bench", "bench.main"):
            raise
        raise UsageError("bench: the benchmarks are not installed (they live in the repository's bench/ folder, "
                         "beside planner/; run from a checkout of the repository)") from None


def cmd_bench(args) -> int:
    bench = load_bench()  # bench/main.py; bench.* below are imported after it, from the same folder

    check_device(args.device)
    if args.what == "record":
        from bench.recorded import grids, main as bench_record

        if args.grid != "all" and args.grid not in grids():
            raise ConfigError(f"unknown grid {args.grid!r}; choose one of: {', '.join(grids())}, all")
        from bench.recorded import FAMILY_GRIDS

        if args.family and args.grid not in FAMILY_GRIDS:
            raise ConfigError(f"bench record --family goes with --grid {', '.join(FAMILY_GRIDS)}")
        if args.from_records:
            if args.family:
                raise ConfigError("bench record --from-records re-estimates whole grids: leave out --family")
            from bench.recorded import write_from_records

            return write_from_records(args.grid, out=args.out, progress=progress)
        return bench_record(args.grid, out=args.out, progress=progress, family=args.family)
    if args.what == "finetune-amp":  # fine-tuning under autocast (issue #19): bench/finetune_amp.py
        from bench.finetune_amp import main as bench_amp
        from bench.recorded import load, record

        if args.family:
            raise ConfigError("--family goes with bench families (and bench finetune --family gpt2: the book's GPT-2)")

        full_cpu = not args.quick and args.device == "cpu"  # the full CPU grid is recorded (tests/data/measured)
        recorded = (lambda: load(record("finetune-amp", progress=progress))[1]) if full_cpu else None
        return bench_amp(quick=args.quick, out=args.out, device=args.device, progress=progress, recorded=recorded)
    if args.what == "checkpoint-policies":  # issue #24: bench/techniques.py
        from bench.techniques import main_checkpointing

        return main_checkpointing(quick=args.quick, out=args.out, new_rows=args.new_rows)
    if args.what == "offload-activations":  # issue #24: save_on_cpu measured, simulated, estimated
        from bench.offload_act import main as bench_offload_act

        return bench_offload_act(quick=args.quick, out=args.out, grid=args.grid)  # --grid offgrid: the sweep
    if args.what == "offload":  # issue #24: --offload-optimizer, CPU rows measured (bench/offload_opt.py)
        from bench.techniques import main_offload

        return main_offload(out=args.out)
    if args.what == "losses":  # issue #24: the fused losses' grid (bench/techniques.py)
        from bench.techniques import main as bench_losses

        return bench_losses(quick=args.quick, out=args.out)
    if args.what in ("fitted", "fitted-speed"):  # issue #20: any family by config.json (bench/fitted.py)
        from bench.fitted import main as bench_fitted

        return bench_fitted(args.what, quick=args.quick, out=args.out)
    if args.what == "modules":  # issue #20: user modules, simulate vs measure and the what-if check (bench/modules.py)
        from bench.modules import main as bench_modules

        return bench_modules(quick=args.quick, out=args.out)
    if args.what == "inference-quantized":  # generate() with bitsandbytes weights: bench/infer_quant.py
        from bench.infer_quant import main as bench_infer_quant

        return bench_infer_quant(quick=args.quick, out=args.out, progress=progress)
    if args.what == "inference-caches":  # sliding / quantized / offloaded caches: bench/infer_caches.py
        from bench.infer_caches import main as bench_infer_caches

        return bench_infer_caches(quick=args.quick, out=args.out, progress=progress)
    if args.what == "inference":  # generate()'s peak: bench/inference.py
        from bench.inference import GRID_FAMILIES, main as bench_inference

        if args.family and args.family not in GRID_FAMILIES:
            raise ConfigError(f"bench inference --family: choose one of {', '.join(GRID_FAMILIES)}")
        return bench_inference(quick=args.quick, out=args.out, progress=progress, family=args.family)
    if args.what == "distributed":
        from bench.distributed import main as bench_distributed

        return bench_distributed(quick=args.quick, out=args.out, part=args.family)
    if args.what in ("gpu", "gpu-doc"):
        from bench.gpu import gpu_markdown, run_gpu

        folder = args.out_json or "gpu-records"
        if args.what == "gpu":
            from bench.gpu import PARTS

            parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
            if not parts or set(parts) - set(PARTS):
                raise UsageError(f"--parts: choose from {', '.join(PARTS)}")
            return run_gpu(folder, quick=args.quick, parts=parts)
        text = gpu_markdown(folder)
        print(text)
        if args.out:
            from pathlib import Path

            Path(args.out).write_text(text)
        return 0
    if args.family:  # bench.main says which benchmarks take it
        from ..arch import families

        if args.family not in families():
            raise ConfigError(f"unknown family {args.family!r}; choose one of: {', '.join(families())}")
    return bench.main(args.what, quick=args.quick, out=args.out, device=args.device, family=args.family)


def _stop(signum: int, frame) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):  # the unwinding (ending the worker) runs once, uninterrupted
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def _signals_stop_the_command():
    """SIGINT and SIGTERM raise Stopped while a command runs (main thread only; a SIGINT the shell set to be
    ignored stays ignored); the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _drop_stdout() -> None:
    """stdout's reader has gone (`| head`): send what is left to /dev/null, so the final flush cannot fail."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    with _signals_stop_the_command():
        try:
            args = parser.parse_args(argv)
            default_precision(args)
            if getattr(args, "what", None) == "infer":
                from .infer import cmd_infer

                code = cmd_infer(args)
            elif args.command == "estimate":
                code = cmd_estimate_train(args) if args.what == "train" else cmd_estimate_load(args)
            elif args.command == "measure":
                code = cmd_measure_train(args) if args.what == "train" else cmd_measure_load(args)
            elif args.command == "simulate" and cli_parallel.parallel_requested(args):
                from .simulate import export_paths

                export_paths(args)  # refused with --world-size (exit 2)
                cfg, spec = parse_train(args)
                code = cli_parallel.cmd_simulate(args, cfg, spec)
            elif args.command == "simulate" and args.what == "whatif":
                from .simulate import cmd_simulate_whatif

                code = cmd_simulate_whatif(args)
            elif args.command == "simulate":
                from .simulate import cmd_simulate_train

                code = cmd_simulate_train(args)
            elif args.command == "fit":
                code = cmd_fit(args)
            elif args.command == "plan":
                from .plan import cmd_plan

                code = cmd_plan(args)
            else:
                code = cmd_bench(args)
            sys.stdout.flush()
            return code
        except (UsageError, ConfigError) as exc:
            print(f"planner: error: {exc}", file=sys.stderr)
            return EXIT_INVALID
        except (Stopped, KeyboardInterrupt) as exc:
            signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
            print(f"planner: stopped by {signal.Signals(signum).name}; every process of the run has ended",
                  file=sys.stderr)
            return 128 + signum
        except BrokenPipeError:
            _drop_stdout()
            return 128 + signal.SIGPIPE
