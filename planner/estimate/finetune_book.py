"""Peak memory of a fine-tuning step on the book's GPT-2 (issue #12; planner/models/gpt2.py, no torch).

The book's block is not transformers' RMSNorm decoder (planner/estimate/finetune.py): its LayerNorm is
written out (mean, var, (x - mean) / sqrt(var + eps), scale * norm_x + shift), its MLP is Linear, the
tanh GELU written out, Linear (not gated), its attention is the book's own (q @ k^T, masked_fill_ with the
block's registered mask buffer .bool(), / sqrt(d), softmax, dropout, @ v), and nn.Dropout(drop_rate)
follows the embeddings, the attention probabilities and both residual branches.

Autograd saves of an op's inputs only what the grads it must compute need (torch's derivatives.yaml),
so the saved set follows from what needs grad, walked through the block in order:
  - var(x) saves x; (x - mean) / std saves x - mean and std; sqrt saves its result (std): when x needs grad;
    scale * norm_x saves norm_x when the scale trains (the shift's add saves nothing);
  - a Linear saves its input when its weight trains (a frozen Linear only its weight, a parameter);
  - a @ b saves b for a's grad and a for b's grad; masked_fill_ its mask (the full context x context
    bool copy of the buffer, sliced: one c^2-byte storage) and softmax its output, when the scores need
    grad; CPU dropout is input * noise (aten Dropout.cpp's non-fused path): it saves the noise (input
    dtype) when the input needs grad, and p = 0 returns the input itself (saves nothing);
  - the GELU saves x (pow), the sqrt(2/pi) constant (0-d fp32), tanh's output, 0.5 * x and 1 + tanh;
  - a peft LoRA adapter (peft/tuners/lora/layer.py Linear.forward: result + lora_B(lora_A(dropout(x))) *
    scaling, x cast to the fp32 adapter dtype first) saves lora_A's input (x itself on an fp32 base at
    p = 0, an fp32 copy on a bf16 base, the dropout's output with its fp32 noise when x needs grad) and
    lora_B's input (lora_A's b*s*r fp32 output); each adapter casts and drops out on its own.
The embeddings never train in a fine-tuning step (--train-layers keeps them frozen, LoRA wraps Linears
only) and peft calls no enable_input_require_grads on a module without get_input_embeddings, so the
blocks' input needs no grad until the first trainable weight.
With checkpointing (GPTModel: `checkpoint(block, x, use_reentrant=False)` per block) a block that saves
anything keeps its input, and backward recomputes it (the same saved set) before its backward.
Every count is checked against the saved-tensor inventory and the live-bytes op timeline of the real
model (planner.measure.tracker) in tests/test_finetune.py and `python -m planner bench finetune`.
"""
from __future__ import annotations

from ..accounting import tensor_inventory
from ..arch import family_of
from ..config import ConfigError
from ..finetune import adapted_linears, trainable_names
from .activations import Term, Widths
from .finetune import optimizer_terms, persistent_bytes, trainable_params
from .record import TrainEstimate
from ..losses import is_fused
from .losses import finetune_fused

ADAPTER_BYTES = 4  # peft autocast_adapter_dtype=True: adapters are fp32 on fp32 and bf16 bases


def check_supported(cfg, spec) -> None:
    if cfg.attention != "eager":
        raise ConfigError("fine-tuning the book's GPT-2 is estimated with its own attention (attention eager) "
                          "so far, not sdpa")
    if spec.autocast_dtype is not None:
        raise ConfigError("fine-tuning under autocast (fp16-amp / bf16-amp) is not modelled yet; use fp32 or a bf16 "
                          "base (--precision bf16: peft keeps the adapters fp32)")
    if spec.grad_accum > 1:
        raise ConfigError("fine-tuning with gradient accumulation is not modelled yet")
    if getattr(spec, "quantize_base", "none") != "none":
        raise ConfigError("a quantized base (QLoRA) is not modelled for the book's GPT-2 yet")


# The block's ops in forward order (Term.part): backward meets them in reverse, freeing each one's saved
# tensors as it runs (torch releases a node's saved variables after its apply, retain_graph=False).
NODES = ("norm1", "attn.in", "scores", "mask", "softmax", "attn.dropout", "context", "attn.out", "resid.dropout1",
         "norm2", "mlp.in", "gelu", "mlp.out", "resid.dropout2")


