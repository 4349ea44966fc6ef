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


def binds(windows: list, ispec) -> bool:
    """True when some layer's window is no longer than the last decode step's tokens (p + n - 1): the
    DynamicSlidingWindowLayer then keeps fewer tokens than a DynamicLayer would (or SDPA needs its mask)."""
    return any(w is not None and w <= ispec.total_len - 1 for w in windows)


def stored(w, p: int, t: int) -> int:
    """Tokens one layer's K (or V) storage holds after decode step t (0: the prompt's forward) of a prompt of p."""
    if t == 0:
        return p
    return p + t if w is None else min(p + t, w)


def decode_points(fam, c, ispec, e: int) -> tuple[int, dict[str, int]]:
    """(the cache's bytes after the last decode step, name -> bytes of every decode high point above the weights,
    the prompt, generate's own tensors and that last cache: a point of the first step may lie below it or above).
    fam is the RMSDecoder family."""
    x = fam.shape(c)
    b, p, n, V = ispec.batch_size, ispec.prompt_len, ispec.new_tokens, c.vocab_size
    windows = fam.infer_layer_windows(c)
    u = b * x.kv * x.d * e  # one token's K (or V) in one layer
    prev = 4 * b * V * (2 if fam.infer_has_eos else 1)  # the previous step's fp32 logits copy and its scores
    rope = 2 * b * fam.rope_dim(c) * e
    qkv = b * (x.a + 2 * x.kv) * x.d * e  # the step's q and k after RoPE, and v
    kinds = sorted({w for w in windows}, key=lambda w: (w is None, w or 0))  # one mask per layer kind (eager)
    last = n - 1
    kv_last = sum(2 * u * stored(w, p, last) for w in windows)
    points: dict[str, int] = {}
    for t in sorted({1, last}):
        T = p + t  # tokens after this step's update: the attention's and the masks' length
        ids = 16 * b * T  # generate's input_ids and attention_mask, grown to T inside the step's forward
        now = [2 * u * stored(w, p, t) for w in windows]
        before = [2 * u * stored(w, p, t - 1) for w in windows]
        kv_len = {w: (T if w is None else min(T, w)) for w in kinds}
        # the masks the model builds before its layers, alive through the step: eager, one additive (b, 1, 1,
        # kv_len) mask per layer kind in the weights' dtype; sdpa, a bool (1, 1, 1, w) mask once kv_len reaches the
        # window (masking_utils.py _ignore_causal_mask_sdpa), none for a full layer (is_causal)
        if c.attention == "eager":
            masks = sum(b * kv_len[w] * e for w in kinds)
        else:
            masks = sum(kv_len[w] for w in kinds if w is not None and kv_len[w] >= w)
        done = 0
        for l, w in enumerate(windows):
            rest = sum(before[l + 1:])
            # inputs_embeds is the first layer's input (one tensor); later layers' input is another
            step = (3 if l else 2) * b * c.hidden_size * e + rope
            common = done + rest + ids + prev + step + masks
            if w is None:  # DynamicLayer: new K, old V, new V
                cat = u * stored(w, p, t) + u * stored(w, p, t - 1) + u * stored(w, p, t)
            else:  # both old K and V, both new
                cat = before[l] + now[l]
            points[f"decode step {t}, layer {l}: cache concatenation"] = common + cat + qkv
            masked = w is not None and kv_len[w] >= w
            att = fam.infer_attention_at(c, ispec, e, 1, kv_len[w], masked)
            if c.attention == "eager":
                att -= b * kv_len[w] * e  # its mask is counted in `masks`
            points[f"decode step {t}, layer {l}: attention over the cache"] = common + now[l] + att
            done += now[l]
    return kv_last, {k: v - kv_last for k, v in points.items()}
