"""generate()'s offloaded KV cache, estimated from its class (no torch): the device figure and the host figure apart.

`cache_implementation="offloaded"` is `DynamicCache(config, offloading=True)` (transformers 5.23
generation/utils.py _prepare_cache_for_generation; DynamicCache's offload_only_non_sliding defaults to False:
every layer is offloaded). Cache.update (cache_utils.py), for layer l:

    prefetch(l + 1)          # the next layer (circling back to layer 0 after the last) .to(device, non_blocking)
    keys, values = self.layers[l].update(...)   # DynamicLayer: torch.cat on the device, as without offloading
    offload(l)               # self.keys = self.keys.to("cpu", non_blocking=True), the same for the values

so the device holds the layer being updated (its returned K/V stay alive through its attention) and the one
prefetched for the next update; every other layer is on the host. At the last layer the prefetch brings layer 0
back, which the next step reads first; after the prompt's forward layer 0 (p tokens) is on the device, after the
last decode step layer 0 at p + n - 1 tokens. An uninitialised layer (the prompt's forward) prefetches nothing.

Device high points (the last layer: the largest prefetched neighbour is layer 0, already updated this step):
  prefill  the last layer's update prefetches layer 0 (prefetch(L - 1 + 1) circles back) before its own cat:
           its attention holds its own K/V beside layer 0's, two layers at p; its MLP, norm and the logits
           only layer 0's (the last layer's device copy dies with its attention).
  decode   attention and the cache concatenation at the last layer: layer 0 (p + n - 1, prefetched) beside
           the last layer's own K/V (its old values during the cat, as DynamicLayer); the logits: layer 0.
Host: every layer but the prefetched one, at p + n - 1 tokens after the last step (one layer of a 1-layer model).

Not measured here: transformers' Cache.update calls torch.cuda.default_stream(...) when offloading, which a CPU
build of torch refuses ("Torch not compiled with CUDA enabled", measured with torch 2.13 CPU), so `measure` and
`simulate` run it on CUDA only; the device figure is marked for the CUDA check (python -m planner bench gpu).
"""
from __future__ import annotations

CUDA_ONLY = ("transformers' offloaded cache (DynamicCache(offloading=True)) calls torch.cuda.default_stream in "
             "Cache.update: it runs on CUDA only (this torch has no CUDA); the estimate gives its device and host figures")


def offloaded_layers(L: int) -> dict[str, int]:
    """Layers whose K/V sit on the device at each high point (see the module docstring)."""
    two = 2 if L > 1 else 1  # a 1-layer model prefetches itself: it is the layer being updated
    after = 1 if L > 1 else 0  # after the last layer's attention only the prefetched layer 0 stays
    return {"prefill attention": two, "prefill other": after, "decode attention": two, "decode logits": after,
            "host": max(L - 1, 1)}


def offloaded_options(cfg, ispec, kv_tok: int, pre_points: dict, dec_points: dict, logits: int,
                      decode_logits_total: int, decode_logits: int) -> dict:
    """The prefill and decode options of planner/estimate/inference.py with the device's K/V per point:
    {"prefill": {name: (total above base, activations, logits)}, "decode": {...}, "kv_prefill", "kv_decode",
    "host_kv_bytes"}. kv_tok is one token's K/V over every layer; the layers are alike (no sliding layers:
    a windowed model keeps its sliding layers as they are, refused here)."""
    L = cfg.layers
    b, p, T = ispec.batch_size, ispec.prompt_len, ispec.total_len - 1
    layer = lambda tokens: b * kv_tok * tokens // L  # one layer's K and V
    n = offloaded_layers(L)
    pre, dec, kv = {}, {}, {"prefill": {}, "decode": {}}
    for name, v in pre_points.items():
        k = n["prefill attention"] if name == "attention" else n["prefill other"]
        pre[f"activations ({name})"] = (layer(p) * k + v, v, 0)
        kv["prefill"][f"activations ({name})"] = layer(p) * k
    pre["logits"] = (layer(p) * n["prefill other"] + logits, 0, logits)
    kv["prefill"]["logits"] = layer(p) * n["prefill other"]
    dec["logits"] = (layer(T) * n["decode logits"] + decode_logits_total, 0, decode_logits)
    kv["decode"]["logits"] = layer(T) * n["decode logits"]
    for name, v in dec_points.items():  # the family's decode points lie above the cache at T: two layers here
        dec[f"activations ({name})"] = (layer(T) * n["decode attention"] + v, v, 0)
        kv["decode"][f"activations ({name})"] = layer(T) * n["decode attention"]
    return {"prefill": pre, "decode": dec, "kv": kv, "kv_prefill": layer(p) * n["prefill attention"],
            "kv_decode": layer(T) * n["decode attention"], "host_kv_bytes": layer(T) * n["host"]}


# ---- quantized: QuantizedCache(backend="fp8") -----------------------------------------------------------------
FP8_NOTE = ("cache_implementation='quantized' with cache_config={'backend': 'fp8'}: transformers' own Fp8QuantizedLayer "
            "(float8_e4m3fn K/V, one fp32 scale per tensor fixed at the prompt); QuantizedCache's default backend, "
            "quanto (KIVI-style int2/int4 with a residual of 128 full-precision tokens), needs optimum-quanto, and hqq "
            "needs hqq: neither is installed here, so they are refused")