def _adapter(label: str, node: str, b: int, s: int, n_in: int, spec, e_x: int, rg_in: bool, shared: set,
             key: str) -> list[Term]:
    """One LoRA adapter's saved tensors on input x (n_in wide, e_x bytes an element); `shared` holds the
    inputs already saved (on an fp32 base at p = 0 lora_A saves x itself: one storage for all readers)."""
    r, p = spec.lora_r, spec.lora_dropout
    bsn = b * s * n_in
    terms = []
    if p > 0:
        terms.append(Term(f"{label} LoRA dropout output" + (" and noise" if rg_in else ""), "(1 + rg)*b*s*in*4",
                          (2 if rg_in else 1) * bsn * ADAPTER_BYTES, True, part=node))
    elif e_x != ADAPTER_BYTES:
        terms.append(Term(f"{label} LoRA fp32 copy of x", "b*s*in*4", bsn * ADAPTER_BYTES, True, part=node))
    elif key not in shared:
        shared.add(key)
        terms.append(Term(f"{label} LoRA input x", "b*s*in*4", bsn * ADAPTER_BYTES, True, part=node))
    terms.append(Term(f"{label} lora_A output", "b*s*r*4", b * s * r * ADAPTER_BYTES, True, part=node))
    return terms


def _layernorm(label: str, node: str, b: int, s: int, h: int, e: int, rg_in: bool, trains: bool,
               per_layer: bool = True, where: str = "block") -> list[Term]:
    """The book's LayerNorm: var(x) saves x, (x - mean) / std saves x - mean and std (sqrt's result), when
    x needs grad; scale * norm_x saves norm_x when the scale trains."""
    terms = []
    if rg_in:
        terms.append(Term(f"{label}: x, x - mean, std (input needs grad)", "2*b*s*h*e + b*s*e",
                          2 * b * s * h * e + b * s * e, per_layer, where, node))
    if trains:
        terms.append(Term(f"{label}: norm_x (scale trains)", "b*s*h*e", b * s * h * e, per_layer, where, node))
    return terms


