"""`python -m planner estimate|simulate|measure infer`: the peak of one generate() call (planner/infer_spec.py).

    python -m planner estimate infer --model llama-3-8b --batch-size 8 --prompt-len 30000 --new-tokens 2000 \
        --precision bf16 --attention sdpa --cache dynamic --json
    python -m planner measure  infer --config my.json --batch-size 2 --prompt-len 64 --new-tokens 8 --json \
        [--progress] [--timeout S] [--memory-limit 2GiB]
    python -m planner simulate infer --model llama-3-8b --batch-size 8 --prompt-len 32768 --new-tokens 16 --json
    python -m planner estimate infer --model llama-3.1-8b --batch-size 1 --prompt-len 7936 --new-tokens 256 \
        --precision bf16 --device cuda --budget 80GiB     # and how many sequences fit (the Planner page's figures)

The estimate needs no torch; measure and simulate run the call in a child process (planner.measure.worker
kinds "infer" and "simulate-infer"). Bad input: exit 2 with one line; out of memory or time: exit 3.
"""
from __future__ import annotations

import argparse
import json
import sys

from .args import EXIT_INVALID, _add_model
from ..config import ConfigError, config_to_dict, resolve_model, with_attention
from ..infer_spec import CACHES, BOOK_CACHES, INFER_PRECISIONS, WEIGHT_QUANT, InferSpec, check_infer
from ..units import fmt_bytes, parse_budget, parse_size

INFER_KEYS = ["peak_bytes", "peak_phase", "persistent_bytes"]


def add_infer(group, command, kind: str) -> None:
    """Add the `infer` subcommand to estimate / measure / simulate (`group` is its subparsers)."""
    text = {"estimate": "The peak memory of one generate() call (prefill and decode), term by term (no torch).",
            "measure": "Run one real generate() call in a child process; measured against estimated.",
            "simulate": "Run one generate() call on fake tensors in a child process: its exact peak at any size."}[kind]
    p = command(group, "infer", text)
    p.add_argument("model_name", nargs="?", metavar="MODEL", help="a preset (the same as --model; default: none, give --model or --config)")
    _add_model(p)
    p.add_argument("--batch-size", type=int, required=True, help="prompts generated together")
    p.add_argument("--prompt-len", type=int, required=True, help="tokens per prompt")
    p.add_argument("--new-tokens", type=int, required=True, help="tokens generated per prompt (all of them: "
                                                                 "min_new_tokens = max_new_tokens)")
    p.add_argument("--precision", choices=INFER_PRECISIONS, default="fp32", help="the weights' dtype (default: %(default)s)")
    p.add_argument("--attention", choices=("eager", "sdpa"), default=None, help="attention kernel (default: the config's)")
    p.add_argument("--cache", choices=CACHES + BOOK_CACHES, default=None,
                   help="dynamic (generate's default DynamicCache) | static (cache_implementation='static') | "
                        "sliding (the DynamicCache of a model with a sliding window: its sliding layers keep the window) | "
                        "quantized (QuantizedCache, fp8 backend) | offloaded (DynamicCache(offloading=True), CUDA); "
                        "the book's GPT-2: none (default: the family's first: dynamic, or none)")
    p.add_argument("--quantize-weights", choices=WEIGHT_QUANT, default="none", help="bitsandbytes weight quantization as BitsAndBytesConfig loads it: int8 (LLM.int8) | nf4 | fp4 "
                        "(compute dtype = --precision; default: %(default)s)")
    p.add_argument("--double-quant", action="store_true", help="with nf4 / fp4: bnb_4bit_use_double_quant")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the record as JSON (default: a short text)")
    if kind == "estimate":
        p.add_argument("--budget", help="memory budget of the device (24GiB, 80GB, bytes): the record adds `fit`, the "
                                        "largest batch at this context, the longest context at this batch and the KV "
                                        "cache tokens that fit (planner.serving; the CUDA context off on cuda; "
                                        "default: none)")
        from .compute import _add_gpu

        _add_gpu(p)
    if kind != "estimate":
        p.add_argument("--timeout", type=float, default=600.0, help="seconds before the child is killed (exit 3; default: %(default)s)")
        p.add_argument("--progress", action="store_true", help="with --json: JSON progress lines before the result (default: none)")
    if kind == "measure":
        p.add_argument("--memory-limit", help="cap the child's extra address space (e.g. 2GiB; default: no cap)")


def parse_infer(args: argparse.Namespace):
    if args.model_name and (args.model or args.config):
        raise ConfigError("give the model once: MODEL, --model or --config")
    cfg = resolve_model(args.model_name or args.model, args.config)
    if args.attention:
        cfg = with_attention(cfg, args.attention)
    from ..arch import family_of

    cache = args.cache or family_of(cfg).infer_caches(cfg)[0]
    ispec = InferSpec(batch_size=args.batch_size, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                      precision=args.precision, cache=cache, quantize_weights=args.quantize_weights,
                      device=args.device, double_quant=args.double_quant)
    check_infer(cfg, ispec)
    return cfg, ispec


def estimate_record(cfg, ispec) -> dict:
    from ..estimate.inference import estimate_inference

    est = estimate_inference(cfg, ispec)  # a family it does not model: ConfigError, one line
    return {"model": config_to_dict(cfg), "run": ispec.to_dict(), **est}


