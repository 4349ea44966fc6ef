"""generate()'s decode under a sliding window that binds (--cache sliding; no torch).

transformers 5.23 cache_utils.py: DynamicCache(config) gives every layer whose config sets a sliding window a
DynamicSlidingWindowLayer. Its update is

    full_key_states = torch.cat([self.keys, key_states], dim=-2)
    full_value_states = torch.cat([self.values, value_states], dim=-2)
    self.keys = full_key_states[:, :, -self.sliding_window + 1:, :]     # a view: the cat's storage stays
    self.values = full_value_states[:, :, -self.sliding_window + 1:, :]
    return full_key_states, full_value_states

so a sliding layer holds the whole storage of its last cat: after the prompt's forward p tokens (the view keeps
the last w - 1 of them, the storage all p), after a decode step that brought the layer to T tokens
min(T - 1, w - 1) + 1 = min(T, w). Both old K and V live until both cats are made (the old storage dies when
`self.keys` / `self.values` are rebound). A full-attention layer (DynamicLayer) rebinds `self.keys` right after
its cat: its old keys are gone before the values' cat. The attention reads the returned full states:
min(T, w) keys for a sliding layer, T for a full one (get_mask_sizes gives the mask the same length).

So the cache shrinks at the first decode step when p > w: that step's first layers still hold the prompt's
storage, and the decode peak may be there rather than at the last step. The points are evaluated at the first
and at the last decode step, at every layer (measured op by op on the live-bytes timeline, tests/test_infer_caches.py).
"""
from __future__ import annotations

from functools import lru_cache

# the prefill point of the last layer's RoPE (the decoder's infer_prefill_points and the windowed caches' points here;
# before its cache update)
ROPE_POINT = "RoPE of q and k (before the cache update)"


def binds(windows: list, ispec) -> bool:
    """True when some layer's window is no longer than the last decode step's tokens (p + n - 1): the
    DynamicSlidingWindowLayer then keeps fewer tokens than a DynamicLayer would (or SDPA needs its mask)."""
    return any(w is not None and w <= ispec.total_len - 1 for w in windows)


def stored(w, p: int, t: int) -> int:
    """Tokens one layer's K (or V) storage holds after decode step t (0: the prompt's forward) of a prompt of p."""
    if t == 0:
        return p
    return p + t if w is None else min(p + t, w)


@lru_cache(maxsize=64)
def layout(windows: tuple) -> tuple:
    """(the layer kinds, sliding first, each kind's layer count, the layers worth evaluating: the first two, the
    last, and each kind's first and last)."""
    kinds = tuple(sorted(set(windows), key=lambda w: (w is None, w or 0)))
    L = len(windows)
    cand = {0, 1, L - 1} | {windows.index(w) for w in kinds} | {L - 1 - windows[::-1].index(w) for w in kinds}
    # each evaluated layer with the count of every kind before it and after it
    cand = [(i, {w: windows[:i].count(w) for w in kinds}, {w: windows[i + 1:].count(w) for w in kinds})
            for i in sorted(i for i in cand if 0 <= i < L)]
    return kinds, {w: windows.count(w) for w in kinds}, cand


def kv_after(fam, c, ispec, e: int, t: int) -> int:
    """The cache's bytes after decode step t (every layer's K and V storage)."""
    x = fam.shape(c)
    u = ispec.batch_size * x.kv * x.d * e
    _, count, _ = layout(tuple(fam.infer_layer_windows(c)))
    return sum(n * 2 * u * stored(w, ispec.prompt_len, t) for w, n in count.items())