def block_saved(cfg, spec, w, i: int, g: bool, trains: set, adapted: dict) -> tuple[list[Term], bool]:
    """Block i's saved tensors (Term.part: its node in NODES), given whether its input needs grad; and
    whether its output needs grad."""
    b, s, h, a = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.n_heads
    e = w.e_r
    bsh, bas2, f = b * s * h, b * a * s * s, 4 * h
    p = cfg.drop_rate > 0
    pre = f"trf_blocks.{i}"
    w_trains = lambda m: f"{pre}.{m}.weight" in trains
    terms: list[Term] = []
    shared: set = set()

    def linear_group(node: str, mods: tuple[str, ...], x_rg: bool, n_in: int, key: str) -> dict[str, bool]:
        """Linears reading one input: the input saved once if a weight trains, and each adapter's tensors;
        returns module -> whether its output needs grad."""
        out = {}
        if any(w_trains(m) for m in mods):
            terms.append(Term(f"{node} input (weights train)", "b*s*in*e", b * s * n_in * e, True, part=node))
            shared.add(key)
        for m in mods:
            lora = f"{pre}.{m}" in adapted
            if lora:
                terms.extend(_adapter(m, node, b, s, n_in, spec, e, x_rg, shared, key))
            out[m] = x_rg or lora or w_trains(m)
        return out

    terms += _layernorm("norm1", "norm1", b, s, h, e, g, f"{pre}.norm1.scale" in trains)
    n1 = g or f"{pre}.norm1.scale" in trains
    qkv = linear_group("attn.in", ("att.W_query", "att.W_key", "att.W_value"), n1, h, "n1")
    q, k, v = qkv["att.W_query"], qkv["att.W_key"], qkv["att.W_value"]
    scores = q or k
    if scores:
        # queries @ keys.transpose(2, 3): k^T for q's grad, q for k's grad (bmm operands, b*a*s*d each)
        terms.append(Term("attention q / k^T (as the grads need them)", "n*b*s*h*e", (int(q) + int(k)) * bsh * e,
                          True, part="scores"))
        terms.append(Term("causal mask.bool() (full context)", "c^2 * 1 B", cfg.context_length ** 2, True,
                          part="mask"))
        terms.append(Term("softmax output", "b*a*s^2*e", bas2 * e, True, part="softmax"))
    probs_saved_by_softmax = scores
    if p and scores:
        terms.append(Term("attention dropout noise", "b*a*s^2*e", bas2 * e, True, part="attn.dropout"))
    if v:
        # attn_weights @ values saves the weights for v's grad: the dropout's output, or (p = 0) the softmax
        # output itself when softmax saved it
        if p or not probs_saved_by_softmax:
            terms.append(Term("attention weights (for v's grad)", "b*a*s^2*e", bas2 * e, True, part="context"))
    if scores:
        terms.append(Term("attention v (for the weights' grad)", "b*s*h*e", bsh * e, True, part="context"))
    ctx_rg = scores or v
    o = linear_group("attn.out", ("att.out_proj",), ctx_rg, h, "ctx")
    o_rg = o["att.out_proj"]
    if p and o_rg:
        terms.append(Term("attention residual dropout noise", "b*s*h*e", bsh * e, True, part="resid.dropout1"))
    r_rg = g or o_rg
    terms += _layernorm("norm2", "norm2", b, s, h, e, r_rg, f"{pre}.norm2.scale" in trains)
    n2 = r_rg or f"{pre}.norm2.scale" in trains
    up = linear_group("mlp.in", ("ff.layers.0",), n2, h, "n2")["ff.layers.0"]
    if up:
        terms.append(Term("GELU x, 0.5*x, tanh, 1 + tanh", "4*b*s*4h*e", 4 * b * s * f * e, True, part="gelu"))
        terms.append(Term("GELU sqrt(2/pi) constant", "4 B (0-d fp32)", 4, True, part="gelu"))
    down = linear_group("mlp.out", ("ff.layers.2",), up, f, "gelu")["ff.layers.2"]
    if p and down:
        terms.append(Term("feed-forward residual dropout noise", "b*s*h*e", bsh * e, True, part="resid.dropout2"))
    return terms, r_rg or down


def book_activations(cfg, spec, w) -> tuple[list[Term], int, list[list[Term]]]:
    """Saved tensors of the forward and the loss, the bytes the loss saved (ce_saved), and each block's
    saved set (empty for a block whose output needs no grad: backward never reaches it)."""
    family = family_of(cfg)
    b, s, h, V = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.vocab_size
    e = w.e_r
    keep = trainable_names(family, cfg, spec)
    inv = [t for t in tensor_inventory(cfg) if t.kind == "param"]
    trains = {t.name for t in inv} if keep is None else keep
    adapted = {lin.module: lin for lin in adapted_linears(family, cfg, spec)}
    terms: list[Term] = []
    per_block: list[list[Term]] = []
    g = False  # the embeddings are frozen: the embedding dropout saves no noise, the first block's input needs no grad
    for i in range(cfg.n_layers):
        blk, g_out = block_saved(cfg, spec, w, i, g, trains, adapted)
        terms += blk
        per_block.append(blk if g_out else [])
        g = g_out
    terms += _layernorm("final norm", "final_norm", b, s, h, e, g, "final_norm.scale" in trains, False, "head")
    if "out_head.weight" in trains:
        terms.append(Term("out_head input (head trains)", "b*s*h*e", b * s * h * e, where="head", part="head"))
    # calc_loss_batch: F.cross_entropy = log_softmax (saves its output) + nll_loss (saves the target, a view of
    # the batch, and total_weight, 0-d in the logits' dtype)
    ce_saved = b * s * V * w.e_ce + w.e_ce
    terms.append(Term("log_softmax output + nll total_weight", "b*s*V*e + e", ce_saved, where="loss"))
    return terms, ce_saved, per_block