def quantized_options(fam, cfg, ispec, e: int, pre_points: dict, dec_points: dict, logits: int,
                      decode_logits_total: int, decode_logits: int) -> dict:
    """QuantizedCache(backend="fp8") (transformers 5.23 cache_utils.py Fp8QuantizedLayer), per layer:

    first update (the prompt): scale = (k.abs().amax().float() / 448).clamp(tiny) (a 0-d fp32 tensor), the cache
      keeps (k.float() / scale).to(float8_e4m3fn), 1 byte per element, the same for v; update returns the
      full-precision k and v themselves (alive through the layer's attention).
    decode: the new token quantized with the fixed scale, `torch.cat` onto the fp8 K (the old fp8 tensors stay
      bound to the update's locals until it returns), then the whole cache dequantized for the attention:
      (fp8.float() * scale).to(dtype): K and V of p + t tokens in the weights' dtype, beside the fp32
      float() and product temporaries of the one being dequantized (8 bytes per element).
    High points (measured op by op, tests/test_infer_caches.py): prefill, the last layer's attention (every layer's
    fp8 K/V and its own full-precision K/V), its v quantization (k.float() and the division, 8 B per element, 5
    in fp32 where float() is k itself: the division and the fp8 copy), its MLP and the logits; decode, the last
    layer's value dequantization, its attention over the dequantized K/V and the logits."""
    x = fam.shape(cfg)
    L = cfg.layers
    b, p, T = ispec.batch_size, ispec.prompt_len, ispec.total_len - 1
    k8 = lambda t: b * x.kv * x.d * t  # one layer's K (or V) in fp8 for t tokens
    scales = 2 * 4 * L  # a 0-d fp32 scale for K and for V in every layer
    q_p, q_T = 2 * L * k8(p) + scales, 2 * L * k8(T) + scales
    own_p, own_T = 2 * k8(p) * e, 2 * k8(T) * e  # one layer's K/V in the weights' dtype
    if fam.fused_qkv:  # Phi-3: the prompt's v is a view of the qkv_proj output, already counted in the points
        own_p = k8(p) * e
    quant_tmp = (8 if e < 4 else 5) * k8(p)  # v.float() and v / scale (fp32: the quotient and the fp8 copy)
    masked = fam.infer_prefill_window_mask(cfg, ispec) if hasattr(fam, "infer_prefill_window_mask") else False
    # the attention's tensors at the update call: the points' context, the input norm's output and q after RoPE
    at_update = (pre_points["attention"] - fam.infer_attention_at(cfg, ispec, e, p, p, masked)
                 + b * x.a * p * x.d * e)
    unwritten = fam.infer_prefill_unwritten_kv(cfg, ispec, e)  # the family's RoPE point: its own entry below
    pre = {f"activations ({k})": ((q_p + own_p if k == "attention" else q_p) + v, v, 0)
           for k, v in pre_points.items() if k not in unwritten}
    pre["activations (the last layer's value quantization)"] = (q_p - k8(p) + own_p + quant_tmp + at_update,
                                                                at_update + quant_tmp, 0)
    # the last layer's RoPE of q, before its update: the q/k/v projections' outputs (one fused output for Phi-3,
    # the same bytes) and q * cos, rotate_half's cat and its product with sin (3 q), beside the other layers' fp8
    qb = b * x.a * p * x.d * e
    # (at_update holds the q projection's output; Phi-3's fused qkv output holds k and v's too)
    rope = at_update + 3 * qb + (-qb if fam.fused_qkv else 2 * b * x.kv * p * x.d * e)
    # the family's own points before the last layer's update (RMSDecoder.infer_rope_at: q's or k's rotation and
    # eager's masks; Qwen 3's q norm) replace that one; all stand on the other layers' fp8 K/V and scales
    before = {f"activations (the last layer's {k})": pre_points[k] for k in unwritten} or {
        "activations (the last layer's RoPE of q)": rope}
    for k, v in before.items():
        pre[k] = (q_p - 2 * k8(p) - 8 + v, v, 0)
    pre["logits"] = (q_p + logits, 0, logits)
    kv = {"prefill": {k: q_p + (own_p if k == "activations (attention)" else 0) for k in pre},
          "decode": {}}
    for k in before:
        kv["prefill"][k] = q_p - 2 * k8(p) - 8
    kv["prefill"]["activations (the last layer's value quantization)"] = q_p - k8(p) + own_p
    dec = {"logits": (q_T + decode_logits_total, 0, decode_logits)}
    kv["decode"]["logits"] = q_T
    att = dec_points.get("attention over the cache")
    if att is not None:  # above a DynamicCache at T: the returned K/V are that cache's last layer
        dec["activations (attention over the dequantized cache)"] = (q_T + own_T + att, att, 0)
        kv["decode"]["activations (attention over the dequantized cache)"] = q_T + own_T
        # the step's ids, scores, hidden states and q/k/v: the cache concatenation point's extras without its old values
        cat = dec_points["cache concatenation (the last layer's old values)"] - b * x.kv * x.d * (T - 1) * e
        deq = 2 * k8(T - 1) + 2 * k8(1) + k8(T) * e + 8 * k8(T)  # old fp8 K/V, the new token's, K dequantized, V's temps
        dec["activations (the last layer's value dequantization)"] = (q_T + deq + cat, deq + cat, 0)
        kv["decode"]["activations (the last layer's value dequantization)"] = q_T
    return {"prefill": pre, "decode": dec, "kv": kv, "kv_prefill": q_p, "kv_decode": q_T}
