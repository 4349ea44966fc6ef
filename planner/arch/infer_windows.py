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
            masks += max(fam.infer_mask_count(c) - len(kinds), 0) * b * T * e
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