def estimate_finetune_book(cfg, spec):

    check_supported(cfg, spec)
    family = family_of(cfg)
    w = Widths.of(spec)
    b, s, h, V = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.vocab_size
    bsV = b * s * V
    train = trainable_params(cfg, spec)
    params, buffers, inputs, grads = persistent_bytes(cfg, spec, train)
    opt_state, opt_tmp = optimizer_terms(train, spec)
    terms, ce_saved, _ = book_activations(cfg, spec, w)
    fused = None
    if is_fused(spec.loss):  # chunked-ce / cce: out_head runs inside the loss (planner/estimate/losses.py)
        terms, ce_saved, fused = finetune_fused(cfg, spec, w, terms, spec.loss)
    activations = sum(t.bytes for t in terms)
    a_before_loss = activations - ce_saved
    logits = bsV * w.e_m  # out_head's output, alive until calc_loss_batch returns
    ce_grads = 2 * bsV * w.e_ce  # nll_loss_backward's grad and _log_softmax_backward_data's (op timeline)
    if fused is not None:  # never whole: a chunk's are in fused.loss_point / fused.backward_point
        logits = ce_grads = 0
    base = params + buffers + inputs + opt_state
    blocks = per_block_all(cfg, spec, w)
    if spec.checkpointing:
        terms, backward_points, forward_points = _checkpointed(cfg, spec, w, blocks, terms, train)
        activations = sum(t.bytes for t in terms)
        a_before_loss = activations - ce_saved
    else:
        backward_points = _backward_points(cfg, spec, w, blocks, train)
        forward_points = _forward_mlp_points(cfg, spec, w, blocks) | _forward_head_points(cfg, spec, w, blocks, terms)
    if fused is not None:  # the head's forward never runs: no b*s*V logits in the forward
        forward_points.pop("forward logits", None)
    forward = max(forward_points.values())
    phase = {
        "forward": base + forward,
        "loss": base + a_before_loss + logits + ce_saved + w.e_ce  # + the loss itself (0-d)
        + (fused.loss_point if fused else 0),
        # + the loss (0-d) at the cross-entropy's backward, and the loss and its grad in the blocks' backward
        "backward": base + max(activations + ce_grads + w.e_ce + (fused.backward_point if fused else 0),
                               2 * w.e_ce + max(backward_points.values(), default=0), grads),
        "optimizer": base + grads + opt_tmp,
        "zero_grad": base + grads,
    }
    peak_phase = max(phase, key=phase.get)
    out_terms = [dict(vars(t)) for t in terms]
    notes = [f"fine-tuning: {len(train)} trainable tensors, {sum(n for _, n, _ in train):,} parameters"
             + (f" (LoRA r={spec.lora_r} on {len(adapted_linears(family, cfg, spec))} linears, fp32 adapters)"
                if spec.lora_r else f" (train_layers {spec.train_layers})")]
    return TrainEstimate(
        params_bytes=params, buffers_bytes=buffers, inputs_bytes=inputs, grads_bytes=grads,
        optimizer_bytes=opt_state, activations_bytes=activations, peak_bytes=phase[peak_phase],
        peak_phase=peak_phase, phase_peak_bytes=phase,
        transients={"logits": logits, "logits_fp32_copy": 0, "cross_entropy_grads": ce_grads,
                    "optimizer_temporaries": opt_tmp, "gradscaler": 0},
        terms=out_terms, notes=notes, backward_points=backward_points)


def per_block_all(cfg, spec, w) -> list[list[Term]]:
    """Every block's saved set as the forward makes it (reached by backward or not)."""
    family = family_of(cfg)
    keep = trainable_names(family, cfg, spec)
    trains = {t.name for t in tensor_inventory(cfg) if t.kind == "param"} if keep is None else keep
    adapted = {lin.module: lin for lin in adapted_linears(family, cfg, spec)}
    out, g = [], False
    for i in range(cfg.n_layers):
        blk, g = block_saved(cfg, spec, w, i, g, trains, adapted)
        out.append(blk)
    return out


def _upto(blk: list[Term], node: str, inclusive: bool = True) -> int:
    """Bytes block `blk` has saved by the end of `node` (or before it)."""
    k = NODES.index(node)
    return sum(t.bytes for t in blk if NODES.index(t.part) < k or (inclusive and t.part == node))


