"""`python -m planner plan`: the plan search (planner/search.py) on the command line (no torch).

    python -m planner plan MODEL --seq-len N [--tokens-per-step T] (--budget SIZE | --gpu NAME) [--gpus N]
                           [--task finetune|train] [--allow lora,qlora] [--optimizer O] [--host-ram SIZE] [--json]

Answers {"best": PLAN, "plans": [PLAN, ...] (the fastest of each quality class, best class first), "pareto": [...]}
with PLAN = {"flags", "peak_bytes", "flops_per_step", "step_time_s", "tokens_per_s", "quality", ...}; each plan's
flags run as is after `python -m planner estimate|simulate|measure train`. Times come from the compute model
(planner/estimate/compute.py's price: a roofline over the --gpu's catalog rates); with --budget and no --gpu the
plans are ranked on the memory side only ("time_model": null and a note) and their time fields are null. Nothing fits: exit 2 with the smallest
peak found (one line on stderr; with --json, {"best": null, "smallest": PLAN} on stdout as well).
"""
from __future__ import annotations

import argparse
import json
import sys

from ..config import ConfigError, resolve_model
from ..units import fmt_bytes, parse_size
from .args import EXIT_INVALID, _add_model

NO_TIME_MODEL_INFER = ("no time model: no --gpu was given (the roofline needs a GPU's rates, planner/gpus.py), so "
                       "plans are ranked on the memory side only (the largest batch that fits, then the smallest "
                       "peak); no rate is given")
NO_TIME_MODEL = ("no time model: no --gpu was given (the roofline needs a GPU's rates, planner/gpus.py), so plans "
                 "are ranked on the memory side only (the cost rank of their slowing changes, planner/fit.py CHANGES, "
                 "then the fewest micro-batches, then the smallest peak); no time is given")


def add_plan(top, command) -> None:
    p = command(top, "plan", "Search every combination of settings that fits a GPU; the fastest plan per quality "
                             "class and the Pareto front of memory against time (planner/search.py).")
    _add_model(p)
    p.add_argument("--seq-len", type=int, help="tokens per sample (no default: required but with --infer)")
    p.add_argument("--tokens-per-step", type=int,
                   help="tokens per optimizer step, held by every plan (micro-batch x accumulation x ranks x "
                        "seq-len) (default: one sample, the --seq-len)")
    p.add_argument("--gpu", help="a GPU of the catalog (planner/gpus.py): its memory is the budget and its peak rates "
                                 "price the plans (default: none; give it or --budget)")
    p.add_argument("--gpus", type=int, default=1, help="how many of them (data-parallel layouts up to this many ranks)")
    p.add_argument("--budget", help="one GPU's memory: bytes or units (24GiB); with --gpu, instead of its own (default: the --gpu's)")
    p.add_argument("--host-ram", help="the host's RAM for the offloads and paged states (default: this machine's)")
    p.add_argument("--task", choices=("finetune", "train"), default="finetune",
                   help="finetune (a pretrained model: --allow may add LoRA / QLoRA) or train (from scratch)")
    p.add_argument("--allow", default="", help="a different task the search may answer: lora, qlora or lora,qlora "
                                               "(default: none, the task as asked)")
    p.add_argument("--optimizer", default="adamw", help="the optimizer the task uses (adamw: its 8-bit and paged "
                                                         "variants are searched too)")
    p.add_argument("--infer", action="store_true",
                   help="plan generate() instead: weight precision x quantization x KV cache x batch, the most "
                        "tokens/s that fit (needs --prompt-len and --new-tokens); plans run with estimate|simulate|"
                        "measure infer")
    p.add_argument("--prompt-len", type=int, help="--infer: tokens per prompt (no default: required with --infer)")
    p.add_argument("--new-tokens", type=int, help="--infer: tokens generated per prompt (no default: required with --infer)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout (bytes as integers)")


def _catalog_gpu(name: str):
    """The catalog's entry for `name` (planner/gpus.py; an unknown name: ConfigError listing the known ones)."""
    from ..gpus import gpu

    return gpu(name)


def _gpu_memory(gpu) -> int:
    """The GPU's memory: the budget the fit takes the CUDA context and the allocator's reserve from."""
    return gpu.memory_bytes


def _half(gpu) -> str:
    """bf16 where the GPU has a BF16 tensor path, else fp16 (T4: planner/gpus.py bf16_flops None)."""
    return "bf16" if gpu.bf16_flops is not None else "fp16"


def time_model(gpu):
    """The search's time_of: the compute model's roofline (planner/estimate/compute.py price), None without a GPU."""
    if gpu is None:
        return None
    from ..estimate.compute import price, price_infer
    from ..infer_spec import InferSpec

    def time_of(cfg, spec, pspec=None):
        if isinstance(spec, InferSpec):
            return price_infer(cfg, spec, gpu)
        return price(cfg, spec, gpu, world=pspec.world_size if pspec is not None else 1)

    return time_of


