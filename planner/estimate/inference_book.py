"""Peak memory of the book's `generate_text_simple` (LLMs-from-scratch ch04) on its GPTModel: no cache, the whole
context recomputed for every new token (no torch here).

    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]
        with torch.no_grad():
            logits = model(idx_cond)
        logits = logits[:, -1, :]
        probas = torch.softmax(logits, dim=-1)
        idx_next = torch.argmax(probas, dim=-1, keepdim=True)
        idx = torch.cat((idx, idx_next), dim=1)

What is alive (planner/models/gpt2.py, the book's code; every term below measured op by op on the live-bytes
tracker, planner/measure/tracker.py, fp32 and bf16, eager and sdpa):
  - while a forward runs, the previous iteration's `logits` is a view (`logits[:, -1, :]`) of its whole
    (b, t-1, V) output, so that output, `probas` (b, V), `idx_next` (b, 1) int64 and `idx` (b, t) int64 live
    beside it (decode only: in the first forward, the prefill, `idx` is the prompt and nothing else lives);
  - GPTModel.forward keeps its locals to the end: tok_embeds (b,t,h), pos_embeds (t,h) and the embedding sum
    (b,t,h) through the blocks; nn.Sequential holds the current block's input (a tensor of its own from the
    second block on);
  - in a block (its last one is the largest): norm1's output and q, k, v (b,t,h each), then
      eager: attn_scores, the scaled scores and the softmax (b,a,t,t each) and `self.mask.bool()` (a (ctx, ctx)
             bool copy), or later two score tensors and the context's contiguous copy and out_proj's output;
      sdpa:  the fused kernel's output and out_proj's output (b,t,h each: the CPU kernel's output is already
             laid out (b,t,a,d), so `.contiguous()` copies nothing);
      MLP:   the block's x after attention, norm2's output, and the book's tanh GELU at its high point: fc1's
             output, 0.5*x, x**3 and 0.044715*x**3 (b,t,4h each) and the 0-d fp32 sqrt(2/pi);
  - the final LayerNorm (mean, var: (b,t,1); x - mean is freed by the division; norm_x, scale*norm_x and the
    output: (b,t,h)), then the head's (b,t,V) logits beside tok_embeds, pos_embeds and the normed x;
  - after the forward: softmax's probas beside the previous one, then the cat's new idx beside the old one.
The forward's points grow with t, so the last forward (t = p + n - 1) is the decode peak; the first (t = p) is
the prefill's.
"""
from __future__ import annotations

from ..accounting import DTYPE_BYTES, buffer_bytes, param_count
from ..arch.terms import Term


def _points(cfg, ispec, t: int, decode: bool) -> dict[str, tuple[int, int]]:
    """name -> (bytes above weights, buffers and prompt, of which logits / probas) in the forward over t tokens."""
    e = DTYPE_BYTES[ispec.param_dtype]
    b, h, a, V, ctx, L = ispec.batch_size, cfg.emb_dim, cfg.n_heads, cfg.vocab_size, cfg.context_length, cfg.n_layers
    f = 4 * h  # the book's FeedForward: emb_dim -> 4 * emb_dim -> emb_dim
    bth = b * t * h * e
    # decode: the previous iteration's logits storage, probas, idx_next and the grown idx
    prev_logits = b * (t - 1) * V * e if decode else 0
    prev = prev_logits + (b * V * e + 8 * b + 8 * b * t if decode else 0)
    prev_lg = prev_logits + (b * V * e if decode else 0)
    emb = bth + t * h * e + bth                      # tok_embeds, pos_embeds, their sum
    blk_in = bth if L >= 2 else 0                    # the last block's input, its own tensor from block 2 on
    if cfg.attention == "sdpa":
        attn = bth + 3 * bth + 2 * bth               # norm1 out, q k v, the kernel's output and out_proj's
    else:
        s2 = b * a * t * t * e
        attn = bth + 3 * bth + ctx * ctx + max(3 * s2, 2 * s2 + 2 * bth)
    mlp = bth + bth + 4 * b * t * f * e + 4          # x after attention, norm2 out, the GELU's four, sqrt(2/pi)
    final_norm = t * h * e + bth + bth + 3 * bth + 2 * b * t * e   # tok, pos, blocks' out, norm's (b,t,h) x3, mean, var
    logits = b * t * V * e
    head = bth + t * h * e + bth + logits            # tok, pos, the normed x and the logits
    probas = b * V * e
    idx_old = 8 * b * t if decode else 0
    return {"attention": (prev + emb + blk_in + attn, prev_lg),
            "MLP (GELU)": (prev + emb + blk_in + mlp, prev_lg),
            "final norm": (prev + final_norm, prev_lg),
            "head (logits)": (prev + head, prev_lg + logits),
            "softmax (probas)": (logits + probas + (probas + 8 * b + idx_old if decode else 0),
                                 logits + probas + (probas if decode else 0)),
            "cat (idx)": (logits + probas + 8 * b + idx_old + 8 * b * (t + 1), logits + probas)}


def estimate_book_inference(cfg, ispec) -> dict:
    """The record planner.estimate.inference.estimate_inference gives, for generate_text_simple."""
    e = DTYPE_BYTES[ispec.param_dtype]
    b, p, n = ispec.batch_size, ispec.prompt_len, ispec.new_tokens
    weights = param_count(cfg) * e
    buffers = buffer_bytes(cfg, ispec.param_dtype)
    inputs = 8 * b * p  # the prompt's input_ids (int64); the book passes no attention mask
    base = weights + buffers + inputs
    phases = {"prefill": (p, False)}
    if n > 1:
        phases["decode"] = (p + n - 1, True)
    phase, parts, points = {}, {}, {}
    for name, (t, decode) in phases.items():
        pts = _points(cfg, ispec, t, decode)
        key = max(pts, key=lambda k: pts[k][0])
        phase[name], parts[name], points[name] = base + pts[key][0], (key, *pts[key]), pts
    peak_phase = max(phase, key=phase.get)
    key, above, lg = parts[peak_phase]
    terms = [Term("weights", "P*e", weights, where="kept"), Term("buffers (the causal masks)", "L*ctx^2*e", buffers,
                                                                  where="kept"),
             Term("prompt ids", "8*b*p", inputs, where="kept")]
    for name, pts in points.items():
        t = phases[name][0]
        terms += [Term(f"{name} (t = {t}): {k}", "planner/estimate/inference_book.py", v[0], where=name)
                  for k, v in pts.items()]
    return {
        "kind": "estimate",
        "peak_bytes": phase[peak_phase], "peak_phase": peak_phase, "phase_peak_bytes": phase,
        "persistent_bytes": base,
        "components": {"weights": weights, "buffers": buffers, "inputs": inputs, "kv_cache": 0,
                       "activations": above - lg, "logits": lg},
        "kv_cache_bytes_per_token": 0, "prefill_high_point": parts["prefill"][0],
        "terms": [dict(vars(t)) for t in terms],
        "notes": [f"the book's GPT-2: generate_text_simple({n} new tokens), no cache: the whole context (up to "
                  f"{p + n - 1} tokens) recomputed for every token; the peak is at its {key} ({peak_phase}), "
                  f"{cfg.attention} attention"],
    }