def _forward_mlp_points(cfg, spec, w, blocks: list[list[Term]]) -> dict[str, int]:
    """The forward's high points in the last block's feed-forward (read off the op timeline), above the
    persistent base: everything the earlier blocks saved, what the last one saved before its GELU, and
    alive without being saved: GPTModel.forward's tok_embeds, pos_embeds and x (the embeddings' sum, or
    its dropout), nn.Sequential's `input` (the last block's input, when there are two blocks or more),
    the block's `shortcut` (the residual after attention) and the feed-forward's input.
      gelu: at 0.044715 * pow(x, 3): x, 0.5 * x, pow's output and the product (b*s*4h each), and the
            sqrt(2/pi) constant;
      down: when the GELU's input needs grad, its four saved tensors and its output, and beside them the
            second Linear's output (b*s*h);
      up adapter / down adapter: peft's forward on an adapted ff.layers.0 / ff.layers.2."""
    b, s, h = spec.batch_size, spec.seq_len, cfg.emb_dim
    e = w.e_r
    bsh, bsf = b * s * h, b * s * 4 * h
    last = blocks[-1]
    earlier = sum(t.bytes for blk in blocks[:-1] for t in blk)
    before_gelu = earlier + _upto(last, "mlp.in")
    saved_names = {t.name for t in last}
    block_input_saved = any(t.part == "norm1" and "x, x - mean" in t.name for t in last)
    resid_saved = any(t.part == "norm2" and "x, x - mean" in t.name for t in last)
    n2_saved = any(t.part == "mlp.in" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                   for t in last)
    alive = (2 * bsh * e + s * h * e
             + (bsh * e if cfg.n_layers > 1 and not block_input_saved else 0)
             + (0 if resid_saved else bsh * e) + (0 if n2_saved else bsh * e))
    points = {"forward gelu": before_gelu + alive + 4 * bsf * e + 4,
              "forward attention": _forward_attention_point(
                  cfg, spec, w, blocks, earlier, 2 * bsh * e + s * h * e
                  + (bsh * e if cfg.n_layers > 1 and not block_input_saved else 0))}
    if any(t.part == "gelu" for t in last):
        points["forward down"] = before_gelu + alive + 5 * bsf * e + 4 + bsh * e
    lora = lambda node: any(t.part == node and "lora_A output" in t.name for t in last)
    # on a bf16 base with lora_dropout > 0 the fp32 copy of x (peft's _cast_input_dtype, its local `x`) is
    # alive, not saved, until the adapter's forward returns (at p = 0 it is saved: counted already)
    fp32_x = lambda n: n * ADAPTER_BYTES if e != ADAPTER_BYTES and spec.lora_dropout > 0 else 0
    if lora("mlp.in"):
        # peft's Linear.forward on ff.layers.0, at `result + lora_B(...) * scaling`: the base result (e), the
        # scaled lora_B output and the sum (fp32: the adapter dtype wins the promotion), b*s*4h each
        points["forward up adapter"] = before_gelu + alive + bsf * (e + 2 * ADAPTER_BYTES) + fp32_x(bsh)
    if lora("mlp.out"):
        # the same on ff.layers.2 (b*s*h each), beside the GELU's saved tensors and output and the adapter's
        # saved tensors
        gelu_out_saved = any(t.part == "mlp.out" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                             for t in last)  # counted once: among the GELU's five, and saved
        points["forward down adapter"] = (before_gelu + alive + (5 if any(t.part == "gelu" for t in last) else 1)
                                          * bsf * e + 4 + _upto(last, "mlp.out") - _upto(last, "gelu")
                                          - (bsf * e if gelu_out_saved else 0)
                                          + bsh * (e + 2 * ADAPTER_BYTES) + fp32_x(bsf))
    return points


