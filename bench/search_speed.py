"""The plan search's grid and timings (docs/plan.md's search section): `python -m bench.search_speed [--quick]`;
with --check, the search against the exhaustive enumeration of its space on nine families.

Each row is one question (model x GPU memory x count x task) answered by planner/search.py as `plan` answers it;
its timings are CPU seconds of this process (time.process_time: the wall clock of a shared machine is not the
search's), "cold" with no estimate kept from an earlier search (the model's inventory and imports warm), "again"
the same question asked a second time (the page's case: every estimate kept).
"""
from __future__ import annotations

import sys
import time

GiB = 2**30
# (label, bytes, 16-bit float): the catalog's memories for the GPUs named (NVIDIA's datasheets); T4 has no bf16
GPUS = (("24 GiB (RTX 4090)", 24 * GiB, "bf16"), ("48 GiB (A6000, L40S)", 48 * GiB, "bf16"),
        ("80 GiB (A100 80GB, H100)", 80 * GiB, "bf16"), ("16 GiB (T4: fp16)", 16 * GiB, "fp16"))
MODELS = ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-7b", "qwen3-30b-a3b")
HOST = 256 * GiB  # host RAM of the question (the offloads' and paged states' room)


def _row(model: str, gpu: tuple, gpus: int, allow: tuple, seq: int, tokens: int) -> dict:
    from planner import search as S
    from planner.config import resolve_model
    from planner.units import fmt_bytes

    cfg = resolve_model(model, None)
    label, budget, half = gpu
    S._ESTIMATES.clear()
    S._CHOICES.clear()
    t0, w0 = time.process_time(), time.perf_counter()
    res = S.search(cfg, seq_len=seq, tokens_per_step=tokens, budget=budget, gpus=gpus, host_ram=HOST, allow=allow,
                   half=half)
    cold, wall = time.process_time() - t0, time.perf_counter() - w0
    t1 = time.process_time()
    S.search(cfg, seq_len=seq, tokens_per_step=tokens, budget=budget, gpus=gpus, host_ram=HOST, allow=allow, half=half)
    again = time.process_time() - t1
    b = res.best
    if b is not None:
        s = b.spec
        what = ", ".join(x for x in (
            s.precision, s.optimizer, f"ckpt {s.checkpoint_policy}" if s.checkpointing else "",
            s.loss if s.loss != "default" else "", "opt->host" if s.offload_optimizer else "",
            "act->host" if s.offload_activations else "",
            f"{b.pspec.parallel} x{b.pspec.world_size}" if b.pspec is not None else "") if x)
        answer = f"{b.quality}: {s.batch_size} x {s.grad_accum} ({what}), peak {fmt_bytes(b.peak_bytes)}"
    else:
        answer = f"nothing fits; smallest peak {fmt_bytes(res.smallest.peak_bytes)}" if res.smallest else "nothing fits"
    return {"model": model, "gpu": label, "gpus": gpus, "allow": ",".join(allow) or "-", "answer": answer,
            "fitting": len(res.plans), "classes": ",".join(res.by_quality), **res.stats, "cold_ms": cold * 1e3,
            "wall_ms": wall * 1e3, "again_ms": again * 1e3}


def rows(quick: bool = False, seq: int = 2048, tokens: int = 16384) -> list[dict]:
    out = []
    models = MODELS[:2] if quick else MODELS
    for model in models:
        for gpu in (GPUS[:1] if quick else GPUS):
            for allow in ((), ("lora", "qlora")):
                out.append(_row(model, gpu, 1, allow, seq, tokens))
            out.append(_row(model, gpu, 8, (), seq, tokens))
    return out


