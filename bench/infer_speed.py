"""`python -m planner bench speed`'s inference rows (issue #21: `estimate infer` < 0.2 ms; a move of a setting in
the Planner page's inference mode as fast as in training). No torch: the estimate side only.

Measured the way bench speed measures training's (bench/main.py speed_report, planner_page_rows): the
estimate with a new batch each call (as a control or a search asks), and the page's whole computation per move
(planner.serving.plan_inference: the estimate, the largest batch, the longest context, the KV tokens, the advice
and both curves) for a new batch, then a new prompt length.
"""
from __future__ import annotations

import time

from planner.infer_spec import InferSpec

INFER_ESTIMATE_BAR_MS = 0.2  # issue #21: `estimate infer` under 0.2 ms
# (preset, weight quantization): a tied GPT-2, an 8B model at 8K context, and its 4-bit weights
SPEED_CASES = (("hf-gpt2", "none"), ("llama-3-8b", "none"), ("llama-3-8b", "nf4"))


def inference_speed_rows(n: int = 200, moves: int = 20) -> list[str]:
    from planner.config import PRESETS
    from planner.estimate.inference import estimate_inference
    from planner.serving import plan_inference

    rows = []
    for name, quant in SPEED_CASES:
        cfg = PRESETS[name]
        prompt = min(1024, cfg.max_seq_len - 128)
        spec = lambda b, p=prompt: InferSpec(batch_size=b, prompt_len=p, new_tokens=128, precision="bf16",
                                             quantize_weights=quant)
        estimate_inference(cfg, spec(1))  # the per-config inventory, once
        t0 = time.perf_counter()
        for b in range(1, n + 1):  # a new batch each time
            estimate_inference(cfg, spec(b))
        ms = (time.perf_counter() - t0) / n * 1e3
        label = name + ("" if quant == "none" else f" {quant}")
        rows.append(f"| estimate_inference({label}, bf16, prompt {prompt}, 128 new), new batch each call | "
                    f"{ms:.3f} ms ({'meets' if ms < INFER_ESTIMATE_BAR_MS else 'MISSES'} the "
                    f"{INFER_ESTIMATE_BAR_MS} ms bar) |")
    for name in ("hf-gpt2", "llama-3-8b"):
        cfg, budget = PRESETS[name], 24 * 2**30
        plan_inference(cfg, InferSpec(4, 512, 128, precision="bf16"), budget)
        t0 = time.perf_counter()
        for i in range(moves):
            plan_inference(cfg, InferSpec(5 + i, 512, 128, precision="bf16"), budget)
            plan_inference(cfg, InferSpec(5 + i, 300 + i, 128, precision="bf16"), budget)
        rows.append(f"| Planner page computation, inference mode (plan_inference), {name}, per move | "
                    f"{(time.perf_counter() - t0) / (2 * moves) * 1e3:.1f} ms |")
    return rows
