"""`python -m planner`: the JSON command line scripts and CI rely on (its flags and keys are a contract).

    python -m planner estimate train MODEL RUN [--device cpu|cuda[:N]] [--json]
    python -m planner measure  train MODEL RUN --device cpu|cuda[:N] [--json] [--timeout S] [--progress]
    python -m planner estimate load  MODEL --method METHOD [--device cpu|cuda[:N]] [--json]
    python -m planner measure  load  MODEL --method METHOD|all --device ... [--checkpoint PATH] [--json]
    python -m planner fit MODEL --seq-len N [--batch-size N] [RUN options] [--budget SIZE] [--measure-costs] [--json]
    python -m planner bench accuracy|speed|loading|families [--quick] [--out FILE] [--family NAME]
    MODEL: --model PRESET | --config FILE.json
    RUN:   --batch-size N --seq-len N --precision fp32|fp16-amp|bf16-amp|bf16
           --optimizer sgd|sgd-momentum|adam|adamw [--checkpointing] [--attention eager|sdpa]
           [--grad-accum N] [--optimizer-impl default|foreach|for-loop|fused]
           [--loss default|labels|cross-entropy]

Exit codes: 0 success; 2 invalid input (one line on stderr, no traceback); 3 a measurement that ran
out of memory or time, or whose process was killed (JSON with an "error" field on stdout).
Byte figures are integers in bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from .config import ATTENTION_KINDS, PRESETS, ConfigError, config_to_dict, resolve_model
from .spec import LOSSES, OPTIMIZER_IMPLS, OPTIMIZERS, PRECISIONS, TrainSpec, check_device, prepare
from .units import fmt_bytes, parse_size

EXIT_INVALID, EXIT_FAILED = 2, 3
# A CPU measurement may use at most this share of the RAM that is available when it starts: the
# estimate is of live tensors, and the process adds allocator slack and torch itself (~0.3-0.5 GB).
RAM_GUARD_FRACTION = 0.8


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(message)


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help=f"preset: {', '.join(PRESETS)}")
    p.add_argument("--config", help="JSON config file: the planner's own ({\"arch\": ...}) or a Hugging Face "
                                    "config.json (model_type llama, mistral, qwen2, ...)")


def _add_run(p: argparse.ArgumentParser, device_required: bool = False, batch_required: bool = True) -> None:
    p.add_argument("--batch-size", type=int, required=batch_required)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="default")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--attention", choices=ATTENTION_KINDS)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--loss", choices=LOSSES, default="default",
                   help="default: as the model's users train it (transformers: model(input_ids, labels=...).loss; "
                        "the book's GPT-2: cross-entropy over its logits); cross-entropy: the book's loss over the "
                        "returned logits")
    p.add_argument("--device", required=device_required, default=None if device_required else "cpu")
    p.add_argument("--json", action="store_true")


def _add_load(p: argparse.ArgumentParser, measure: bool = False) -> None:
    from .estimate.loading import METHODS

    p.add_argument("--method", required=True, choices=METHODS + (("all",) if measure else ()))
    p.add_argument("--device", required=measure, default=None if measure else "cpu")
    p.add_argument("--json", action="store_true")
    if measure:
        p.add_argument("--checkpoint", help="your own .pth / .safetensors file or HF folder (read, never written)")
        p.add_argument("--cache", help="folder for the generated checkpoints (default ~/.cache/torch-memory-planner)")
        p.add_argument("--timeout", type=float, default=600.0)


def build_parser() -> _Parser:
    parser = _Parser(prog="python -m planner", description="Torch Memory Planner")
    top = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    est = top.add_parser("estimate").add_subparsers(dest="what", required=True, parser_class=_Parser)
    p = est.add_parser("train")
    _add_model(p)
    _add_run(p)
    p = est.add_parser("load")
    _add_model(p)
    _add_load(p)
    mea = top.add_parser("measure").add_subparsers(dest="what", required=True, parser_class=_Parser)
    p = mea.add_parser("train")
    _add_model(p)
    _add_run(p, device_required=True)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the child is killed (exit 3)")
    p.add_argument("--memory-limit", help="cap the child's extra address space (e.g. 2GiB) to rehearse a smaller machine")
    p.add_argument("--progress", action="store_true", help="print JSON progress lines before the result (with --json)")
    p = mea.add_parser("load")
    _add_model(p)
    _add_load(p, measure=True)
    p = top.add_parser("fit")
    _add_model(p)
    _add_run(p, batch_required=False)
    p.add_argument("--budget", help="memory budget: bytes or units (24GiB, 800MB); default: GPU total minus "
                                    "the CUDA context, else the RAM available now")
    p.add_argument("--measure-costs", action="store_true",
                   help="measure checkpointing's and gradient accumulation's step-time cost here (a 2-block proxy)")
    b = top.add_parser("bench")
    b.add_argument("what", choices=("accuracy", "speed", "loading", "gpu", "families"))
    b.add_argument("--family", help="families: only this one (planner/arch arch name, e.g. qwen3)")
    b.add_argument("--quick", action="store_true", help="a small grid (what the tests run)")
    b.add_argument("--out", help="write the table as markdown to this file")
    b.add_argument("--device", default="cpu")
    b.add_argument("--out-json", help="gpu: folder for the raw JSON-lines records")
    return parser


def parse_train(args) -> tuple:
    cfg = resolve_model(args.model, args.config)
    check_device(args.device)
    spec = TrainSpec(batch_size=args.batch_size, seq_len=args.seq_len, precision=args.precision,
                     optimizer=args.optimizer, checkpointing=args.checkpointing, grad_accum=args.grad_accum,
                     optimizer_impl=args.optimizer_impl, device=args.device, loss=args.loss)
    return prepare(cfg, spec, args.attention), spec


def _estimate_record(cfg, spec) -> dict:
    from .estimate.training import estimate_training

    est = estimate_training(cfg, spec).to_dict()
    return {"model": config_to_dict(cfg), "run": asdict(spec), **est}


def _print_table(rec: dict, keys: list[str]) -> None:
    width = max(len(k) for k in keys)
    for k in keys:
        v = rec.get(k)
        if isinstance(v, int) and k.endswith("_bytes"):
            print(f"{k:<{width}}  {fmt_bytes(v):>12}  ({v:,} B)")
        elif v is not None:
            print(f"{k:<{width}}  {v}")


ESTIMATE_KEYS = ["params_bytes", "buffers_bytes", "inputs_bytes", "grads_bytes", "optimizer_bytes",
                 "activations_bytes", "peak_bytes", "peak_phase"]


def cmd_estimate_train(args) -> int:
    cfg, spec = parse_train(args)
    rec = _estimate_record(cfg, spec)
    if args.json:
        print(json.dumps(rec))
    else:
        _print_table(rec, ESTIMATE_KEYS)
        print("phase peaks:", ", ".join(f"{k} {fmt_bytes(v)}" for k, v in rec["phase_peak_bytes"].items()))
    return 0


def cmd_measure_train(args) -> int:
    from .runner import run_worker

    cfg, spec = parse_train(args)
    est = _estimate_record(cfg, spec)
    if spec.device_type == "cpu":
        import psutil

        available = psutil.virtual_memory().available
        if est["peak_bytes"] > RAM_GUARD_FRACTION * available:
            raise ConfigError(f"refused: the estimated peak {fmt_bytes(est['peak_bytes'])} exceeds "
                              f"{RAM_GUARD_FRACTION:.0%} of the {fmt_bytes(available)} of RAM available now")
    payload = {"config": config_to_dict(cfg), "spec": asdict(spec)}
    if args.memory_limit:
        try:
            payload["memory_limit_bytes"] = parse_size(args.memory_limit)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    show_progress = args.json and args.progress
    outcome = run_worker(payload, timeout_s=args.timeout,
                         on_event=lambda e: print(json.dumps(e), flush=True) if show_progress
                         and e.get("event") == "progress" else None)
    if outcome.exit_code == EXIT_INVALID:
        raise ConfigError(outcome.record.get("error", "invalid request"))
    rec = {k: v for k, v in outcome.record.items() if k != "event"}
    rec["estimate"] = {k: est[k] for k in ESTIMATE_KEYS + ["phase_peak_bytes"]}
    if outcome.exit_code == 0:
        rec["error_pct"] = 100.0 * (est["peak_bytes"] - rec["peak_bytes"]) / rec["peak_bytes"]
    else:
        rec.setdefault("stderr_tail", outcome.stderr[-1500:])
    if args.json:
        print(json.dumps(rec))
    elif outcome.exit_code == 0:
        print(f"measured peak {fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes']:,} B) in {rec['peak_phase']}; "
              f"estimated {fmt_bytes(est['peak_bytes'])}; error {rec['error_pct']:+.2f}%")
        print(f"peak RSS {fmt_bytes(rec['peak_rss_bytes'])}; step time {rec['step_time_s']:.3f} s")
    else:
        print(f"measurement failed in phase {rec.get('phase')}: {rec['error']}", file=sys.stderr)
    return outcome.exit_code


LOAD_KEYS = ["peak_device_bytes", "peak_cpu_bytes", "peak_cpu_anon_bytes", "peak_cpu_file_bytes", "checkpoint_bytes"]


def cmd_estimate_load(args) -> int:
    from .estimate.loading import estimate_loading

    cfg = resolve_model(args.model, args.config)
    check_device(args.device)
    rec = {"model": config_to_dict(cfg), **estimate_loading(cfg, args.method, args.device).to_dict()}
    if args.json:
        print(json.dumps(rec))
    else:
        _print_table(rec, LOAD_KEYS + ["formula_device", "formula_cpu"])
        for note in rec["notes"]:
            print("note:", note)
    return 0


def cmd_measure_load(args) -> int:
    from pathlib import Path

    from .estimate.loading import METHODS, estimate_loading
    from .routines_paths import default_cache_dir
    from .runner import checkpoint_folder, measure_load, user_checkpoint_folder

    cfg = resolve_model(args.model, args.config)
    check_device(args.device)
    cache = Path(args.cache) if args.cache else default_cache_dir()
    methods = list(METHODS) if args.method == "all" else [args.method]
    info = None
    if args.checkpoint:
        folders = {m: user_checkpoint_folder(Path(args.checkpoint), m, cache) for m in methods}
        info = checkpoint_size(folders[methods[0]])
    else:
        if args.device.startswith("cpu"):
            import psutil

            need = max(estimate_loading(cfg, m, args.device).peak_cpu_bytes for m in methods)
            available = psutil.virtual_memory().available
            if need > RAM_GUARD_FRACTION * available:
                raise ConfigError(f"refused: loading needs up to {fmt_bytes(need)}, more than "
                                  f"{RAM_GUARD_FRACTION:.0%} of the {fmt_bytes(available)} of RAM available now")
        folder = checkpoint_folder(config_to_dict(cfg), cache)
        folders = {m: folder for m in methods}
    records, code = [], 0
    for m in methods:
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
    from .fit import default_budget, fit_report, measure_costs

    batch_given = args.batch_size is not None
    if not batch_given:
        args.batch_size = 1
    cfg, spec = parse_train(args)
    if args.budget:
        try:
            budget, source = parse_size(args.budget), "--budget"
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    else:
        budget, source = default_budget(args.device)
    if budget <= 0:
        raise ConfigError(f"the budget must be positive, got {args.budget}")
    costs = measure_costs(cfg, spec) if args.measure_costs else None
    rec = {**fit_report(cfg, spec, budget, batch_given, costs), "budget_source": source}
    if args.json:
        print(json.dumps(rec))
        return 0
    key = "max_seq_len" if batch_given else "max_batch_size"
    print(f"budget {fmt_bytes(budget)} ({source}): {key} = {rec[key]} ({rec['reason']})")
    r = rec["run"]
    print(f"run batch {r['batch_size']} x seq {r['seq_len']}: peak {fmt_bytes(rec['peak_bytes'])}, "
          f"{'fits' if rec['fits'] else 'does not fit'}")
    for o in rec["advice"][:10]:
        print(f"  {'FITS ' if o['fits'] else 'no   '} {fmt_bytes(o['peak_bytes']):>11}  {o['cost']}")
    return 0


def checkpoint_size(folder) -> dict | None:
    """Size a user's checkpoint without loading it: a safetensors header is read here; a .pth needs torch,
    so it is sized in the child (its measurement record carries file_bytes)."""
    from pathlib import Path

    from .estimate.loading import safetensors_header_sizes

    path = Path(folder) / "model.safetensors"
    if not path.exists():
        return None
    try:
        sizes = safetensors_header_sizes(path)
    except (OSError, ValueError) as exc:  # a truncated or corrupt header (JSONDecodeError is a ValueError)
        raise ConfigError(f"cannot read {path.resolve().name}: not a valid safetensors file ({exc})") from None
    return {"tensors": len(sizes), "bytes": sum(sizes.values()), "largest": max(sizes.items(), key=lambda kv: kv[1])}


def cmd_bench(args) -> int:
    from . import bench

    check_device(args.device)
    if args.what == "gpu":
        from .bench_gpu import run_gpu

        return run_gpu(args.out_json or "gpu-records", quick=args.quick)
    if args.family and args.what != "families":
        raise ConfigError("--family goes with bench families")
    if args.family:
        from .arch import families

        if args.family not in families():
            raise ConfigError(f"unknown family {args.family!r}; choose one of: {', '.join(families())}")
    return bench.main(args.what, quick=args.quick, out=args.out, device=args.device, family=args.family)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "estimate":
            return cmd_estimate_train(args) if args.what == "train" else cmd_estimate_load(args)
        if args.command == "measure":
            return cmd_measure_train(args) if args.what == "train" else cmd_measure_load(args)
        if args.command == "fit":
            return cmd_fit(args)
        return cmd_bench(args)
    except (UsageError, ConfigError) as exc:
        print(f"planner: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
