"""Peak memory of one generate() call, from the config alone (no torch, microseconds).

What is alive when (transformers 5.23 generation/utils.py _sample, cache_utils.py; measured with
planner.measure.inference on the live-bytes timeline):
  prefill  weights W and the prompt, the KV cache of the layers done so far (DynamicCache: the prompt's K/V
           per layer, each a torch.cat result; StaticCache: every layer's (b, kv, prompt + new, d) buffers,
           allocated at its first update), the forward's no-grad intermediates at a block's high point
           (the family says which: planner/arch/<family>.py infer_block_points), then the logits of the
           last position only (generate passes logits_to_keep=1) and the token selection's fp32 copies.
  decode   W + the cache grown to prompt + new - 1 tokens; a DynamicCache grows by torch.cat, so one layer
           holds its old and its new K/V at once; then the last position's logits and their copies.
The peak is the larger of the two phases; its phase is reported with it.
"""
from __future__ import annotations

from ..accounting import DTYPE_BYTES, buffer_bytes, param_count
from ..arch import family_of
from ..arch.terms import Term
from ..config import ConfigError, ModelConfig
from ..infer_spec import InferSpec

INFER_PHASES = ("prefill", "decode")


def estimated_families() -> list[str]:
    """The families whose file models generate() (they implement the inference hooks of planner/arch/base.py)."""
    from ..arch import families
    from ..arch.base import Family

    return [arch for arch, fam in families().items() if type(fam).kv_bytes_per_token is not Family.kv_bytes_per_token
            or type(fam).infer_estimate is not Family.infer_estimate]


def estimate_inference(cfg: ModelConfig, ispec: InferSpec) -> dict:
    """The estimate's record of one generate() call: the keys of planner.measure.inference's record
    (peak_bytes, peak_phase, phase_peak_bytes, persistent_bytes) and the components (weights, buffers, inputs,
    kv_cache, activations, logits) at the peak, with the terms and their formulas. A family whose file does not
    model generate() yet is refused in one line (ConfigError): measure and simulate still run it."""
    try:
        est = _estimate(cfg, ispec)
    except NotImplementedError as exc:
        raise ConfigError(f"{exc}: the estimate of generate() covers {', '.join(estimated_families())}; "
                          "measure or simulate this model instead") from None
    return with_cublas_workspace(est) if ispec.device_type == "cuda" else est


def with_cublas_workspace(est: dict) -> dict:
    """A generate() call on CUDA holds one cuBLAS workspace beside its tensors: cuBLAS keeps one per (handle,
    stream) and handles are per thread (aten/src/ATen/cuda/CublasHandlePool.cpp), and generate() runs every
    matmul on the Python thread under no_grad (no autograd device thread: a training step holds two,
    planner/estimate/training.py CUBLAS_WORKSPACE_BYTES). The workspace is allocated through the caching
    allocator at the first matmul and kept for the process's life, so max_memory_allocated counts it in every
    phase. Measured on an H200 (tests/data/cuda/2026-11-27-h200/explain.jsonl.gz, its first row, an inference
    row run first in a fresh process: llama V2000 h48 b2 s48 sdpa bf16 dynamic, max_memory_allocated 34,068,480 B
    = the tracked tensors' 499,728 B + 33,554,432 B + 14,320 B of 512-B block rounding, not modelled here)."""
    from .training import CUBLAS_WORKSPACE_BYTES_PER_HANDLE, CUDA_CONTEXT_BYTES

    ws = CUBLAS_WORKSPACE_BYTES_PER_HANDLE
    phase = {k: v + ws for k, v in est["phase_peak_bytes"].items()}
    terms = est["terms"] + [dict(vars(Term("cuBLAS workspace (one handle: the Python thread's)", "32 MiB (sm_90)",
                                           ws, where="kept")))]
    notes = est["notes"] + [f"CUDA: one cuBLAS workspace ({ws // 2**20} MiB) is included; the CUDA context "
                            f"(~{CUDA_CONTEXT_BYTES // 2**20} MiB) is not, as max_memory_allocated does not count it."]
    return {**est, "peak_bytes": est["peak_bytes"] + ws, "phase_peak_bytes": phase,
            "components": {**est["components"], "cublas_workspace": ws}, "cublas_workspace_bytes": ws,
            "cuda_context_not_counted": CUDA_CONTEXT_BYTES, "terms": terms, "notes": notes}