def fit_record(cfg, ispec, budget_text: str) -> dict:
    """`estimate infer --budget`: what the Planner page's inference mode answers for this budget, from the same
    facade (planner.serving.plan_inference): does it fit, the largest batch at this context, the longest context
    at this batch, the KV cache tokens that fit beside the weights (vLLM's rule beside it, theirs)."""
    from ..serving import plan_inference

    budget = parse_budget(budget_text)
    p = plan_inference(cfg, ispec, budget)
    return {"budget_bytes": budget, "cuda_context_bytes": p.cuda_context_bytes,
            "tensor_budget_bytes": p.tensor_budget_bytes, "fits": p.fits, "max_batch_size": p.max_batch,
            "max_batch_reason": p.max_batch_reason, "max_context": p.max_context,
            "max_context_reason": p.max_context_reason, "kv_cache_tokens": p.kv_tokens,
            "kv_cache_tokens_vllm": p.kv_tokens_vllm}


def cmd_infer(args: argparse.Namespace) -> int:
    cfg, ispec = parse_infer(args)
    if args.command != "estimate" and ispec.cache == "offloaded" and ispec.device_type != "cuda":
        from ..estimate.infer_caches import CUDA_ONLY

        raise ConfigError(f"{args.command} --cache offloaded: {CUDA_ONLY}")
    if args.command != "estimate" and ispec.quantize_weights != "none":
        from ..bnb import bnb_available

        if not bnb_available():
            raise ConfigError(f"--quantize-weights {ispec.quantize_weights} needs bitsandbytes to {args.command} "
                              "(pip install bitsandbytes); the estimate alone does not")
        if args.command == "simulate" and ispec.quantize_weights == "int8":
            raise ConfigError("simulating --quantize-weights int8 is not supported (bitsandbytes' Int8Params cannot "
                              "wrap a fake tensor); measure it, or simulate nf4 / fp4")
    if args.command == "estimate":
        from ..gpus import gpu as lookup_gpu
        from .compute import compute_fields

        if getattr(args, "gpu", None):
            lookup_gpu(args.gpu)  # a bad name: exit 2 before any estimate
        rec = estimate_record(cfg, ispec)
        if getattr(args, "budget", None):
            rec["fit"] = fit_record(cfg, ispec, args.budget)
        rec.update(compute_fields(cfg, ispec, getattr(args, "gpu", None), infer=True))
        if args.json:
            print(json.dumps(rec))
        else:
            print(f"peak {fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes']:,} B) in {rec['peak_phase']}")
            print(f"FLOPs: {rec['flops_per_step']:,}" + (
                f"; on {rec['gpu']}: {rec['step_time_s']:.4g} s, {rec['tokens_per_s']:,.0f} new tokens/s "
                "(roofline, not a measurement)" if "step_time_s" in rec else ""))
            for k, v in rec["components"].items():
                print(f"  {k:12s} {fmt_bytes(v)}")
            print("phase peaks:", ", ".join(f"{k} {fmt_bytes(v)}" for k, v in rec["phase_peak_bytes"].items()))
            if "fit" in rec:
                f = rec["fit"]
                print(f"budget {fmt_bytes(f['budget_bytes'])}: {fmt_bytes(f['tensor_budget_bytes'])} for tensors; "
                      + ("fits" if f["fits"] else "does not fit"))
                print(f"largest batch at {ispec.total_len:,} tokens: {f['max_batch_size']} ({f['max_batch_reason']})")
                print(f"longest context at batch {ispec.batch_size}: {f['max_context']:,} ({f['max_context_reason']})")
                if f["kv_cache_tokens"] or f["kv_cache_tokens_vllm"]:
                    print(f"KV cache tokens that fit beside the weights: {f['kv_cache_tokens']:,} "
                          f"(vLLM's rule, theirs: {f['kv_cache_tokens_vllm']:,})")
        return 0
    from ..runner import run_worker

    payload = {"kind": "infer" if args.command == "measure" else "simulate-infer",
               "config": config_to_dict(cfg), "spec": ispec.to_dict()}
    if getattr(args, "memory_limit", None):
        try:
            payload["memory_limit_bytes"] = parse_size(args.memory_limit)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    try:
        est = estimate_record(cfg, ispec)
    except ConfigError:
        est = None  # a family the estimate does not cover yet: measured alone

    def on_event(event: dict) -> None:
        if event.get("event") == "progress" and args.json and args.progress:
            print(json.dumps(event), flush=True)

    outcome = run_worker(payload, timeout_s=args.timeout, on_event=on_event)
    if outcome.exit_code == EXIT_INVALID:
        raise ConfigError(outcome.record.get("error", "invalid request"))
    rec = {k: v for k, v in outcome.record.items() if k != "event"}
    if est is not None:
        rec["estimate"] = {k: est[k] for k in INFER_KEYS + ["phase_peak_bytes", "components"]}
        if outcome.exit_code == 0:
            rec["error_pct"] = 100.0 * (est["peak_bytes"] - rec["peak_bytes"]) / rec["peak_bytes"]
    if outcome.exit_code != 0:
        rec.setdefault("stderr_tail", outcome.stderr[-1500:])
    if args.json:
        print(json.dumps(rec))
    elif outcome.exit_code == 0:
        line = f"{rec['kind']} peak {fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes']:,} B) in {rec['peak_phase']}"
        if est is not None:
            line += f"; estimated {fmt_bytes(est['peak_bytes'])}; error {rec['error_pct']:+.2f}%"
        print(line)
    else:
        print(f"{args.command} failed in phase {rec.get('phase')}: {rec.get('error')}", file=sys.stderr)
    return outcome.exit_code
