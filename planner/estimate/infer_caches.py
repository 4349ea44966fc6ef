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