def _estimate(cfg: ModelConfig, ispec: InferSpec) -> dict:
    family = family_of(cfg)
    own = family.infer_estimate(cfg, ispec)  # a generation that is not generate()'s (the book's): its family's record
    if own is not None:
        return own
    e = DTYPE_BYTES[ispec.param_dtype]
    b, p, n = ispec.batch_size, ispec.prompt_len, ispec.new_tokens
    weights = param_count(cfg) * e
    if ispec.quantize_weights != "none":  # bitsandbytes' storage of the quantized linears (planner/infer_quant.py)
        from ..infer_quant import weights_bytes

        weights, n_quantized = weights_bytes(cfg, ispec, e)
    buffers = buffer_bytes(cfg, ispec.param_dtype)
    inputs = family.infer_input_bytes(cfg, ispec)
    base = weights + buffers + inputs

    kv_tok = family.kv_bytes_per_token(cfg, e)  # one token's K and V over all layers, per sequence
    static = ispec.cache == "static"
    # StaticCache: max_cache_len = generate's max_length - 1 (the last token never enters the model: measured,
    # (b, kv, p + n - 1, d) per layer), allocated whole at the layer's first update
    kv_prefill_len = ispec.total_len - 1 if static else p
    kv_prefill = b * kv_tok * kv_prefill_len
    kv_decode = family.infer_kv_decode_bytes(cfg, ispec, e)  # sliding layers keep fewer (arch/infer_windows.py)

    pre_points = family.infer_prefill_points(cfg, ispec, e)   # name -> bytes above base + full prompt cache
    logit_terms = family.infer_logits_terms(cfg, ispec, e)
    logits = sum(t.bytes for t in logit_terms)
    dec_points = family.infer_decode_points(cfg, ispec, e) if n > 1 else {}
    # points before the last layer's cache update (the family's RoPE point) stand on one layer's K/V less
    unwritten = family.infer_prefill_unwritten_kv(cfg, ispec, e)
    pre_above = {k: v - unwritten.get(k, 0) for k, v in pre_points.items()}
    pre_name = max(pre_above, key=pre_above.get)
    pre_act = pre_points[pre_name]
    prefill_options = {"activations": (kv_prefill + pre_above[pre_name], pre_act, 0),
                       "logits": (kv_prefill + logits, 0, logits)}
    # decode: the previous step's processed scores (next_token_scores, b*V fp32) are still bound in _sample
    prev_scores = 4 * b * cfg.vocab_size
    decode_options = {"logits": (kv_decode + logits + prev_scores + family.infer_decode_ids_bytes(cfg, ispec), 0,
                                 logits + prev_scores)}
    if n > 1:
        # the last step's _update_model_kwargs_for_generation (generation/utils.py), right after its forward: the
        # model's logits (b, 1, V) in e and the previous step's fp32 copy and scores (2*4*b*V with an EOS id's
        # processors, else 4*b*V) alive beside input_ids (b, p + n - 1), position_ids (b, p + n - 1) and their
        # torch.cat with next_position_ids (b, 1) into (b, p + n): 8*b*(p + n - 1) + 8*b more than the token
        # selection's ids. Measured: llama V97 h32 b2 s256 sdpa static fp32, the decode peak at that cat
        prev_step = 4 * b * cfg.vocab_size * (2 if family.infer_has_eos else 1)
        decode_options["kwargs update"] = (
            kv_decode + b * cfg.vocab_size * e + prev_step + family.infer_decode_ids_bytes(cfg, ispec)
            + 8 * b * (ispec.total_len - 1) + 8 * b, 0, b * cfg.vocab_size * e + prev_step)
    if dec_points:
        dname = max(dec_points, key=dec_points.get)
        decode_options["activations"] = (kv_decode + dec_points[dname], dec_points[dname], 0)
    off = None
    windowed_static = family.infer_static_windows(cfg, ispec)
    if windowed_static:  # sliding layers keep their window (planner/arch/infer_windows.py)
        from ..arch.infer_windows import static_window_options

        kw = decode_options.get("kwargs update")
        off = static_window_options(family, cfg, ispec, e, logits, decode_options["logits"][0] - kv_decode,
                                    decode_options["logits"][2],
                                    None if kw is None else (kw[0] - kv_decode, kw[2]))
        prefill_options, decode_options = off["prefill"], off["decode"]
        kv_prefill, kv_decode = off["kv_prefill"], off["kv_decode"]
    if ispec.cache == "offloaded":  # the device holds one or two layers' K/V (planner/estimate/infer_caches.py)
        from .infer_caches import offloaded_options

        off = offloaded_options(cfg, ispec, kv_tok, pre_points, dec_points, logits,
                                decode_options["logits"][0] - kv_decode, decode_options["logits"][2])
        prefill_options, decode_options = off["prefill"], off["decode"]
        kv_prefill, kv_decode = off["kv_prefill"], off["kv_decode"]
    if ispec.cache == "quantized":  # fp8 K/V, dequantized per layer (planner/estimate/infer_caches.py)
        from .infer_caches import quantized_options

        off = quantized_options(family, cfg, ispec, e, pre_points, dec_points, logits,
                                decode_options["logits"][0] - kv_decode, decode_options["logits"][2])
        prefill_options, decode_options = off["prefill"], off["decode"]
        kv_prefill, kv_decode = off["kv_prefill"], off["kv_decode"]
    # generate's own tensors (generation/utils.py; measured on the live-bytes timeline): position_ids
    # (attention_mask.cumsum - 1, masked_fill: int64 (b, p)) alive through the call; in prefill the model input's
    # clone of input_ids (prepare_inputs_for_generation, (b, p)) and unfinished_sequences (torch.ones(b) int64);
    # in decode the step's clones of input_ids and position_ids (b, 1) and unfinished_sequences' `&` and `+`
    # results (b each); the special-token tensors (family.infer_token_tensors, 8 B each) throughout
    tokens = 8 * family.infer_token_tensors(cfg)
    gen_state = {"prefill": 16 * b * p + 8 * b + tokens, "decode": 8 * b * p + 32 * b + tokens}
    cache_state = {ph: family.infer_cache_state_bytes(cfg, ispec, ph) for ph in INFER_PHASES}
    gen_state = {ph: gen_state[ph] + cache_state[ph] for ph in INFER_PHASES}
    phase, parts, chosen = {}, {}, {}
    for name, options in (("prefill", prefill_options), ("decode", decode_options)):
        key = max(options, key=lambda k: options[k][0])
        phase[name] = base + options[key][0] + gen_state[name]
        parts[name], chosen[name] = options[key], key
    if n == 1:
        # one new token: generate selects it from the prompt's logits and stops (MaxLengthCriteria), so no decode
        # forward runs and the measurement's decode phase holds nothing (measured: 0 B; issue #39's fuzz, gpt2-hf
        # V6218 h128 f296 a8 L2 b3 p31 n1 fp16 eager, +1.89% before from the decode options counted anyway)
        phase["decode"] = 0
    peak_phase = max(phase, key=phase.get)
    _, act, lg = parts[peak_phase]
    kv_at_peak = kv_prefill if peak_phase == "prefill" else kv_decode
    if peak_phase == "prefill" and chosen["prefill"] == "activations":
        kv_at_peak -= unwritten.get(pre_name, 0)
    if off is not None:  # the device's K/V at the chosen high point
        kv_at_peak = off["kv"][peak_phase][chosen[peak_phase]]
    cache_how = {"offloaded": " (offloaded: the device's one or two layers)",
                 "quantized": " (fp8: 1 byte per value and a 4-byte scale per K or V tensor)"}.get(ispec.cache, "")
    wname = "weights" if ispec.quantize_weights == "none" else (
        f"weights: {n_quantized} linears {ispec.quantize_weights}" + (" (double quant)" if ispec.double_quant else "")
        + " with absmax / scales and codes, the rest P*e")
    terms = [Term(wname, "P*e" if ispec.quantize_weights == "none" else "planner/infer_quant.py", weights,
                  where="kept"), Term("buffers", "buffers", buffers, where="kept"),
             Term("prompt ids and attention mask", "2*8*b*p" if inputs == 16 * b * p else "8*b*p", inputs, where="kept"),
             Term("KV cache at the prefill high point" + (" (StaticCache: every layer at p + n - 1)" if static
                                                           else " (DynamicCache: the prompt)"),
                  f"b*{'(p + n - 1)' if static else 'p'}*kv_token" + cache_how, kv_prefill, where="prefill")
             if not windowed_static else
             Term("KV cache at the prefill high point (StaticCache: full layers at p + n - 1, sliding layers at "
                  "min(w, p + n - 1))",
                  "sum over layers of 2*b*kv*d*e*tokens", kv_prefill, where="prefill"),
             Term("KV cache at the last decode step", "b*(p + n - 1)*kv_token" + (
                 cache_how or (" (sliding layers: min(p + n - 1, w))"
                               if windowed_static or kv_decode != b * kv_tok * (ispec.total_len - 1) else "")),
                  kv_decode, where="decode")]
    if off is not None:  # the cache class's own high points, above the weights, the prompt and generate's tensors
        terms += [Term(f"{ph} high point ({ispec.cache} cache): {k}", "planner/arch/infer_windows.py" if windowed_static
                       else "planner/estimate/infer_caches.py", v[0],
                       where=ph) for ph in INFER_PHASES for k, v in off[ph].items()]
    terms += [Term(f"prefill high point: {k}", "family (infer_prefill_points)", v, where="prefill")
              for k, v in pre_points.items()]
    terms += [Term(f"decode high point: {k}", "family (infer_decode_points)", v, where="decode")
              for k, v in dec_points.items()]
    terms += logit_terms
    if "kwargs update" in decode_options and off is None:
        terms.append(Term("decode high point: the last step's position_ids update (logits of the step, the previous "
                          "step's scores, input_ids and position_ids old and new)",
                          "b*V*e + 4*b*V*(1 + eos) + 8*b*(2*(p + n) - 1) + 8*b*(p + n - 1) + 8*b",
                          decode_options["kwargs update"][0] - kv_decode, where="decode"))
    terms += [Term("generate's position_ids, input_ids clone, unfinished_sequences, special-token tensors",
                   "16*b*p + 8*b + 8*tokens", gen_state["prefill"] - cache_state["prefill"], where="prefill"),
              Term("generate's position_ids, the step's id clones, unfinished_sequences, special-token tensors",
                   "8*b*p + 32*b + 8*tokens", gen_state["decode"] - cache_state["decode"], where="decode"),
              Term("the cache's bookkeeping tensors (family: infer_cache_state_bytes)", "family",
                   cache_state["prefill"], where="prefill"),
              Term("the cache's bookkeeping tensors (family: infer_cache_state_bytes)", "family",
                   cache_state["decode"], where="decode")]
    extra = {}
    if off is not None and ispec.cache == "offloaded":
        from .infer_caches import CUDA_ONLY

        extra = {"host_kv_cache_bytes": off["host_kv_bytes"], "device_figure": "estimated: for the CUDA check",
                 "offload_note": CUDA_ONLY}
        terms.append(Term("offloaded KV cache on the host (every layer but the prefetched one, at p + n - 1)",
                          "max(L - 1, 1)*b*(p + n - 1)*kv_token/L", off["host_kv_bytes"], where="host"))
    return {
        **extra,
        "kind": "estimate",
        "peak_bytes": phase[peak_phase], "peak_phase": peak_phase, "phase_peak_bytes": phase,
        "persistent_bytes": base,
        "components": {"weights": weights, "buffers": buffers, "inputs": inputs, "kv_cache": kv_at_peak,
                       "activations": act, "logits": lg},
        "kv_cache_bytes_per_token": kv_tok, "prefill_high_point": pre_name,
        "terms": [dict(vars(t)) for t in terms],
        "notes": [f"{family.arch}: generate(max_new_tokens={n}, min_new_tokens={n}, do_sample=False), "
                  f"{ispec.cache} cache, {cfg.attention if hasattr(cfg, 'attention') else 'eager'} attention; "
                  "logits of the last prompt position only (logits_to_keep=1)"]
                 + ([family.infer_note] if getattr(family, "infer_note", None) else []),
    }