def _forward_attention_point(cfg, spec, w, blocks: list[list[Term]], held: int, fixed: int) -> int:
    """The forward's high point in the last block's attention (op timeline), above the persistent base:
    `held` (what the earlier blocks keep: their saved sets, or their stashed inputs under checkpointing),
    `fixed` (GPTModel.forward's and nn.Sequential's locals: tok_embeds, pos_embeds, the embeddings' sum,
    the block's input), what the block saved before its attention (its norm1, the q/k/v adapters; none
    under checkpointing), norm1's output unless saved, the locals queries, keys, values (b*s*h each) and
    mask_bool (the c x c bool copy), the bmm operands q and k^T when saved, and the s x s tensors alive:
    at the softmax the scores, their scaled copy and the softmax output; with dropout after it the scores,
    the softmax output, the dropout's noise and its output (b*a*s^2 each)."""
    b, s, h, a = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.n_heads
    e = w.e_r
    bsh, bas2 = b * s * h, b * a * s * s
    last = blocks[-1]
    n1_saved = any(t.part == "attn.in" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                   for t in last)
    qk = sum(t.bytes for t in last if t.part == "scores")
    return (held + fixed + _upto(last, "attn.in") + (0 if n1_saved else bsh * e) + 3 * bsh * e + qk
            + cfg.context_length ** 2 + (4 if cfg.drop_rate > 0 else 3) * bas2 * e)


def _forward_head_points(cfg, spec, w, blocks: list[list[Term]], terms: list[Term]) -> dict[str, int]:
    """The forward's high points after the blocks (op timeline), above the persistent base: every block's
    saved tensors, GPTModel.forward's tok_embeds and pos_embeds (x, the embeddings' sum, is rebound to the
    blocks' output), and
      final norm: at `scale * norm_x + shift`: its input x (the blocks' output), the locals mean and var
                  (b*s each), norm_x, the product and the sum (b*s*h each; a saved one counts once);
      logits: the final norm's output and the logits (b*s*V)."""
    b, s, h, V = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.vocab_size
    e = w.e_r
    bsh = b * s * h
    blocks_saved = sum(t.bytes for blk in blocks for t in blk)
    head_terms = [t for t in terms if t.where == "head"]
    rg = any("x, x - mean" in t.name for t in head_terms)
    norm_x_saved = any("norm_x" in t.name for t in head_terms)
    head_input_saved = any(t.part == "head" for t in head_terms)
    norm_saved = sum(t.bytes for t in head_terms if t.part == "final_norm")
    fixed = blocks_saved + bsh * e + s * h * e
    return {
        "forward final norm": fixed + norm_saved + (0 if rg else bsh * e) + 2 * b * s * e
        + (0 if norm_x_saved else bsh * e) + 2 * bsh * e,
        "forward logits": fixed + sum(t.bytes for t in head_terms) + (0 if head_input_saved else bsh * e)
        + b * s * V * w.e_m,
    }


def _stashes(cfg, spec, w, blocks: list[list[Term]]) -> list[int]:
    """Each block's input kept by its checkpoint (torch.utils.checkpoint use_reentrant=False: the recompute
    closure holds the block's args while a saved-tensor holder of the block is alive; a block that saves
    nothing, frozen with an input that needs no grad, keeps none)."""
    bsh = spec.batch_size * spec.seq_len * cfg.emb_dim
    return [bsh * w.e_r if blk else 0 for blk in blocks]


