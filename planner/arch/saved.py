"""A transformers decoder block's saved tensors as a function of what needs grad (no torch).

Autograd records an op only when one of its inputs requires grad, and saves of its inputs only what the
gradients it must compute need (torch's generated autograd code saves `self` of a matmul only when the
weight needs a grad). So the saved set follows from what needs grad, walked through the block in order
from the family's inventory (roles, not names):
  - nothing before the first tensor that needs grad is saved (a frozen prefix of blocks saves nothing);
  - a frozen Linear saves nothing of its input (only its weight, a parameter, for the input's grad);
  - RMSNorm saves its fp32 input and rsqrt when its input needs grad, and its normed x when its weight trains;
  - the activation, the gated product and SDPA save as in full training once their inputs need grad (on CUDA
    in fp32 SDPA with enable_gqa runs the math kernel, which saves eager attention's set: parts.sdpa_math);
  - a LoRA adapter (peft/tuners/lora/layer.py Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling,
    x cast to the adapter's dtype first) saves lora_A's input (x itself, its fp32 copy on a bf16 base, or
    the dropout's output when lora_dropout > 0, with the dropout's fp32 noise when x needs grad) and
    lora_B's input, the b*s*r output of lora_A, in the adapter dtype (fp32: peft's autocast_adapter_dtype).
The family (planner/arch/decoder.py RMSDecoder.saved) answers its own pieces through its ft_* hooks and its
MLP through saved_mlp (the gated MLP, Phi-3's fused one, a MoE's router and experts: planner/arch/moe.py).
Full training is one case of the walk: every tensor trains (trains None) and autocast's weight copies are left
to full training's cache term (RMSDecoder.block_terms); frozen layers and LoRA are other masks.
The walk gives two views: `terms`, per storage (what the device holds: an input two ops save counts once, a
parameter a matmul saves counts nothing), and `host`, per saved VARIABLE (what save_on_cpu's pack hook copies
under --offload-activations, planner/estimate/offload_act.py: one host copy per saved tensor, so an input q, k
and v each save is copied three times, a frozen Linear's weight (its t() view, or autocast's copy) is copied
when its input needs grad, a norm's fp32 input twice (pow, mul) and rsqrt's output twice; measured with a
saved_tensors_hooks inventory, tests/test_offload_finetune.py).
Measured against transformers' models with peft 0.21 on the CPU (tests/test_finetune.py, `bench finetune`;
full training: the accuracy and families grids, tests/test_recorded.py).
"""
from __future__ import annotations

from ..validation import ACTIVATION_SAVED
from . import parts
from .memo import config_key
from .terms import Term


def adapter_amp(label: str, b: int, s: int, n_in: int, n_out: int, spec, e_m: int, rg_in: bool,
                 where: str = "block", part: str = "") -> list[Term]:
    """One LoRA adapter's saved tensors under autocast (fp32 master weights; measured with saved_tensors_hooks,
    tests/test_finetune_amp_facts.py): peft casts x to the adapter's fp32 dtype and autocast casts it down
    again, so lora_A saves its own e_m copy of x (or of the dropout's output) and lora_B lora_A's output in
    e_m; lora_B's weight copy (for lora_A output's grad) and, when x needs grad, lora_A's weight copy and the
    dropout's fp32 noise."""
    r, p = spec.lora_r, spec.lora_dropout
    terms = []
    if p > 0 and rg_in:
        e_k = parts.dropout_mask_bytes(spec, 4)  # its fp32 noise; on CUDA native_dropout's bool mask
        terms.append(Term(f"{label} LoRA dropout " + ("noise (fp32)" if e_k == 4 else "mask (bool)"), "b*s*in*e_k",
                          b * s * n_in * e_k, True, where, part))
    terms.append(Term(f"{label} LoRA autocast copy of x", "b*s*in*e_m", b * s * n_in * e_m, True, where, part))
    terms.append(Term(f"{label} lora_A output", "b*s*r*e_m", b * s * r * e_m, True, where, part))
    terms.append(Term(f"{label} lora_B weight copy" + (", lora_A weight copy" if rg_in else "") + " (trains: autocast-cached)",
                      "(r*out + rg*in*r)*e_m", (r * n_out + (n_in * r if rg_in else 0)) * e_m, True, where, part))
    return terms


