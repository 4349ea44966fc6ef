"""The plan search (planner/search.py, issue #35 item 3) and `python -m planner plan` (planner/cli/plan.py).

The search is checked against the exhaustive enumeration of its own space: every combination estimated at every
micro-batch, no pruning. With test cost functions (the compute model is priced elsewhere), no fitting plan of the
enumeration is faster than the answer of its quality class."""
from __future__ import annotations

import contextlib
import io
import json
import zlib

import pytest

from planner.cli.args import default_precision, parse_train
from planner.cli.main import build_parser, main
from planner.config import resolve_model, with_attention
from planner.estimate.training import CUDA_CONTEXT_BYTES, estimate_training
from planner.fit import tensor_budget
from planner.search import (QUALITY, TASK_CLASSES, Combo, _Space, combinations, pareto_front, quality_of, rank,
                            search, spec_of)
from planner.spec import TrainSpec

GiB = 2**30


def _sdpa(cfg):
    """The attention the search runs: sdpa, or the family's own where it has none (Gemma 2)."""
    try:
        return with_attention(cfg, "sdpa")
    except ValueError:
        return cfg


def _kernels(cfg):
    """The attention kernels the search tries, preferred first (planner/search.py search)."""
    fast = _sdpa(cfg)
    return [fast] if fast.attention == cfg.attention else [fast, cfg]


def crc_time(cfg, spec, pspec=None):
    """A test cost: an arbitrary per-combination weight in [1, 2) (a hash of the settings, micro-batch aside) times
    (1 + 1/micro-batch): per-micro-batch overhead, so the largest fitting micro-batch is a combination's fastest."""
    key = repr((spec.precision, spec.optimizer, spec.checkpointing, spec.checkpoint_policy, spec.loss,
                spec.offload_optimizer, spec.offload_activations, spec.lora_r, spec.quantize_base,
                pspec and (pspec.parallel, pspec.world_size)))
    return (1 + (zlib.crc32(key.encode()) % 1000) / 1000) * (1 + 1 / spec.batch_size)


def roofline_like_time(cfg, spec, pspec=None):
    """A second test cost, the usual shape: recompute and offloads and the fused losses cost time, more ranks
    save it, bf16 is faster than fp32; a dict as the compute model answers (flops passed through)."""
    t = 4.0 if spec.precision == "fp32" else 1.0
    t *= {False: 1.0, True: 1.33}[spec.checkpointing] if spec.checkpoint_policy == "full" else 1.15
    t *= 1.5 if spec.offload_optimizer else 1.0
    t *= 1.4 if spec.offload_activations else 1.0
    t *= 1.02 if spec.loss != "default" else 1.0
    t /= pspec.world_size * (0.9 if pspec.parallel == "fsdp" else 0.95) if pspec else 1
    t *= 1 + 0.05 / spec.batch_size
    return {"step_time_s": t, "flops_per_step": 1e12 * t}