def _checkpointed(cfg, spec, w, blocks: list[list[Term]], terms: list[Term], train):
    """GPTModel with gradient_checkpointing: `x = checkpoint(block, x, use_reentrant=False)` per block.
    The forward keeps only the blocks' stashed inputs; backward recomputes each block it reaches (saving
    the same set as without checkpointing: the recompute runs on the same inputs) and then runs its
    backward. Returns the saved terms, the backward's and the forward's high points (read off the op
    timeline)."""
    b, s, h = spec.batch_size, spec.seq_len, cfg.emb_dim
    e = w.e_r
    bsh, bsf = b * s * h, b * s * 4 * h
    stash = _stashes(cfg, spec, w, blocks)
    out = [Term("checkpointed block inputs (blocks that save)", "n*b*s*h*e", sum(stash), where="ckpt")]
    out += [t for t in terms if not t.per_layer]
    last = blocks[-1]
    lora = lambda blk, node: any(t.part == node and "lora_A output" in t.name for t in blk)
    # forward: GPTModel.forward's tok_embeds and pos_embeds, the stashes, the last block's input (its
    # loop variable x), the residual after attention and the feed-forward's input, and the GELU at
    # 0.044715 * pow(x, 3) (x, 0.5 * x, pow and the product, b*s*4h each; nothing is saved inside)
    alive = bsh * e + s * h * e + sum(stash[:-1]) + 3 * bsh * e
    forward = {"forward gelu": alive + 4 * bsf * e + 4,
               "forward attention": _forward_attention_point(cfg, spec, w, [[]], sum(stash[:-1]),
                                                             bsh * e + s * h * e + bsh * e)}
    if lora(last, "mlp.in"):
        # peft's forward on ff.layers.0: the base result, the scaled lora_B output and their fp32 sum, and
        # (bf16 base) the fp32 copy of the input
        forward["forward up adapter"] = alive + bsf * (e + 2 * ADAPTER_BYTES) + (
            bsh * ADAPTER_BYTES if e != ADAPTER_BYTES else 0)
    forward |= _forward_head_points(cfg, spec, w, [[Term("stashes", "", sum(stash))]], terms)
    grads_by_block, head = _block_grads(cfg, train)
    points = {}
    grads = head
    for i in range(cfg.n_layers - 1, -1, -1):
        blk = blocks[i]
        if not blk:
            continue
        # the block's input is its stash: norm1 saves that very tensor when it needs grad
        dup = bsh * e if any(t.part == "norm1" and "x, x - mean" in t.name for t in blk) else 0
        held = sum(stash[:i]) + stash[i] - dup
        made = grads + grads_by_block[i]["mlp.out"]
        if lora(blk, "mlp.out"):
            # the recompute (started by the first unpack of the block's saved tensors; early stop ends it at
            # the last one saved) at ff.layers.2's adapter, beside the block's input (stash), the block
            # output's grad and: without residual dropout, the grad scaled for lora_B (fp32) made before
            # lora_B's backward unpacks, and on a bf16 base AddBackward's grad cast back for the base
            # result (the recompute is at lora_A); with residual dropout,
            # the dropout's noise is the first unpack, and the recompute runs through the adapter to
            # `result + lora_B(...) * scaling` (lora_B's output and its scaled copy, fp32). Alive unsaved:
            # the feed-forward's input, the GELU's output, the fp32 copy of it on a bf16 base with
            # lora_dropout, and the base layer's result (measured on the op timeline)
            n2_saved = any(t.part == "mlp.in" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                           for t in blk)
            out_saved = any(t.part == "mlp.out" and ("input (weights train)" in t.name or "LoRA input x" in t.name)
                            for t in blk)
            tail = (2 * bsh * ADAPTER_BYTES if cfg.drop_rate > 0
                    else bsh * ADAPTER_BYTES + (bsh * e if e != ADAPTER_BYTES else 0))
            points[f"block {i} recompute down adapter"] = (
                held + _upto(blk, "mlp.out") + grads + bsh * e + tail + (0 if n2_saved else bsh * e)
                + (0 if out_saved else bsf * e) + bsh * e
                + (bsf * ADAPTER_BYTES if e != ADAPTER_BYTES and spec.lora_dropout > 0 else 0))
        # the recompute's attention (the forward's attention point on the block's own saved set), beside
        # what backward made before the block's first unpack started it: the block output's grad, and with
        # an adapter on ff.layers.2 and no residual dropout the grads made before lora_B's backward (as at
        # the down adapter point). Otherwise the first node unpacks at once: the residual dropout's noise,
        # or ff.layers.2's saved input or weight (a frozen weight is saved through the checkpoint's hooks too)
        pre = (bsh * ADAPTER_BYTES + (bsh * e if e != ADAPTER_BYTES else 0)
               if cfg.drop_rate == 0 and lora(blk, "mlp.out") else 0)
        points[f"block {i} recompute attention"] = _forward_attention_point(cfg, spec, w, [blk],
                                                                            held + grads + bsh * e + pre, 0)
        if any(t.part == "gelu" for t in blk):
            points[f"block {i} gelu backward"] = held + _upto(blk, "gelu") + made + bsh * e + 3 * bsf * e
            points[f"block {i} softmax backward"] = held + _attention_backward(blk, spec, cfg, w, grads_by_block[i],
                                                                               grads)
            if e != ADAPTER_BYTES and lora(blk, "mlp.out"):
                points[f"block {i} down adapter backward"] = (held + _upto(blk, "mlp.out") + made
                                                              + bsh * ADAPTER_BYTES + bsf * ADAPTER_BYTES)
        grads += grads_by_block[i]["mlp.out"] + grads_by_block[i]["rest"]
    return out, points, forward