def cmd_plan(args) -> int:
    from ..search import search

    cfg = resolve_model(args.model, args.config)
    model_flags = ["--model", args.model] if args.model else ["--config", args.config]
    gpu = _catalog_gpu(args.gpu) if args.gpu else None
    try:
        budget = parse_size(args.budget) if args.budget else (_gpu_memory(gpu) if gpu is not None else None)
        host = parse_size(args.host_ram) if args.host_ram else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if budget is None:
        raise ConfigError("give --budget SIZE (one GPU's memory) or --gpu NAME")
    if host is None:
        import psutil

        host = psutil.virtual_memory().total
    if args.infer:
        if args.prompt_len is None or args.new_tokens is None:
            raise ConfigError("--infer needs --prompt-len P and --new-tokens N")
        if args.seq_len is not None or args.tokens_per_step is not None or args.allow or args.task != "finetune":
            raise ConfigError("--infer plans generate(): --seq-len, --tokens-per-step, --allow and --task are training's")
        if args.gpus != 1:
            raise ConfigError("--infer plans one GPU's generate() (no tensor-parallel serving is searched): leave out --gpus")
        from ..search import search_infer

        res = search_infer(cfg, prompt_len=args.prompt_len, new_tokens=args.new_tokens, budget=budget, host_ram=host,
                           half=_half(gpu) if gpu is not None else "bf16", time_of=time_model(gpu))
        head = {"budget_bytes": budget, "gpus": args.gpus, "host_ram_bytes": host, "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens, "task": "infer"}
        return _answer(args, res, head, model_flags, budget, "infer")
    if args.prompt_len is not None or args.new_tokens is not None:
        raise ConfigError("--prompt-len and --new-tokens go with --infer")
    if args.seq_len is None:
        raise ConfigError("the following arguments are required: --seq-len (or --infer)")
    allow = tuple(a.strip() for a in args.allow.split(",") if a.strip())
    tokens = args.tokens_per_step or args.seq_len
    res = search(cfg, seq_len=args.seq_len, tokens_per_step=tokens, budget=budget, gpus=args.gpus, host_ram=host,
                 task=args.task, allow=allow, optimizer=args.optimizer, half=_half(gpu) if gpu is not None else "bf16",
                 time_of=time_model(gpu))
    head = {"budget_bytes": budget, "gpus": args.gpus, "host_ram_bytes": host, "seq_len": args.seq_len,
            "tokens_per_step": tokens, "task": args.task, "allow": list(allow)}
    return _answer(args, res, head, model_flags, budget, "train")


def _answer(args, res, head: dict, model_flags: list[str], budget: int, verb: str) -> int:
    from ..search import INFER_QUALITY, QUALITY

    head["time_model"] = "planner/estimate/compute.py price (a roofline)" if res.timed else None
    head["search"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.stats.items()}
    if not res.timed:
        head["note"] = NO_TIME_MODEL if verb == "train" else NO_TIME_MODEL_INFER
    if res.best is None:
        small = res.smallest
        why = ("nothing in the searched space fits: the smallest peak found is "
               + (f"{fmt_bytes(small.peak_bytes)} ({small.peak_bytes:,} B) against {fmt_bytes(small.budget_bytes)} "
                  f"for tensors ({' '.join(small.flags(model_flags))})" if small else "none (no combination is modelled)"))
        if args.json:
            print(json.dumps({"best": None, "plans": [], "pareto": [],
                              "smallest": small.to_dict(model_flags) if small else None, **head}))
        print(f"planner: error: {why}", file=sys.stderr)
        return EXIT_INVALID
    plans = [res.by_quality[q] for q in (QUALITY if verb == "train" else INFER_QUALITY) if q in res.by_quality]
    rec = {"best": res.best.to_dict(model_flags), "plans": [p.to_dict(model_flags) for p in plans],
           "pareto": [p.to_dict(model_flags) for p in res.pareto], "fitting": len(res.plans), **head}
    if args.json:
        print(json.dumps(rec))
        return 0
    print(f"{len(res.plans)} of {res.stats['combinations']} combinations fit {args.gpus} x {fmt_bytes(budget)} "
          f"({res.stats['seconds'] * 1e3:.0f} ms, {res.stats['estimates']} estimates)")
    if not res.timed:
        print(f"note: {head['note']}")
    for p in plans:
        mark = "best " if p is res.best else "     "
        t = f"{p.step_time_s:.3f} s, {p.tokens_per_s:,.0f} tok/s" if p.step_time_s else "time not modelled"
        print(f"{mark}{p.quality:<6} peak {fmt_bytes(p.peak_bytes):>11}  {t}")
        print(f"       python -m planner estimate {verb} {' '.join(p.flags(model_flags))}")
    return 0