def enumerate_all(cfg, seq_len, tokens, budget, host, combos):
    """Every (combination, micro-batch) whose estimate fits: no pruning, no bisection."""
    space = _Space(_kernels(cfg), seq_len, tokens // seq_len)
    out = []
    for c in combos:
        try:
            micros = space.micro_batches(c)
        except Exception:
            continue
        if not space.valid(c):
            continue
        tb = tensor_budget(budget, "cuda", c.checkpointing is not None)
        for m in micros:
            got = space.peak(c, m)
            if got is not None and got[0] <= tb and got[1] <= host:
                out.append((c, m, got[0], space.spec(c, m)))
    return out


@pytest.mark.parametrize("model,gpus,allow", [("gemma-2-2b", 1, ()), ("gpt2-small", 2, ()),
                                              ("qwen3-0.6b", 1, ("lora", "qlora"))])
def test_search_matches_the_exhaustive_enumeration(model, gpus, allow):
    cfg = resolve_model(model, None)
    seq, tokens, host = 256, 1024, 64 * GiB
    combos = combinations(_sdpa(cfg), "finetune", allow, gpus, tokens // seq)
    if allow:  # a small LoRA space: its estimates walk every block (the full one is the canonical test's)
        combos = [c for c in combos if c.precision == "bf16" and c.loss == "default" and not c.offload_optimizer]
    # budgets around the space's peaks: some fit, some do not
    peaks = sorted(estimate_training(_sdpa(cfg), spec_of(c, seq, 1, 1)).peak_bytes
                   for c in combos[::7] if c.layout == "single" and c.checkpointing in (None, "full")
                   and not c.offload_activations and not c.offload_optimizer)
    for q in ((0.6,) if allow else (0.2, 0.6)):
        budget = int(peaks[int(q * (len(peaks) - 1))] * 1.2) + CUDA_CONTEXT_BYTES
        every = enumerate_all(cfg, seq, tokens, budget, host, combos)
        assert every, "the budget should let some combination fit"
        largest = {}
        for c, m, _, _ in every:
            largest[c] = max(largest.get(c, 0), m)
        first = search(cfg, seq_len=seq, tokens_per_step=tokens, budget=budget, gpus=gpus, host_ram=host,
                       allow=allow, combos=combos)
        for time_of in (crc_time, roofline_like_time):
            res = rank(cfg, first.plans, first.smallest, first.stats, tokens, time_of)
            # pruning and bisection keep exactly what the enumeration keeps, each at its largest micro-batch
            assert {p.combo: p.spec.batch_size for p in res.plans} == largest
            for p in res.plans:
                assert p.peak_bytes <= p.budget_bytes and p.host_bytes <= host
            # no fitting plan of the enumeration is faster than the answer of its class
            for q_class in QUALITY:
                times = [_seconds(time_of(cfg, s, _pspec(c))) for c, _, _, s in every if quality_of(s) == q_class]
                if times:
                    assert res.by_quality[q_class].step_time_s == pytest.approx(min(times))
                else:
                    assert q_class not in res.by_quality
            task = [p for p in res.plans if p.quality in TASK_CLASSES]
            assert res.best is (min(task, key=lambda p: (p.step_time_s, p.peak_bytes)) if task else
                                res.by_quality.get("lora") or res.by_quality.get("qlora"))
            # the Pareto front: nothing kept is faster and smaller than a point of it, and every plan off it is beaten
            front = set(map(id, res.pareto))
            for p in res.plans:
                beaten = any(o.step_time_s <= p.step_time_s and o.peak_bytes < p.peak_bytes
                             or o.step_time_s < p.step_time_s and o.peak_bytes <= p.peak_bytes for o in res.plans)
                assert (id(p) in front) == (not beaten) or any(
                    o.step_time_s == p.step_time_s and o.peak_bytes == p.peak_bytes and id(o) in front
                    for o in res.plans if o is not p)
            assert [p.flops_per_step for p in res.plans if p.flops_per_step is not None] == (
                [1e12 * p.step_time_s for p in res.plans] if time_of is roofline_like_time else [])


def _pspec(c: Combo):
    from planner.search import _pspec as ps

    return ps(c)


def _seconds(v):
    return v["step_time_s"] if isinstance(v, dict) else v


def test_nothing_fits_answers_the_smallest_peak():
    cfg = resolve_model("qwen2.5-0.5b", None)
    res = search(cfg, seq_len=512, tokens_per_step=1024, budget=CUDA_CONTEXT_BYTES + 2**20, host_ram=64 * GiB,
                 time_of=crc_time)
    assert res.best is None and not res.plans and res.smallest is not None
    every = _Space(_kernels(cfg), 512, 2)
    # the smallest over the whole space: the memory-minimal corner (bf16, full checkpointing, both offloads)
    corner = min(every.peak(c, 1)[0] for c in combinations(_sdpa(cfg), samples=2)
                 if every.valid(c) and every.peak(c, 1) is not None)
    assert res.smallest.peak_bytes == corner > res.smallest.budget_bytes


def test_left_out_settings_keep_no_fewer_bytes():
    """The module docstring's dominance: sdpa keeps no more than eager, fused no more than foreach or for-loop."""
    for model in ("llama-3.2-1b", "qwen2.5-0.5b", "gpt2-small"):
        cfg = resolve_model(model, None)
        for prec in ("fp32", "bf16-amp", "bf16"):
            for ck in (False, True):
                spec = TrainSpec(batch_size=2, seq_len=512, precision=prec, checkpointing=ck, device="cuda",
                                 optimizer_impl="fused")
                fused = estimate_training(_sdpa(cfg), spec).peak_bytes
                assert fused <= estimate_training(with_attention(cfg, "eager"), spec).peak_bytes
                for impl in ("foreach", "for-loop"):
                    other = TrainSpec(batch_size=2, seq_len=512, precision=prec, checkpointing=ck, device="cuda",
                                      optimizer_impl=impl)
                    assert fused <= estimate_training(_sdpa(cfg), other).peak_bytes


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_canonical_question_llama_3_1_8b_on_24_gib():
    """Llama-3.1-8B, 24 GiB, 2,048 tokens, LoRA / QLoRA allowed: a plan that fits; each plan's flags parse with
    the CLI's own parser for estimate, simulate and measure train into the very run, whose estimate is the plan's."""
    argv = ["plan", "--model", "llama-3.1-8b", "--budget", "24GiB", "--seq-len", "2048", "--tokens-per-step", "2048",
            "--host-ram", "64GiB", "--allow", "lora,qlora", "--json"]
    code, out, _ = _cli(argv)
    assert code == 0
    rec = json.loads(out)
    best = rec["best"]
    assert best["quality"] in ("lora", "qlora") and best["peak_bytes"] <= best["budget_bytes"] < 24 * GiB
    assert {p["quality"] for p in rec["plans"]} >= {"lora", "qlora"}
    if rec["time_model"] is None:  # the compute model is not on this branch: no time is made up
        assert "no time model" in rec["note"]
        assert all(p["step_time_s"] is None and p["tokens_per_s"] is None for p in rec["plans"])
    parser = build_parser()
    for plan in rec["plans"]:
        for verb in ("estimate", "simulate", "measure"):
            args = parser.parse_args([verb, "train"] + plan["flags"])
            default_precision(args)
            cfg, spec = parse_train(args)
            assert spec.device == "cuda" and spec.batch_size * spec.grad_accum * 2048 == 2048
        assert estimate_training(cfg, spec).peak_bytes == plan["peak_bytes"]


def test_canonical_question_without_the_allowance_refuses_with_the_smallest_peak():
    """Without LoRA / QLoRA, a full fine-tune of Llama-3.1-8B fits no 24 GiB GPU in this space: exit 2, the
    smallest peak in the line and in the JSON."""
    argv = ["plan", "--model", "llama-3.1-8b", "--budget", "24GiB", "--seq-len", "2048", "--tokens-per-step", "2048",
            "--host-ram", "256GiB", "--json"]
    code, out, err = _cli(argv)
    assert code == 2
    rec = json.loads(out)
    small = rec["smallest"]
    assert rec["best"] is None and small["peak_bytes"] > small["budget_bytes"]
    assert f"{small['peak_bytes']:,} B" in err and err.count("\n") == 1
    assert small["quality"] in TASK_CLASSES


def test_a_full_fine_tune_that_fits_is_answered():
    """A smaller model on the same card: the full fine-tune fits, and best is of the task's own classes."""
    code, out, _ = _cli(["plan", "--model", "llama-3.2-1b", "--budget", "24GiB", "--seq-len", "2048",
                         "--tokens-per-step", "2048", "--host-ram", "64GiB", "--allow", "lora", "--json"])
    assert code == 0
    rec = json.loads(out)
    assert rec["best"]["quality"] in TASK_CLASSES and rec["best"]["peak_bytes"] <= rec["best"]["budget_bytes"]


@pytest.mark.parametrize("argv,words", [
    (["--tokens-per-step", "3000"], "multiple of the sequence length"),
    (["--allow", "dora"], "--allow takes"),
    (["--task", "train", "--allow", "lora"], "--allow goes with --task finetune"),
    (["--budget", "-1"], "not a size"),
    (["--budget", "0"], "positive"),
    (["--gpu", "no-such-gpu"], "GPU"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words):
    code, out, err = _cli(["plan", "--model", "gpt2-small", "--seq-len", "1024", "--budget", "8GiB"] + argv)
    assert code == 2 and err.count("\n") == 1 and words in err


def test_pareto_front_is_fastest_first_and_shrinking():
    from planner.search import Plan

    spec = TrainSpec(batch_size=1, seq_len=8)
    pts = [Plan(spec, "sdpa", None, peak, 0, 0, "exact", step_time_s=t) for t, peak in
           ((1.0, 10), (1.0, 12), (2.0, 9), (3.0, 9), (2.5, 5), (4.0, 6))]
    assert [(p.step_time_s, p.peak_bytes) for p in pareto_front(pts)] == [(1.0, 10), (2.0, 9), (2.5, 5)]


def test_inference_plans_run_as_is_and_fit():
    """--infer: the most prompts at once (no time model here) per quality class; each plan's flags parse with the
    CLI's own parser for estimate, simulate and measure infer, and re-estimate to the plan's peak."""
    from planner.cli.infer import estimate_record, parse_infer

    code, out, _ = _cli(["plan", "--model", "llama-3.1-8b", "--budget", "24GiB", "--infer", "--prompt-len", "8192",
                         "--new-tokens", "512", "--host-ram", "64GiB", "--json"])
    assert code == 0
    rec = json.loads(out)
    assert rec["best"]["quality"] == "exact" and rec["best"]["peak_bytes"] <= rec["best"]["budget_bytes"]
    assert {p["quality"] for p in rec["plans"]} == {"exact", "8bit", "4bit"}  # a bf16 checkpoint: no 16bit class
    parser = build_parser()
    for plan in rec["plans"]:
        for verb in ("estimate", "simulate", "measure"):
            args = parser.parse_args([verb, "infer"] + plan["flags"])
            cfg, ispec = parse_infer(args)
            assert ispec.batch_size == plan["batch_size"] and ispec.device == "cuda"
        assert estimate_record(cfg, ispec)["peak_bytes"] == plan["peak_bytes"]
    # a budget under the 4-bit weights: refused with the smallest peak
    code, out, err = _cli(["plan", "--model", "llama-3.1-8b", "--budget", "4GiB", "--infer", "--prompt-len", "8192",
                           "--new-tokens", "512", "--json"])
    assert code == 2 and json.loads(out)["smallest"]["quality"] == "4bit" and "smallest peak" in err


def test_text_answer_lists_each_class_with_its_command():
    code, out, _ = _cli(["plan", "--model", "gpt2-small", "--seq-len", "512", "--tokens-per-step", "1024",
                         "--budget", "6GiB", "--host-ram", "64GiB"])
    lines = out.splitlines()
    assert code == 0 and "combinations fit 1 x 6.00 GiB" in lines[0] and "no time model" in lines[1]
    assert sum(line.startswith("best ") for line in lines) == 1
    assert all(line.strip().startswith("python -m planner estimate train --model gpt2-small")
               for line in lines[3::2])


def test_layout_plans_run_as_is_per_rank():
    """With --gpus, a DDP / FSDP2 plan's flags (--world-size, --parallel) parse into the very layout, whose per-rank
    estimate is the plan's peak, the tokens per step held across the ranks."""
    from planner.cli import parallel as cli_parallel
    from planner.estimate.distributed import estimate_distributed

    code, out, _ = _cli(["plan", "--model", "qwen2.5-0.5b", "--budget", "6GiB", "--gpus", "4", "--seq-len", "512",
                         "--tokens-per-step", "4096", "--host-ram", "64GiB", "--json"])
    assert code == 0
    rec = json.loads(out)
    layouts = [p for p in rec["plans"] + rec["pareto"] + [rec["best"]] if p["world_size"] > 1]
    assert layouts
    parser = build_parser()
    for plan in layouts:
        args = parser.parse_args(["estimate", "train"] + plan["flags"])
        default_precision(args)
        cfg, spec = parse_train(args)
        pspec = cli_parallel.parse_parallel(args)
        assert pspec.world_size == plan["world_size"] and spec.batch_size * spec.grad_accum * pspec.world_size * 512 == 4096
        assert estimate_distributed(cfg, spec, pspec).peak_bytes == plan["peak_bytes"] <= plan["budget_bytes"]


def test_plan_with_a_catalog_gpu_prices_plans_with_the_roofline():
    """--gpu: the GPU's memory is the budget, and every plan's time is the compute model's roofline of its own run
    (planner/estimate/compute.py price), so the best plan is the fastest of its class by that price."""
    from planner.estimate.compute import price
    from planner.gpus import gpu

    argv = ["plan", "--model", "qwen2.5-0.5b", "--gpu", "l4", "--seq-len", "512", "--tokens-per-step", "1024",
            "--host-ram", "64GiB", "--json"]
    code, out, _ = _cli(argv)
    assert code == 0
    res = json.loads(out)
    assert res["budget_bytes"] == gpu("l4").memory_bytes
    assert res["time_model"] is not None
    parser = build_parser()
    for p in res["plans"]:
        args = parser.parse_args(["estimate", "train"] + p["flags"])
        default_precision(args)
        cfg, spec = parse_train(args)
        priced = price(with_attention(cfg, args.attention) if args.attention else cfg, spec, gpu("l4"))
        assert p["step_time_s"] == pytest.approx(priced["step_time_s"], rel=1e-9)
        assert p["flops_per_step"] == priced["flops_per_step"]
    best = res["best"]
    same_class = [p for p in res["plans"] if p["quality"] == best["quality"]]
    assert best["step_time_s"] == min(p["step_time_s"] for p in same_class)
