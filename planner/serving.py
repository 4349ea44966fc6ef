"""Everything the Planner page's inference mode shows for one generate() setting, in one call (no torch).

"Can I serve this model at this context and batch on this GPU?": the estimate of the generation's peak
(planner/estimate/inference.py), the largest batch and the longest context that fit the budget, the tokens of
KV cache that fit beside the weights and the run's working set (the figure vLLM users ask for, with vLLM's own
rule beside it, labelled theirs), both curves, and ranked changes with their cost in plain words.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .api import RAM_GUARD_FRACTION  # a CPU measurement's RAM guard: the CLI's, so the page offers what it starts
from .config import ConfigError, ModelConfig
from .fit import bisect_fitting, cuda_context_bytes, largest_fitting, tensor_budget
from .infer_spec import InferSpec, check_infer
from .units import fmt_bytes

CURVE_POINTS = 25
BATCH_LIMIT = 1 << 16  # the largest-batch search stops here
# vLLM's default share of the device it plans its KV cache in (EngineArgs gpu_memory_utilization = 0.9,
# vllm/engine/arg_utils.py): it profiles a forward, then gives the KV cache what is left of that share.
VLLM_GPU_MEMORY_UTILIZATION = 0.9


def cache_choices(cfg: ModelConfig) -> tuple[str, ...]:
    """The caches generate() can run this model with, its default first (the family's file says)."""
    from .arch import family_of

    return family_of(cfg).infer_caches(cfg)


# What each cache class is, in a line (the page's help); a cache a family lists without a line here is still
# offered (its name alone): a new cache class appears on the page by being added to the family's infer_caches.
CACHE_HELP = {
    "dynamic": "transformers' DynamicCache, generate's default: grows by torch.cat, a layer holding its old and new "
               "K/V for a moment",
    "static": "StaticCache (cache_implementation='static'): prompt + new tokens allocated at the first update "
              "(a sliding layer's: its window, when shorter)",
    "none": "no cache: the book's generate_text_simple recomputes the whole context for every token",
    "sliding": "generate's DynamicCache on a model whose config sets a sliding window: its sliding layers keep the "
               "prompt's storage, then the last window of tokens (planner/arch/infer_windows.py)",
    "quantized": "cache_implementation='quantized' with transformers' fp8 backend: 1 B per K/V value and a scale "
                 "per layer; the whole cache is dequantized at each decode step",
    "offloaded": "DynamicCache(offloading=True): two layers' K/V on the GPU, the rest on the host (CUDA only: "
                 "estimated here, the device figure is for the CUDA check)",
}
# Weight quantization (planner/infer_spec.py WEIGHT_QUANT) in a line each: bitsandbytes as transformers'
# BitsAndBytesConfig loads it (planner/infer_quant.py counts the bytes)
WEIGHT_QUANT_HELP = {
    "none": "the weights in the precision above",
    "int8": "LLM.int8 (load_in_8bit): Linear8bitLt, 1 B per weight and an fp32 scale per row; measured and "
            "estimated, not simulated (bitsandbytes' Int8Params cannot wrap a fake tensor)",
    "nf4": "load_in_4bit, NormalFloat 4 (QLoRA's): half a byte per weight and an fp32 absmax per 64",
    "fp4": "load_in_4bit, bnb_4bit_quant_type='fp4': half a byte per weight and an fp32 absmax per 64",
}


def weight_quant_choices(cfg: ModelConfig, device: str) -> tuple[str, ...]:
    """The weight quantizations a run of this model on this device can take, "none" first: each one
    planner/infer_quant.py check_quantized_infer accepts (not a transformers model, or a CPU 4-bit kernel whose
    block sizes the model's linears do not meet: left out)."""
    from .infer_quant import check_quantized_infer
    from .infer_spec import WEIGHT_QUANT

    out = ["none"]
    for q in WEIGHT_QUANT[1:]:
        try:
            check_quantized_infer(cfg, InferSpec(1, 1, 1, quantize_weights=q, device=device))
        except ConfigError:
            continue
        out.append(q)
    return tuple(out)


def simulate_refusal(ispec: InferSpec) -> str | None:
    """Why `simulate infer` cannot run this spec (the CLI's refusal, planner/cli/infer.py), or None."""
    if ispec.quantize_weights == "int8":
        return ("simulating int8 weights is not supported (bitsandbytes' Int8Params cannot wrap a fake tensor); "
                "measure it, or simulate nf4 / fp4")
    return None


def estimate(cfg: ModelConfig, ispec: InferSpec) -> dict:
    from .estimate.inference import estimate_inference

    return estimate_inference(cfg, ispec)


def _peak(cfg: ModelConfig, ispec: InferSpec) -> int:
    return estimate(cfg, ispec)["peak_bytes"]


def max_batch(cfg: ModelConfig, ispec: InferSpec, budget: int) -> tuple[int, str]:
    """The largest batch of prompts whose generation fits `budget` (ispec.batch_size is ignored); 0 with why."""
    at = lambda b: _peak(cfg, dataclasses.replace(ispec, batch_size=b))
    if at(1) > budget:
        return 0, f"even one sequence needs {fmt_bytes(at(1))} > {fmt_bytes(budget)}"
    best = largest_fitting(lambda b: at(b) <= budget, 1, BATCH_LIMIT)
    return best, (f"batch {best + 1} would need {fmt_bytes(at(best + 1))}" if best < BATCH_LIMIT
                  else "search limit reached")


def max_context(cfg: ModelConfig, ispec: InferSpec, budget: int) -> tuple[int, str]:
    """The longest context (prompt + the run's new tokens, up to the model's) that fits at ispec.batch_size:
    the prompt grows, the new tokens stay."""
    n, top = ispec.new_tokens, cfg.max_seq_len
    if n >= top:
        return 0, f"{n} new tokens alone reach the model's context of {top:,}"
    at = lambda p: _peak(cfg, dataclasses.replace(ispec, prompt_len=p))
    if at(1) > budget:
        return 0, f"a 1-token prompt already needs {fmt_bytes(at(1))} > {fmt_bytes(budget)}"
    if at(top - n) <= budget:
        return top, "the model's full context fits"
    p = bisect_fitting(lambda q: at(q) <= budget, 1, top - n + 1)
    return p + n, f"a {p + 1 + n:,}-token context would need {fmt_bytes(at(p + 1))}"


def kv_tokens(est: dict, budget: int) -> tuple[int, int]:
    """Tokens of KV cache that fit beside the weights and this run's working set: (what is left of the budget
    after the peak's non-cache part) / (one token's K and V over every layer). Beside it, vLLM's rule: the same
    over gpu_memory_utilization of the budget (theirs)."""
    per_token = est["kv_cache_bytes_per_token"]
    if not per_token:  # a generation that keeps no cache (the book's generate_text_simple)
        return 0, 0
    working = est["peak_bytes"] - est["components"]["kv_cache"]
    ours = max(0, budget - working) // per_token
    theirs = max(0, int(VLLM_GPU_MEMORY_UTILIZATION * budget) - working) // per_token
    return ours, theirs


# The estimate's components as the breakdown chart names them (planner/charts.py COMPONENT_ORDER)
CHART_COMPONENTS = {"weights": "params", "buffers": "buffers", "inputs": "inputs", "kv_cache": "kv cache",
                    "activations": "activations", "logits": "transients",
                    "cublas_workspace": "transients"}  # (CUDA: planner/estimate/inference.py with_cublas_workspace)


def breakdown(est: dict) -> list[dict]:
    """scenario, component, bytes: what is alive at the peak, as the training breakdown draws it."""
    return [{"scenario": f"at the peak ({est['peak_phase']})", "component": CHART_COMPONENTS[k], "bytes": v}
            for k, v in est["components"].items() if v]


def _spread(top: int) -> list[int]:
    if top <= CURVE_POINTS:
        return list(range(1, top + 1))
    return sorted({max(1, round(top * i / (CURVE_POINTS - 1))) for i in range(CURVE_POINTS)})


@dataclass
class Change:
    label: str
    spec: InferSpec
    peak_bytes: int
    fits: bool
    cost: str  # what it costs in quality or speed, in plain words, with its source


# (field, value, label, cost): each tried alone; one the estimate refuses (ConfigError) is not offered.
CHANGES = [
    ("precision", "bf16", "weights in bf16",
     "none for a model published in bf16 (its config's torch_dtype); fp32 weights double the bytes for no "
     "accuracy gain at inference (transformers loads torch_dtype='auto' as published)"),
    ("precision", "fp16", "weights in fp16",
     "fp16's range is narrower than bf16's: activations of bf16-trained models can overflow (inf/nan); prefer bf16"),
    ("cache", "static", "a static cache",
     "allocates prompt + new tokens up front: no torch.cat copies while decoding, and it lets torch.compile "
     "capture the decode step (transformers' StaticCache docs); memory is held from the first token"),
    ("cache", "dynamic", "a dynamic cache", "grows by concatenation: a layer holds its old and new K/V for a moment"),
    ("cache", "quantized", "an fp8 KV cache (QuantizedCache, fp8 backend)",
     "the cache in 1 byte per value (half of bf16's): small precision loss (float8_e4m3 with one scale per layer "
     "tensor, fixed at the prompt), and each decode step dequantizes the whole cache, so decoding slows "
     "(transformers' KV cache docs, 'Quantized cache'; KIVI, Liu et al. 2024, for the int2/int4 variant)"),
    ("cache", "offloaded", "an offloaded KV cache (CUDA)",
     "all but two layers' K/V live in host memory: every decode step copies each layer's K/V to the GPU and "
     "back over PCIe, overlapped in part on a side stream, so decoding slows; the host must hold the cache "
     "(transformers' KV cache docs, 'Offloaded cache')"),
    ("cache", "sliding", "the model's sliding-window cache",
     "none beyond the model's own: its sliding layers attend to the last window tokens only (as trained, "
     "Mistral 7B, Jiang et al. 2023)"),
    ("quantize_weights", "int8", "int8 weights (LLM.int8)",
     "near fp16 quality at 8 bits, slower matmuls (Dettmers et al. 2022, LLM.int8())"),
    ("quantize_weights", "nf4", "4-bit NF4 weights",
     "small quality loss, ~4x fewer weight bytes than fp16 (Dettmers et al. 2023, QLoRA's NF4)"),
    ("double_quant", True, "double quantization of the 4-bit scales",
     "no measurable quality loss; the absmax in 8 bits, ~0.37 bit per weight less (Dettmers et al. 2023, QLoRA "
     "section 3: 0.5 -> 0.127 bit per parameter)"),
]


def advice(cfg: ModelConfig, ispec: InferSpec, budget: int) -> list[Change]:
    """Single changes that lower the peak, fitting ones first, then by peak; also halving the batch."""
    base = _peak(cfg, ispec)
    out = []
    tries = [(f, v, label, cost) for f, v, label, cost in CHANGES if getattr(ispec, f) != v
             and not (v == "offloaded" and ispec.device_type != "cuda")]  # offloading is a GPU's (CUDA only)
    if ispec.batch_size > 1:
        half = max(1, ispec.batch_size // 2)
        tries.append(("batch_size", half, f"batch {half}", "half the sequences per step: lower throughput"))
    for field, value, label, cost in tries:
        try:
            spec = dataclasses.replace(ispec, **{field: value})
            check_infer(cfg, spec)
            peak = _peak(cfg, spec)
        except ConfigError:
            continue
        if peak < base:
            out.append(Change(label, spec, peak, peak <= budget, cost))
    return sorted(out, key=lambda c: (not c.fits, c.peak_bytes))


@dataclass
class ServingPlan:
    estimate: dict
    budget_bytes: int
    cuda_context_bytes: int
    tensor_budget_bytes: int
    breakdown: list[dict]        # scenario, component, bytes: what is alive at the peak
    max_batch: int
    max_batch_reason: str
    max_context: int
    max_context_reason: str
    kv_tokens: int               # KV cache tokens that fit beside the weights and the working set
    kv_tokens_vllm: int          # the same by vLLM's rule (gpu_memory_utilization of the budget): theirs
    batch_curve: list[dict]
    context_curve: list[dict]
    advice: list[Change]
    cfg: ModelConfig | None = None   # the model as the run uses it (the attention applied)
    spec: InferSpec | None = None
    measure_limit_bytes: int | None = None  # a CPU measurement's room here (the CLI's RAM guard); None: not asked
    simulate_refusal: str | None = None     # why `simulate infer` cannot run this spec (None when it can)

    @property
    def peak_bytes(self) -> int:
        return self.estimate["peak_bytes"]

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.tensor_budget_bytes

    @property
    def margin_bytes(self) -> int:
        """How far the peak is under (fits) or over the budget for tensors."""
        return abs(self.tensor_budget_bytes - self.peak_bytes)

    @property
    def measurable_here(self) -> bool:
        """A measurement of this generation may start on this machine: a CPU run within the RAM guard."""
        return (self.spec is not None and self.spec.device_type == "cpu" and self.measure_limit_bytes is not None
                and self.peak_bytes <= self.measure_limit_bytes)

    @property
    def quantized_weights(self) -> tuple[str, int] | None:
        """With quantized weights: what bitsandbytes holds (the weights term's name) and its bytes; else None."""
        if self.spec is None or self.spec.quantize_weights == "none":
            return None
        return self.estimate["terms"][0]["name"].removeprefix("weights: "), self.estimate["components"]["weights"]


def plan_inference(cfg: ModelConfig, ispec: InferSpec, budget: int, attention: str | None = None,
                   available_ram_bytes: int | None = None) -> ServingPlan:
    """Raises ConfigError (one line) for a run the model cannot make. attention: the kernel to run with (the
    model's own when None); available_ram_bytes: the RAM free now, for whether a CPU measurement may start here
    (the CLI's guard, planner.api.RAM_GUARD_FRACTION; None: not asked)."""
    if attention is not None:
        from .config import with_attention

        cfg = with_attention(cfg, attention)
    check_infer(cfg, ispec)
    est = estimate(cfg, ispec)
    usable = tensor_budget(budget, ispec.device)
    mb, mb_why = max_batch(cfg, ispec, usable)
    mc, mc_why = max_context(cfg, ispec, usable)
    ours, theirs = kv_tokens(est, usable)
    batches = _spread(max(2 * max(mb, ispec.batch_size), 8))
    prompts = _spread(max(1, cfg.max_seq_len - ispec.new_tokens))
    return ServingPlan(
        estimate=est, budget_bytes=budget, cuda_context_bytes=cuda_context_bytes(ispec.device),
        tensor_budget_bytes=usable, breakdown=breakdown(est),
        max_batch=mb, max_batch_reason=mb_why, max_context=mc, max_context_reason=mc_why,
        kv_tokens=ours, kv_tokens_vllm=theirs,
        batch_curve=[{"batch": b, "peak_bytes": _peak(cfg, dataclasses.replace(ispec, batch_size=b))} for b in batches],
        context_curve=[{"context": p + ispec.new_tokens, "peak_bytes": _peak(cfg, dataclasses.replace(ispec, prompt_len=p))}
                       for p in prompts],
        advice=advice(cfg, ispec, usable), cfg=cfg, spec=ispec,
        measure_limit_bytes=None if available_ram_bytes is None else int(RAM_GUARD_FRACTION * available_ram_bytes),
        simulate_refusal=simulate_refusal(ispec))