def lora_host(label: str, b: int, s: int, n_in: int, n_out: int, spec, rg_in: bool, where: str = "block",
              part: str = "") -> list[Term]:
    """One LoRA adapter's saved variables without autocast (the host copies under --offload-activations):
    peft's Linear.forward (peft/tuners/lora/layer.py) runs lora_B(lora_A(dropout(x))) in the adapter's fp32:
    the dropout's fp32 noise when x needs grad (CPU dropout is input * noise), lora_A's input (x, its fp32
    copy or the dropout's output) and, when x needs grad, lora_A's weight (its t() view), lora_B's input (lora_A's
    b*s*r output) and lora_B's weight (lora_A's output always needs grad)."""
    r, p, a = spec.lora_r, spec.lora_dropout, parts.ADAPTER_BYTES
    terms = []
    if p > 0 and rg_in:
        terms.append(Term(f"host: {label} LoRA dropout noise", "b*s*in*4", b * s * n_in * a, True, where, part))
    terms.append(Term(f"host: {label} lora_A input", "b*s*in*4", b * s * n_in * a, True, where, part))
    if rg_in:
        terms.append(Term(f"host: {label} lora_A weight", "r*in*4", r * n_in * a, True, where, part))
    terms.append(Term(f"host: {label} lora_A output and lora_B weight", "b*s*r*4 + r*out*4",
                      b * s * r * a + r * n_out * a, True, where, part))
    return terms


def host_eager_attention(sh, b: int, s: int, w, probs_rg: bool, q: bool, k: bool, v: bool) -> list[Term]:
    """eager_attention_forward's saved variables (eager_attention's, per variable): in fp32 the softmax output is
    saved by the softmax (for the scores' grad) and again by probs @ v (for v's grad): two copies."""
    unit = b * sh.a * s * sh.d * w.e_m
    ss = b * sh.a * s * s
    n = int(k) + int(q) + int(probs_rg)
    return [Term("host: eager attention q / k^T / v (as the grads need them)", "n*b*a*s*d*e_m", n * unit, True),
            Term("host: softmax output (fp32, for the scores' grad) and the probabilities (for v's grad)",
                 "4*b*a*s^2*[scores need grad] + e_m*b*a*s^2*[v needs grad]",
                 4 * ss * int(probs_rg) + ss * w.e_m * int(v), True)]


def eager_attention(sh, b: int, s: int, w, probs_rg: bool, q: bool, k: bool, v: bool,
                    kernel: str = "eager attention") -> list[Term]:
    """transformers' eager_attention_forward, by what needs grad (matmul saves each operand for the other's
    grad): q (for k's grad) and the repeated k^T (for q's); softmax(dtype=float32) its fp32 output when the
    scores need grad; probs @ v saves v when the probabilities need grad and the probabilities (fp32: the
    softmax output itself; below fp32 its cast) when v does. Its output copy is o_proj's input (saved
    there, if at all).
    kernel "SDPA math kernel" (CUDA, fp32 with enable_gqa: parts.sdpa_math): aten's
    _scaled_dot_product_attention_math (aten/src/ATen/native/transformers/attention.cpp) saves the same set in
    fp32: `query * sqrt(scale)` (a copy; the mul by a scalar saves nothing) for k's grad and
    `repeat_interleave(key).transpose(-2, -1) * sqrt(scale)` (a copy of the repeated k) for q's, _safe_softmax
    its fp32 output, matmul(attn, repeat_interleave(value)) the repeated v and the softmax output itself; its
    (b, a, s, d) output is copied by transformers' transpose(1, 2).contiguous() (sdpa_attention_forward), that
    copy being o_proj's input (measured on an H200, tests/data/cuda/2026-11-27-h200: explain.jsonl.gz's llama
    V97 h32 a4 kv2 b2 s256 fp32 row keeps the (2, 4, 256, 256) _safe_softmax output through the backward)."""
    unit = b * sh.a * s * sh.d * w.e_m
    ss = b * sh.a * s * s
    terms = []
    # (parts, for the forward's in-attention point: attn.scores saved before the softmax, attn.softmax its
    # output, attn.probs saved by the second matmul after it)
    n = int(k) + int(q)
    if n:
        terms.append(Term(f"{kernel} q / k^T (as the scores' grads need them)", "n*b*a*s*d*e_m", n * unit,
                          True, part="attn.scores"))
    if probs_rg:
        terms.append(Term(f"{kernel} v (for the probabilities' grad)", "b*a*s*d*e_m", unit, True,
                          part="attn.probs"))
    fp32_probs = probs_rg or (v and w.e_m == 4)
    if fp32_probs:
        terms.append(Term("softmax output (fp32)", "4*b*a*s^2", 4 * ss, True, part="attn.softmax"))
    if v and w.e_m < 4:
        terms.append(Term("softmax output cast (saved for v's grad)", "e_m*b*a*s^2", ss * w.e_m, True,
                          part="attn.probs"))
    return terms