def _attention_backward(blk: list[Term], spec, cfg, w, block_grads: dict[str, int], grads: int) -> int:
    """At the softmax's backward (op timeline), on top of what the blocks before keep: the block's saved set
    up to the softmax (the weights' and v's saved tensors are freed by the bmm's backward), the grads made
    (the later blocks', the head's, this block's but norm1's and q/k/v's), the residual stream's grad and
    v's grad (b*s*h each), the attention weights' grad and the softmax's input grad (b*a*s^2 each)."""
    b, s, h, a = spec.batch_size, spec.seq_len, cfg.emb_dim, cfg.n_heads
    e = w.e_r
    made = grads + block_grads["mlp.out"] + block_grads["rest"] - block_grads["before attention"]
    return _upto(blk, "softmax") + made + 2 * b * s * h * e + 2 * b * a * s * s * e


def _block_grads(cfg, train) -> tuple[list[dict[str, int]], int]:
    """Bytes of the grads each block's backward makes, by node (mlp.out: the second Linear's weight,
    bias or adapters; the rest), and the head's (out_head, final_norm)."""
    per = [{"mlp.out": 0, "rest": 0, "before attention": 0} for _ in range(cfg.n_layers)]
    head = 0
    for name, n, eb in train:
        if name.startswith("trf_blocks."):
            i = int(name.split(".")[1])
            per[i]["mlp.out" if ".ff.layers.2." in name else "rest"] += n * eb
            if any(f".{m}." in name for m in ("norm1", "W_query", "W_key", "W_value")):
                per[i]["before attention"] += n * eb  # made after the attention's backward
        else:
            head += n * eb
    return per, head


def _backward_points(cfg, spec, w, blocks: list[list[Term]], train) -> dict[str, int]:
    """The backward's high points in each block it reaches, above the persistent base (read off the op
    timeline): what the earlier blocks saved, what this block saved up to its GELU (the second Linear's
    saved tensors are freed by its backward), the grads made so far (the head's, the later blocks', this
    block's second Linear's), the residual stream's grad (b*s*h), and
      gelu: in the backward of 0.5 * x * (1 + tanh): the GELU output's grad and both factors' grads
            (b*s*4h each)."""
    b, s, h = spec.batch_size, spec.seq_len, cfg.emb_dim
    e = w.e_r
    bsh, bsf = b * s * h, b * s * 4 * h
    grads_by_block, head = _block_grads(cfg, train)
    points = {}
    grads = head
    for i in range(cfg.n_layers - 1, -1, -1):
        blk = blocks[i]
        if not any(t.part == "gelu" for t in blk):
            grads += grads_by_block[i]["mlp.out"] + grads_by_block[i]["rest"]
            continue
        earlier = sum(t.bytes for bl in blocks[:i] for t in bl)
        made = grads + grads_by_block[i]["mlp.out"]
        points[f"block {i} gelu backward"] = earlier + _upto(blk, "gelu") + made + bsh * e + 3 * bsf * e
        points[f"block {i} softmax backward"] = earlier + _attention_backward(blk, spec, cfg, w, grads_by_block[i], grads)
        if e != ADAPTER_BYTES and any(t.part == "mlp.out" and "lora_A output" in t.name for t in blk):
            # ff.layers.2's adapter backward on a bf16 base, at lora_A's input grad (fp32, b*s*4h; measured
            # on the op timeline): the block's saved set still whole, the grads made (lora_A's and lora_B's
            # included) and one b*s*h fp32 grad (the output grad's copy, ToCopyBackward)
            points[f"block {i} down adapter backward"] = (earlier + _upto(blk, "mlp.out") + made
                                                          + bsh * ADAPTER_BYTES + bsf * ADAPTER_BYTES)
        grads += grads_by_block[i]["mlp.out"] + grads_by_block[i]["rest"]
    return points