def decode_points(fam, c, ispec, e: int) -> tuple[int, dict[str, int]]:
    """(the cache's bytes after the last decode step, name -> bytes of the decode high points above the weights,
    the prompt, generate's own tensors and that last cache: a point of the first step may lie below it or above).
    Every layer of the first and the last step is evaluated; the highest layer of each kind is kept.
    fam is the RMSDecoder family."""
    x = fam.shape(c)
    b, p, n, V = ispec.batch_size, ispec.prompt_len, ispec.new_tokens, c.vocab_size
    windows = tuple(fam.infer_layer_windows(c))
    kinds, count, candidates = layout(windows)
    u = b * x.kv * x.d * e  # one token's K (or V) in one layer
    prev = 4 * b * V * (2 if fam.infer_has_eos else 1)  # the previous step's fp32 logits copy and its scores
    rope = 2 * b * fam.rope_dim(c) * e
    qkv = b * (x.a + 2 * x.kv) * x.d * e  # the step's q and k after RoPE, and v
    # at the cat a fused qkv projection's output (Phi-3's `qkv`, v a view of it) is alive beside q and k after
    # RoPE (as planner/arch/decoder.py infer_decode_points; measured: phi3 V97 h32 a4 kv2 b2 s256 w48 sdpa fp32)
    fused = b * (x.a + x.kv) * x.d * e if fam.fused_qkv else 0
    last = n - 1
    kv_last = sum(k * 2 * u * stored(w, p, last) for w, k in count.items())
    points: dict[str, int] = {}
    for t in sorted({1, last}):
        T = p + t  # tokens after this step's update: the attention's and the masks' length
        ids = 16 * b * T  # generate's input_ids and attention_mask, grown to T inside the step's forward
        kv_len = {w: (T if w is None else min(T, w)) for w in kinds}
        # the masks the model builds before its layers, alive through the step: eager, one additive (b, 1, 1,
        # kv_len) mask per layer kind in the weights' dtype; sdpa, a bool (1, 1, 1, w) mask once kv_len reaches the
        # window (masking_utils.py _ignore_causal_mask_sdpa), none for a full layer (is_causal)
        if c.attention == "eager":
            masks = sum(b * kv_len[w] * e for w in kinds)
            # a mask the model builds for a layer kind it does not have (Gemma 2's full mask in a 1-layer model:
            # Gemma2.infer_mask_count) spans every token
            masks += max(fam.infer_mask_count(c, ispec) - len(kinds), 0) * b * T * e
        else:
            masks = sum(kv_len[w] for w in kinds if w is not None and kv_len[w] >= w)
        # per kind: (bytes of its own K/V before and after the update, the attention's tensors beyond them)
        per = {}
        for w in kinds:
            old, new = 2 * u * stored(w, p, t - 1), 2 * u * stored(w, p, t)
            att = fam.infer_attention_at(c, ispec, e, 1, kv_len[w], w is not None and kv_len[w] >= w)
            # Phi-3's fused qkv output, bound through the attention (Phi3.infer_attention adds it for the plain
            # cache; measured here: phi3 V1000 h64 a4 kv2 b2 s64 w48 eager fp32, step 1's softmax, 1,024 B)
            att += b * (x.a + 2 * x.kv) * x.d * e if fam.fused_qkv else 0
            if c.attention == "eager":
                att -= b * kv_len[w] * e  # its mask is counted in `masks`
            # a sliding layer holds both old K and V and both new; a DynamicLayer new K, old V, new V
            cat = old + new if w is not None else new + old // 2
            per[w] = (old, new, cat, att)
        # the layers before l hold their new K/V, those after it their old: that sum runs monotonically within a
        # run of alike layers, so its highest point is at the first layers, the last one, or a kind's first / last
        best = {}
        for l, before, after in candidates:
            w = windows[l]
            old, new, cat, att = per[w]
            # inputs_embeds is the first layer's input (one tensor); later layers' input is another
            step = (3 if l else 2) * b * c.hidden_size * e + rope
            held = sum(before[k] * per[k][1] + after[k] * per[k][0] for k in kinds)
            common = held + ids + prev + step + masks
            for kind, v in (("cache concatenation", common + cat + qkv + fused), ("attention over the cache", common + new + att)):
                if v > best.get(kind, (-1, 0))[0]:
                    best[kind] = (v, l)
        for kind, (v, l) in best.items():
            points[f"decode step {t}, layer {l}: {kind}"] = v
    return kv_last, {k: v - kv_last for k, v in points.items()}


# ---- StaticCache with sliding layers (cache_implementation="static" on a windowed model) ------------------------
def static_buffers(windows, ispec) -> list[int]:
    """Tokens of each layer's K (and V) buffer in generate's StaticCache: max_cache_len = p + n - 1 (the last token
    never enters the model); a sliding layer (StaticSlidingWindowLayer, cache_utils.py) keeps
    min(sliding_window, max_cache_len)."""
    T = ispec.total_len - 1
    return [T if w is None else min(w, T) for w in windows]