_BLOCK_PARAMS: dict = {}


def block_params(family, cfg, i: int) -> list:
    """Block i's parameters (TensorSpecs, registration order), memoised per config as planner/accounting.py
    per_config memoises the inventory (the key is the config's repr, which lists every field): the app
    re-estimates on every slider move and a fit bisects, and the walk runs once per block."""
    key = (family.arch, config_key(cfg))
    blocks = _BLOCK_PARAMS.get(key)
    if blocks is None:
        if len(_BLOCK_PARAMS) > 4096:
            _BLOCK_PARAMS.clear()
        blocks = {}
        for t in family.inventory(cfg):
            if t.kind == "param" and t.block is not None:
                blocks.setdefault(t.block, []).append(t)
        _BLOCK_PARAMS[key] = blocks
    return blocks.get(i, [])


def block_signature(family, cfg, i: int, trains: set | None, adapted: dict) -> tuple:
    """All that block i's walk (walk_block) reads of i: its parameters (block_params: every field but the block,
    the names less the block's index, and whether each trains) and each Linear's LoRA adapter (adapted, less its
    module path and block). Two blocks with one signature walk alike (the same terms, host copies and needs-grad
    answers), given the same config, spec, widths and input: a fine-tuning estimate walks the distinct blocks only
    (llama-3-8b LoRA all-linear: 2 walks of 32, the first block's input needing no grad)."""
    mark = f".{i}."
    sig = []
    for t in block_params(family, cfg, i):
        module, leaf = t.name.rsplit(".", 1)
        lin = adapted.get(module)
        sig.append((t.name.replace(mark, ".#.", 1), module.rsplit(".", 1)[-1], leaf, t.shape, t.kind, t.persistent,
                    t.autocast, t.dtype, t.role, t.trainable, t.is_bias, t.conv1d, trains is None or t.name in trains,
                    None if lin is None else (lin.n_in, lin.n_out, lin.role, lin.bias)))
    return tuple(sig)