def markdown(rs: list[dict], seq: int = 2048, tokens: int = 16384) -> str:
    head = (f"Sequence {seq:,}, {tokens:,} tokens per optimizer step, host RAM {HOST // GiB} GiB, no time model (the "
            "compute model is wired when it lands: plans ranked on the memory side; see above).\n\n"
            "| model | GPU | count | allowed | answer (best: micro-batch x accumulation) | fit / combinations | "
            "classes | estimates | pruned | CPU ms cold | CPU ms again |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['model']} | {r['gpu']} | {r['gpus']} | {r['allow']} | {r['answer']} | {r['fitting']} / "
        f"{r['combinations']} | {r['classes'] or '-'} | {r['estimates']} | {r['pruned']} | {r['cold_ms']:.0f} | "
        f"{r['again_ms']:.0f} |\n" for r in rs)


# The families the enumeration check runs on (one preset each, small enough to enumerate in seconds)
CHECK_MODELS = ("llama-3.2-1b", "tinyllama-1.1b", "qwen2.5-0.5b", "qwen3-0.6b", "qwen1.5-moe-a2.7b", "phi-3-mini-4k",
                "gemma-2-2b", "gpt2-medium", "gpt2-small")
CHECK_LORA = ("llama-3.2-1b", "qwen2.5-0.5b", "gpt2-small", "gemma-2-2b")


def enumeration_check(models=CHECK_MODELS, allow: tuple = (), seq: int = 256, tokens: int = 1024) -> list[dict]:
    """The search against the exhaustive enumeration of its space (every combination at every micro-batch, no
    pruning) at four budgets around the space's peaks: the combinations kept and their micro-batches must agree
    (tests/test_search.py runs the same on three of these)."""
    from planner import search as S
    from planner.config import ConfigError, resolve_model, with_attention
    from planner.estimate.training import CUDA_CONTEXT_BYTES
    from planner.fit import tensor_budget

    out = []
    for model in models:
        cfg = resolve_model(model, None)
        try:
            fast = with_attention(cfg, "sdpa")
        except ConfigError:
            fast = cfg
        kernels = [fast] if fast.attention == cfg.attention else [fast, cfg]
        for gpus in ((1,) if allow else (1, 2)):
            combos = S.combinations(fast, "finetune", allow, gpus, tokens // seq)
            if allow:  # the LoRA / QLoRA space, and bf16's full-training part beside it
                combos = [c for c in combos if c.task != "full" or c.precision == "bf16"]
            space = S._Space(kernels, seq, tokens // seq)
            every = {}
            for c in combos:
                try:
                    micros = space.micro_batches(c)
                except ConfigError:
                    continue
                if space.valid(c):
                    every[c] = {m: space.peak(c, m) for m in micros}
            peaks = sorted(p[0] for ms in every.values() for p in ms.values() if p is not None)
            bad = kept = 0
            for q in (0.1, 0.3, 0.5, 0.8):
                budget = int(peaks[int(q * (len(peaks) - 1))] * 1.1) + CUDA_CONTEXT_BYTES
                want = {}
                for c, ms in every.items():
                    tb = tensor_budget(budget, "cuda", c.checkpointing is not None)
                    fit = [m for m, p in ms.items() if p is not None and p[0] <= tb and p[1] <= HOST]
                    if fit:
                        want[c] = max(fit)
                res = S.search(cfg, seq_len=seq, tokens_per_step=tokens, budget=budget, gpus=gpus, host_ram=HOST,
                               allow=allow, combos=combos)
                got = {p.combo: p.spec.batch_size for p in res.plans}
                bad += sum(got.get(c) != want.get(c) for c in set(got) | set(want))
                kept += len(want)
            out.append({"model": model, "gpus": gpus, "allow": ",".join(allow) or "-", "combinations": len(every),
                        "fitting": kept, "mismatches": bad})
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--check" in argv:  # the enumeration check: every family, then LoRA / QLoRA on four
        rs = enumeration_check() + enumeration_check(CHECK_LORA, ("lora", "qlora"))
        print("| model | GPUs | allowed | valid combinations | fitting (4 budgets) | mismatches |\n|---|---|---|---|---|---|")
        for r in rs:
            print(f"| {r['model']} | {r['gpus']} | {r['allow']} | {r['combinations']} | {r['fitting']} | {r['mismatches']} |")
        return 1 if any(r["mismatches"] for r in rs) else 0
    print(markdown(rows(quick="--quick" in argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