def static_binds(windows, ispec) -> bool:
    """Some sliding layer's window is no longer than the StaticCache (p + n - 1): its StaticSlidingWindowLayer keeps
    the window, and its mask is built (masking_utils.py _ignore_causal_mask_sdpa: kv_length >= the window)."""
    return ispec.cache == "static" and any(w is not None and w <= ispec.total_len - 1 for w in windows)


def static_mask_lengths(fam, c, ispec, phase: str) -> dict:
    """Each mask kind's key length (None: the full mask, else a window) in the prompt's forward or a decode step
    (StaticSlidingWindowLayer.get_mask_sizes: in the prompt p when p > the window (the layer returns the prompt's own
    K/V), else the window; in decode the window; a full layer's StaticLayer.get_mask_sizes: p + n - 1)."""
    windows = tuple(fam.infer_layer_windows(c))
    T, p = ispec.total_len - 1, ispec.prompt_len
    out = {}
    for w, W in zip(windows, static_buffers(windows, ispec)):
        out[w] = T if w is None else (p if phase == "prefill" and p > W else W)
    return out


def static_window_options(fam, c, ispec, e: int, logits: int, decode_logits_total: int, decode_logits: int,
                          prev_step_total: int) -> dict:
    """The prefill and decode options of planner/estimate/inference.py for a StaticCache whose sliding layers keep
    their window (transformers 5.23 cache_utils.py StaticSlidingWindowLayer, W = min(w, p + n - 1) tokens):

    prompt   each layer allocates its buffers (zeros, W or p + n - 1) at its first update. A sliding layer with
             p > W copies the prompt's last W tokens in and returns the prompt's own K/V (key_states after RoPE and
             the value projection's view), alive through its attention over p keys: 2*b*kv*p*d*e beyond the buffers
             (k only with Phi-3's fused qkv: v is a view of the projection output already counted); p <= W:
             index_copy_ in place, attention over the W-token buffer. A full layer attends over p + n - 1.
    decode   a full sliding layer (p + t - 1 >= W) rolls: `self.keys.roll(-1)` and `self.values.roll(-1)` (W tokens
             each), an index tensor (8 B), then copies them back: 2*b*kv*W*d*e + 8 beside the buffers at its
             update; attention over W keys (p + n - 1 for a full layer).
    The masks generate builds for a StaticCache (prepare_inputs_for_generation, made contiguous): eager, one per
    kind the model builds (full: p + n - 1 keys; sliding: static_mask_lengths), (b, 1, s, kv) in the weights' dtype;
    SDPA, the sliding layers' bool mask (b, 1, s, kv) (measured: mistral V500 h64 a4 kv2 L2 w40 b2 p100 n8 sdpa
    fp32, (2, 1, 100, 100) in the prompt, (2, 1, 1, 40) in decode).
    Points are evaluated at each kind's last layer (its cache is the largest: every earlier layer's buffers exist).
    Returns {"prefill": {name: (total above base, activations, logits)}, "decode": {...}, "kv": {phase: {name: kv}},
    "kv_prefill", "kv_decode"}."""
    x = fam.shape(c)
    b, p, T = ispec.batch_size, ispec.prompt_len, ispec.total_len - 1
    windows = list(fam.infer_layer_windows(c))
    L = len(windows)
    bufs = static_buffers(windows, ispec)
    u = b * x.kv * x.d * e  # one token's K (or V) in one layer
    layer_kv = [2 * u * B for B in bufs]
    total = sum(layer_kv)
    kinds = sorted(set(windows), key=lambda w: (w is None, w or 0))
    last = {w: max(i for i, v in enumerate(windows) if v == w) for w in kinds}
    eager = c.attention == "eager"
    me = e if eager else 1
    pre_masks = static_mask_lengths(fam, c, ispec, "prefill")
    dec_masks = static_mask_lengths(fam, c, ispec, "decode")
    # the masks the model builds: eager, infer_mask_count of them (Gemma 2's full mask even without a full layer);
    # SDPA, the sliding kinds' bool masks, batch-wide (a full layer's padded static mask is not passed: measured)
    def built(lengths: dict, s: int) -> int:
        if eager:
            extra = max(fam.infer_mask_count(c, ispec) - len(lengths), 0)
            return (sum(lengths.values()) + extra * T) * b * s * me
        return sum(v for w, v in lengths.items() if w is not None) * b * s
    unwritten_keys = set(fam.infer_prefill_unwritten_kv(c, ispec, e))
    pre, kv = {}, {"prefill": {}, "decode": {}}
    for w in kinds:
        l = last[w]
        before = sum(layer_kv[:l])  # the earlier layers' buffers
        own = layer_kv[l]
        kv_len = pre_masks[w]
        masked = (not eager) and w is not None
        fwd = fam.infer_forward_points(c, ispec, e, p, kv_len, masked)
        # infer_forward_points counts the masks as infer_mask_count (eager) or one sliding bool mask (masked) of
        # kv_len keys: the model's own masks instead
        assumed = (fam.infer_mask_count(c, ispec) * b * p * kv_len * me) if eager else (p * kv_len if masked else 0)
        fix = built(pre_masks, p) - assumed
        # a sliding layer with p > W returns the prompt's own K/V: alive through its attention
        returned = 0
        if w is not None and p > bufs[l]:
            returned = u * p * (1 if fam.fused_qkv else 2)
        kind = "full" if w is None else f"sliding (window {w})"
        for k, v in fwd.items():
            if k in unwritten_keys:  # before the layer's update: its buffers are not allocated yet
                held = before
            elif k == "attention":
                held = before + own + returned
            else:
                held = before + own
            name = f"activations (layer {l}, {kind}: {k})"
            pre[name] = (held + v + fix, v + fix, 0)
            kv["prefill"][name] = held
    pre["logits"] = (total + logits, 0, logits)
    kv["prefill"]["logits"] = total
    # decode: the buffers are all there; the step's points over each kind's keys
    dec = {"logits": (total + decode_logits_total, 0, decode_logits)}
    kv["decode"]["logits"] = total
    if prev_step_total is not None:
        dec["kwargs update"] = (total + prev_step_total[0], 0, prev_step_total[1])
        kv["decode"]["kwargs update"] = total
    if ispec.new_tokens > 1:
        ids = 16 * b * T
        prev = 4 * b * c.vocab_size * (2 if fam.infer_has_eos else 1)
        step = 3 * b * c.hidden_size * e + 2 * b * fam.rope_dim(c) * e
        qkv = b * (x.a + 2 * x.kv) * x.d * e
        fused = b * (x.a + x.kv) * x.d * e if fam.fused_qkv else 0
        masks = built(dec_masks, 1)  # counted here, not in infer_cache_state_bytes (static_binds)
        for w in kinds:
            l = last[w]
            kind = "full" if w is None else f"sliding (window {w})"
            kv_len = dec_masks[w]
            masked = (not eager) and w is not None
            att = fam.infer_attention_at(c, ispec, e, 1, kv_len, masked)
            att += b * (x.a + 2 * x.kv) * x.d * e if fam.fused_qkv else 0
            if eager:
                att -= b * kv_len * e  # its mask is in `masks`
            step_l = step - (b * c.hidden_size * e if l == 0 and L > 1 else 0)
            dec[f"activations (decode, layer {l}, {kind}: attention)"] = (
                total + ids + prev + step_l + masks + att, att, 0)
            fwd = fam.infer_forward_points(c, ispec, e, 1, kv_len, masked)
            assumed = (fam.infer_mask_count(c, ispec) * b * kv_len * me) if eager else (kv_len if masked else 0)
            for k, v in fwd.items():
                if k == "attention":
                    continue
                dec[f"activations (decode, layer {l}, {kind}: the step's {k})"] = (
                    total + ids + prev + v - assumed + masks, v - assumed + masks, 0)
            if w is not None and p + ispec.new_tokens - 2 >= bufs[l]:
                # the roll of a full sliding layer: new K and V (W tokens each) and the index tensor
                roll = 2 * u * bufs[l] + 8
                dec[f"activations (decode, layer {l}, {kind}: the roll of its full window)"] = (
                    total + ids + prev + step_l + masks + qkv + fused + roll, qkv + fused + roll, 0)
        for k in dec:
            kv["decode"][k] = total
    return {"prefill": pre, "decode": dec, "kv": kv, "kv_prefill": total, "kv_decode": total}