class BlockWalk:
    """One walk of block i in forward order: the terms saved so far, the inputs already saved (`shared`), and
    what trains. trains None: every tensor trains (full training). weights_cached: autocast's copies of the
    training weights are counted once outside the blocks (full training's cache term, planner/estimate/training.py
    autocast_weight_bytes), not as the saves of the matmuls that hold them."""

    def __init__(self, family, cfg, spec, w, i: int, trains: set | None, adapted: dict, weights_cached: bool = False,
                 quantized: bool = False):
        self.family, self.cfg, self.spec, self.w = family, cfg, spec, w
        self.sh = family.shape(cfg)
        self.b, self.s, self.h = spec.batch_size, spec.seq_len, self.sh.h
        self.e, self.em = w.e_r, w.e_m  # (under autocast the norms' outputs stay fp32, e_r; the matmuls' are e_m)
        self.inv = block_params(family, cfg, i)
        self.numel = {t.name: t.numel for t in self.inv}
        # the block's nn.Linear modules (their `.weight`; a MoE's 3-D expert tensors are not Linears) by role
        self.mods = {t.name.rsplit(".", 1)[0]: t.role for t in self.inv if not t.is_bias and t.name.endswith(".weight")}
        self.all_train = trains is None
        self._trains = trains or set()
        self.adapted = adapted
        self.weights_cached = weights_cached
        # QLoRA (the walk runs on the fp32 twin): bitsandbytes' MatMul4Bit keeps its packed weight on ctx, not
        # through save_for_backward, so a quantized block Linear's weight reaches no saved-tensor hook
        self.quantized = quantized
        self.terms: list[Term] = []
        self.host: list[Term] = []  # per saved variable: save_on_cpu's host copies (module doc)
        self.e_p = 2 if spec.precision == "bf16" else 4  # the parameters' dtype (a saved norm weight's width)
        self.shared: set = set()

    def trains(self, name: str) -> bool:
        return self.all_train or name in self._trains

    def role_trains(self, role: str) -> bool:
        return any(self.trains(t.name) for t in self.inv if t.role == role)

    def linear_group(self, role: str, x_rg: bool, n_in: int, key) -> dict[str, bool]:
        """The role's linears reading one input: base saves (their input once, if a weight trains) and
        adapters; returns output name -> needs grad."""
        b, s, e, em, w, spec = self.b, self.s, self.e, self.em, self.w, self.spec
        terms, shared = self.terms, self.shared
        out = {}
        where = "mlp" if role.startswith("mlp") else "block"
        part = role if role in ("attn.in", "attn.out", "mlp.out") else ""
        names = [m for m, r in self.mods.items() if r == role]
        if w.amp:
            # autocast (tests/test_finetune_amp_facts.py): each Linear casts its input itself (no cache for a
            # non-leaf) and saves that e_m copy when its weight trains; when its input needs grad it saves its
            # weight's e_m copy (a frozen weight is not cached: a fresh copy per use, held by the graph)
            for m in names:
                lin = self.adapted.get(m)
                short = m.rsplit(".", 1)[1]
                trains = self.trains(f"{m}.weight")
                if trains:  # (one host copy per Linear that saves it, the o_proj input SDPA saved too)
                    self.host.append(Term(f"host: {short} input autocast copy (weight trains)", "b*s*in*e_m",
                                          b * s * n_in * em, True, where, part))
                if x_rg:
                    self.host.append(Term(f"host: {short} weight autocast copy (input needs grad)", "out*in*e_m",
                                          self.numel[f"{m}.weight"] * em, True, where, part))
                if trains and key not in shared:
                    # (an input saved already in e_m, SDPA's output for o_proj, is not copied: the cast of
                    # an e_m tensor to e_m is the tensor itself; measured: llama V97 h32 s256 last:1 bf16-amp)
                    terms.append(Term(f"{short} input autocast copy (weight trains)", "b*s*in*e_m",
                                      b * s * n_in * em, True, where, part))
                if x_rg and not (trains and self.weights_cached):
                    cached = " (trains: autocast-cached)" if trains else ""
                    terms.append(Term(f"{short} weight autocast copy (input needs grad){cached}", "out*in*e_m",
                                      self.numel[f"{m}.weight"] * em, True, where, part))
                if lin:
                    amp = adapter_amp(short, b, s, n_in, lin.n_out, spec, em, x_rg, where, part)
                    terms.extend(amp)
                    self.host.extend(Term("host: " + t.name, t.formula, t.bytes, True, where, part) for t in amp)
                out[short] = x_rg or bool(lin) or trains
            return out
        if any(self.trains(f"{m}.weight") for m in names) and key not in shared:
            terms.append(Term(f"block {role} input (weights train)", "b*s*in*e_m", b * s * n_in * e, True, where, part))
            shared.add(key)
        for m in names:
            short = m.rsplit(".", 1)[1]
            if self.trains(f"{m}.weight"):  # (each Linear saves its input: one host copy each)
                self.host.append(Term(f"host: {short} input (weight trains)", "b*s*in*e_r", b * s * n_in * e, True,
                                      where, part))
            if x_rg and not self.quantized:  # the weight's t() view, saved for the input's grad
                self.host.append(Term(f"host: {short} weight (input needs grad)", "out*in*e_r",
                                      self.numel[f"{m}.weight"] * e, True, where, part))
            lora = m in self.adapted
            if lora:
                self.host += lora_host(short, b, s, n_in, self.adapted[m].n_out, spec, x_rg, where, part)
                terms.extend(parts.lora_adapter(short, b, s, n_in, spec, e, x_rg, shared, key, where, part))
            out[short] = x_rg or lora or self.trains(f"{m}.weight")
        return out

    def gated_mlp(self, gate: bool, up: bool, f: int, fused: bool = False) -> bool:
        """down(act(gate(x)) * up(x)) after its input projections (whether gate's and up's outputs need grad),
        f wide: the activation saves its input(s) (ACTIVATION_SAVED) when gate needs grad, the product each
        operand for the other's grad; returns whether the product (down's input) needs grad. Fused (Phi-3's
        gate_up_proj): gate and up are halves of one b*s*2f output, saved whole by the activation (gate) and
        the product (up); the activation's tensors beyond its input come on top."""
        b, s, em, act = self.b, self.s, self.em, self.sh.act
        bsf = b * s * f
        n_act = ACTIVATION_SAVED[act]
        if fused:
            if gate:  # (gate and up are one tensor: both need grad or neither)
                extra = max(n_act - 1, 0)
                self.terms += [
                    Term("gate_up output (gate and up halves: the activation's input, the product's operand)",
                         "2*b*s*f*e_m", 2 * bsf * em, True, "mlp", "mlp.up_out"),
                    Term(f"{act} output (the product's grad for up)"
                         + (f", {extra} more {act} tensors" if extra else ""),
                         f"{1 + extra}*b*s*f*e_m", (1 + extra) * bsf * em, True, "mlp", "mlp.act_out")]
                # per saved variable: the activation's input (the gate half, a view), its output and the up half
                # (the product's operands), b*s*f each, and the activation's tensors beyond its input
                self.host.append(Term("host: fused gate/up: the activation's input and output, the up half",
                                      f"{3 + extra}*b*s*f*e_m", (3 + extra) * bsf * em, True, "mlp"))
            return gate
        n0 = len(self.terms)  # (each below is its own storage and saved variable: the host copies are the same)
        if gate:
            self.terms.append(Term(f"{act} saved input(s)", "n_act*b*s*f*e", n_act * bsf * em, True, "mlp"))
        if up:
            self.terms.append(Term(f"{act} output (the product's grad for up)", "b*s*f*e", bsf * em, True, "mlp",
                                   "mlp.act_out"))
        if gate:
            self.terms.append(Term("up_proj output (the product's grad for the activation)", "b*s*f*e", bsf * em, True,
                                   "mlp", "mlp.up_out"))
        self.host += [Term("host: " + t.name, t.formula, t.bytes, True, "mlp", t.part) for t in self.terms[n0:]]
        return gate or up


def block_saved(family, cfg, spec, w, i: int, g: bool, trains: set | None, adapted: dict,
                weights_cached: bool = False) -> tuple[list[Term], bool, bool]:
    """Block i's saved tensors (no checkpointing), given whether its input needs grad; returns them, whether
    its output needs grad, and whether RoPE's cos/sin are saved in it. trains None: every tensor trains;
    weights_cached: BlockWalk's."""
    wk, g, rope = walk_block(family, cfg, spec, w, i, g, trains, adapted, weights_cached)
    return wk.terms, g, rope


def block_host(family, cfg, spec, w, i: int, g: bool, trains: set | None, adapted: dict,
               quantized: bool = False) -> tuple[list[Term], bool]:
    """Block i's saved variables (the walk's host view: what save_on_cpu copies), and whether its output needs
    grad; quantized: BlockWalk's."""
    wk, g, _ = walk_block(family, cfg, spec, w, i, g, trains, adapted, quantized=quantized)
    return wk.host, g


def walk_block(family, cfg, spec, w, i: int, g: bool, trains: set | None, adapted: dict,
               weights_cached: bool = False, quantized: bool = False) -> tuple[BlockWalk, bool, bool]:
    """The walk of block i: both views (terms, host), whether its output needs grad and whether RoPE's cos/sin
    are saved in it."""
    wk = BlockWalk(family, cfg, spec, w, i, trains, adapted, weights_cached, quantized)
    sh, b, s, h, e, em, ep = wk.sh, wk.b, wk.s, wk.h, wk.e, wk.em, wk.e_p
    wk.terms += family.ft_norm("input norm", b, s, h, e, g, wk.role_trains("norm.attn"), part="norm.attn")
    wk.host += family.host_norm("input norm", b, s, h, e, ep, g, wk.role_trains("norm.attn"))
    n1 = g or wk.role_trains("norm.attn")
    outs = wk.linear_group("attn.in", n1, h, "n1")
    if family.fused_qkv:  # (Phi-3: q, k and v are views of one qkv_proj output)
        q = k = v = outs.get("qkv_proj", False)
    else:
        q, k, v = (outs.get(n, False) for n in ("q_proj", "k_proj", "v_proj"))
    wk.host += family.host_qk_norm(sh, b, s, w, ep, q, k, wk.role_trains("norm.other"))
    qk_terms, q, k = family.ft_qk_norm(sh, b, s, em, q, k, wk.role_trains("norm.other"))  # Qwen 3's q/k norms
    wk.terms += qk_terms
    rope = q or k
    # RoPE: q * cos, rotate_half(q) * sin (and k's) save cos and sin ((1, 1, s, d), e_r) for q's (k's) grad
    n_rope = 2 * (int(q) + int(k))
    if n_rope:
        wk.host.append(Term(f"host: RoPE cos and sin, saved by {n_rope} muls", "n*s*d*e_r",
                            n_rope * s * family.rope_dim(cfg) * e, True))
    attn_rg = q or k or v
    masked = family.masked(cfg, spec)
    if attn_rg and parts.sdpa_math(sh, masked, spec, w):
        # CUDA's math kernel (fp32, enable_gqa): eager attention's saves (eager_attention's docstring); o_proj
        # saves its own input, transformers' contiguous copy of the kernel's output
        wk.terms += eager_attention(sh, b, s, w, q or k, q, k, v, kernel="SDPA math kernel")
        wk.host += host_eager_attention(sh, b, s, w, q or k, q, k, v)
    elif attn_rg and sh.attention == "sdpa":
        # SDPA's CPU kernel saves q, k, v, its output and logsumexp whichever input needs grad (measured)
        wk.terms += parts.attention(sh, b, s, w, masked=masked, spec=spec)
        wk.terms += family.mask_terms(cfg, spec, w)
        wk.host += family.offload_attention(cfg, spec, w)  # (full training's copies: the same saves)
        # (CUDA's memory-efficient kernel allocates its output (b, s, a, d) whatever q's layout,
        # _efficient_attention_forward's res = empty({B, M, num_heads, Kv}): the transpose back is a view in
        # every family; measured on an H200, tests/data/cuda/2026-11-27-h200: Phi-3 V97 h32 a4 kv2 b2 s256 and
        # V2000 h48 a6 kv6 b2 s48 fp32 hold Mistral's bytes exactly, b*s*a*d*4 a layer below the CPU's)
        if family.sdpa_output_is_o_input or parts.sdpa_efficient(sh, masked, spec, w):
            wk.shared.add("attn_out")  # o_proj's input is SDPA's saved output (the transpose back is a view)
    elif attn_rg:
        wk.terms += eager_attention(sh, b, s, w, q or k, q, k, v)
        extra = family.ft_attention_extra(cfg, sh, b, s, em, q, k)  # (Gemma 2's soft-capped scores)
        wk.terms += extra
        wk.host += host_eager_attention(sh, b, s, w, q or k, q, k, v)
        wk.host += [Term("host: " + t.name, t.formula, t.bytes, True) for t in extra]
    o = wk.linear_group("attn.out", attn_rg, sh.a * sh.d, "attn_out")
    o_rg, post_trains = any(o.values()), wk.role_trains("norm.other")
    post, post_rg = family.ft_post_norm("post-attention norm (attention output)", b, s, h, e, o_rg, post_trains,
                                        "norm.post_attn")  # (Gemma 2's sandwich norms)
    wk.terms += post
    if post:
        wk.host += family.host_norm("post-attention norm (attention output)", b, s, h, e, ep, o_rg, post_trains)
    g = post_rg or g
    wk.terms += family.ft_norm("post-attention norm", b, s, h, e, g, wk.role_trains("norm.mlp"), part="norm.mlp")
    wk.host += family.host_norm("post-attention norm", b, s, h, e, ep, g, wk.role_trains("norm.mlp"))
    n2 = g or wk.role_trains("norm.mlp")
    mlp_rg = family.saved_mlp(wk, n2)  # the family's MLP (dense gated, or a MoE's router and experts)
    post, post_rg = family.ft_post_norm("post-feedforward norm (MLP output)", b, s, h, e, mlp_rg,
                                        post_trains, "norm.post_mlp", "mlp")  # the MLP's saves
    wk.terms += post
    if post:
        wk.host += family.host_norm("post-feedforward norm (MLP output)", b, s, h, e, ep, mlp_rg, post_trains)
    g = post_rg or g
    return wk, g, rope
