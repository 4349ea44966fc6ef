"""The compute model beside the memory model (issue #35; no torch): FLOPs per step, the bytes memory-bound work moves
across HBM and PCIe, and a roofline step time over a GPU's published peaks (planner/gpus.py).

FLOPs are what torch.utils.flop_counter.FlopCounterMode counts on the real step: every matmul (aten.mm, addmm, bmm:
2*m*k*n; a bias add and every pointwise op count nothing), the fused attention kernels at the full s x s (torch's
sdpa_flop_count: QK^T and PV, 4*b*a*s*s*d forward; its backward formula 10*b*a*s*s*d, the scores recomputed; the
causal half is not skipped), eager attention as its two bmm and their grads, the recompute, the loss head.
Two kernels torch 2.13's registry has no formula for are counted as the same maths would be on CUDA: the CPU's
_scaled_dot_product_flash_attention_for_cpu (and its backward) as torch's SDPA formulas, and MoE's _grouped_mm as
2 * rows * k * n over its groups (planner/measure/flops.py maps them when the real step is counted).

The step is walked from the family's own description: the inventory's linears by block and role (planner/accounting.py
tensor_inventory, planner/finetune.py linears), the attention's heads and head width, and a family's own matmuls
beside them (Family.compute_block_ops: MoE's routed experts). A linear's backward computes its weight grad when the
weight trains and its input grad only when its input needs grad: a frozen prefix (LoRA without checkpointing, frozen
layers) computes neither until the first trainable op; enable_input_require_grads (transformers' checkpointing
enable, with fine-tuning) makes every block's input need grad. Autograd computes only the grads an op's inputs need
(derivatives.yaml's grad_input_mask), and an op whose inputs need none has no backward at all.

Recompute (planner/checkpointing.py): full and every:K replay each checkpointed block's forward, but non-reentrant
checkpoint stops once the block's last saved tensor is recovered (torch/utils/checkpoint.py _StopRecomputationError,
raised in the pack hook, before the op that saves it runs): a block whose last matmul saves the block's last tensors
(a decoder's down projection, followed by the residual add, which saves nothing) does not replay that matmul
(Family.recompute_replays_last). Selective replays the ops torchtitan's policy does not keep (planner/estimate/
finetune.py policy_ops, planner/checkpointing.py saved_ops), with the same stop.

The memory-bound parts (bytes over HBM bandwidth): the optimizer's update (every trainable element's parameter,
grad and states read, parameter and states written), the autocast weight copies (read fp32, write the low-precision
copy, each forward and recompute), grad accumulation (read + write each grad per later micro-batch), QLoRA's
dequantization (each quantized weight read packed and written in bf16, per forward, recompute and input grad), and
inference decode's weight and KV reads; PCIe bytes: --offload-activations (every saved byte to the host and back)
and --offload-optimizer (grads down, parameters up). Step time: per part max(FLOPs / (peak x MATMUL_EFFICIENCY),
bytes / (bandwidth x MEMORY_EFFICIENCY)), summed: a roofline, never a measurement.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..accounting import per_config, tensor_inventory
from ..arch.memo import config_key
from ..arch.terms import MatOp  # a block's matmul (the family files list theirs: compute_block_ops)
from ..arch import family_of
from ..finetune import adapted_linears, linears, trainable_names

# The share of the dense peak a training step's matmuls reach: llm-analysis's default flops_efficiency for training,
# 0.5 (cli99/llm-analysis, llm_analysis/analysis.py; the research note shared/research/plan-search-anchors.md). The
# H200 records beside the roofline in docs/plan.md are the first calibration of it.
MATMUL_EFFICIENCY = 0.5
# The share of HBM / PCIe bandwidth a streaming kernel or copy reaches: llm-analysis's default hbm_memory_efficiency,
# 0.9 (the same file); used for the PCIe link too.
MEMORY_EFFICIENCY = 0.9
ROOFLINE_LABEL = ("roofline (FLOPs over the dense peak x {:.0%}, bytes over bandwidth x {:.0%}, per part, summed; "
                  "not a measurement)").format(MATMUL_EFFICIENCY, MEMORY_EFFICIENCY)




def _lin_ops(cfg, block_lins, n: int, r_of: dict) -> list[MatOp]:
    family = family_of(cfg)
    out = []
    for lin in block_lins:
        out.append(MatOp(lin.module, lin.role, n, lin.n_in, lin.n_out, (lin.module + ".weight",),
                         family.attention_input(lin.short) if lin.role == "attn.in" else "", r_of.get(lin.module, 0)))
    return out


class _Walk:
    """One micro-batch's forward / backward / recompute FLOPs, block by block."""

    def __init__(self, cfg, spec):
        self.cfg, self.spec = cfg, spec
        self.family = family = family_of(cfg)
        self.inv = tensor_inventory(cfg)
        keep = trainable_names(family, cfg, spec)
        self.trains = (lambda name: True) if keep is None else (lambda name: name in keep)
        self.adapted = {lin.module for lin in adapted_linears(family, cfg, spec)}
        self.n = spec.batch_size * spec.seq_len
        self.lins = linears(self.inv)

    def role_trains(self, block, role) -> bool:
        return any(self.trains(t.name) for t in self.inv if t.kind == "param" and t.block == block and t.role == role)


def _linear_backward(op: MatOp, in_rg: bool, trains: bool) -> tuple[int, bool]:
    """(backward FLOPs, output needs grad) of a linear and its LoRA adapters."""
    f = op.flops
    bwd = (f if in_rg else 0) + (f if trains else 0)
    out_rg = in_rg or trains
    if op.adapter_rank:
        r = op.adapter_rank
        fa, fb = 2 * op.rows * op.n_in * r, 2 * op.rows * r * op.n_out
        bwd += 2 * fb + fa + (fa if in_rg else 0)  # lora_B: weight + input grad; lora_A: weight (+ input) grad
        out_rg = True
    return bwd, out_rg


def _adapter_forward(op: MatOp) -> int:
    r = op.adapter_rank
    return 2 * op.rows * r * (op.n_in + op.n_out) if r else 0


def train_flops(cfg, spec) -> dict:
    """FLOPs of one optimizer step of `spec` (every micro-batch), by part: forward, backward, recompute, loss (the
    output head's matmuls, forward and backward, and a fused loss's recompute), and their total `flops_per_step`.

    Every term is b*s*X (a matmul over the tokens) or b*s*s*Y (the attention's s x s matmuls), times the
    micro-batches: so the walk runs once per model and technique, at b = 1 and s = 1, 2, and each part is
    b*(X*s + Y*s^2)*accum from the two (exact; memoised: the plan search prices thousands of batch x sequence x
    accumulation points). A config with a sliding window walks each spec (whether a mask exists, and so SDPA's
    kernel, depends on the sequence)."""
    import dataclasses

    if getattr(cfg, "sliding_window", None) is not None:
        return _train_flops(cfg, spec)
    unit = dataclasses.replace(spec, batch_size=1, seq_len=1, grad_accum=1, optimizer="adamw", optimizer_impl="default",
                               offload_optimizer=False, offload_activations=False)
    one, two = _train_flops(cfg, unit), _train_flops(cfg, dataclasses.replace(unit, seq_len=2))
    b, s, k = spec.batch_size, spec.seq_len, spec.grad_accum
    out = {}
    for part in ("forward", "backward", "recompute", "loss"):
        y2 = two[part] - 2 * one[part]  # 2*Y (F(2) = 2X + 4Y, F(1) = X + Y)
        x = one[part] - y2 // 2
        out[part] = k * b * (x * s + (y2 // 2) * s * s)
    out["flops_per_step"] = sum(out.values())
    return out


@per_config
def _train_flops(cfg, spec) -> dict:
    family = family_of(cfg)
    w = _Walk(cfg, spec)
    n, r = w.n, spec.lora_r
    r_of = {m: r for m in w.adapted}
    embed_rg = any(w.trains(t.name) for t in w.inv if t.kind == "param" and t.role in ("embed", "pos_embed"))
    # enable_input_require_grads: transformers' activation_checkpointing_enable (and peft after it) with fine-tuning
    stream_rg = embed_rg or (spec.finetuning and spec.checkpointing and family.input_grads_with_checkpointing)
    a, d = family.attention_dims(cfg)
    unit = 2 * spec.batch_size * a * spec.seq_len * spec.seq_len * d  # one s x s matmul of the attention
    fused = family.attention_fused(cfg, spec)
    forward = backward = 0
    block_fwd: list[int] = []
    last_op: list[int] = []
    blocks = sorted({lin.block for lin in w.lins if lin.block is not None})
    for i in blocks:
        ops = _lin_ops(cfg, [lin for lin in w.lins if lin.block == i], n, r_of) + family.compute_block_ops(cfg, spec, i)
        fwd = sum(op.flops + _adapter_forward(op) for op in ops) + 2 * unit
        bwd = 0
        rg = {}
        # attention's inputs
        in_rg = stream_rg or w.role_trains(i, "norm.attn")
        for op in (o for o in ops if o.stage == "attn.in"):
            b, rg[op.label] = _linear_backward(op, in_rg, any(w.trains(p) for p in op.params))
            bwd += b
        q = any(rg[o.label] for o in ops if o.stage == "attn.in" and o.qkv in ("q", "qkv")) or w.role_trains(i, "norm.other")
        k = any(rg[o.label] for o in ops if o.stage == "attn.in" and o.qkv in ("k", "qkv")) or w.role_trains(i, "norm.other")
        v = any(rg[o.label] for o in ops if o.stage == "attn.in" and o.qkv in ("v", "qkv"))
        if fused:
            bwd += 5 * unit if (q or k or v) else 0
        else:  # scores = q k^T, out = probs v: each grad only for an input that needs it
            bwd += unit * (q + k + (q or k) + v)
        att_rg = q or k or v
        for op in (o for o in ops if o.stage == "attn.out"):
            b, out = _linear_backward(op, att_rg, any(w.trains(p) for p in op.params))
            bwd += b
            stream_rg = stream_rg or out
        in_rg = stream_rg or w.role_trains(i, "norm.mlp")
        mid_rg = False
        for op in (o for o in ops if o.stage == "mlp.in"):
            b, out = _linear_backward(op, in_rg, any(w.trains(p) for p in op.params))
            bwd += b
            mid_rg = mid_rg or out
        for op in (o for o in ops if o.stage == "mlp.out"):
            b, out = _linear_backward(op, mid_rg, any(w.trains(p) for p in op.params))
            bwd += b
            stream_rg = stream_rg or out
        stream_rg = stream_rg or mid_rg
        forward += fwd
        backward += bwd
        block_fwd.append(fwd)
        outs = [o for o in ops if o.stage == "mlp.out"]
        tail = outs[-1] if outs else None
        last_op.append(0 if tail is None else (2 * tail.rows * tail.adapter_rank * tail.n_out if tail.adapter_rank
                                               else tail.flops))
    recompute = _recompute(cfg, spec, block_fwd, last_op) if spec.checkpointing else 0
    head, head_extra = _head(cfg, spec, w, stream_rg)
    accum = spec.grad_accum
    parts = {"forward": accum * forward, "backward": accum * backward, "recompute": accum * recompute,
             "loss": accum * (head + head_extra)}
    parts["flops_per_step"] = sum(parts.values())
    return parts


def _recompute(cfg, spec, block_fwd: list[int], last_op: list[int]) -> int:
    from ..checkpointing import checkpointed_blocks, policy_of, saved_ops

    family = family_of(cfg)
    policy = policy_of(spec)
    skip_last = not family.recompute_replays_last(cfg)
    if policy != "selective":
        idx = checkpointed_blocks(policy, len(block_fwd))
        return sum(block_fwd[i] - (last_op[i] if skip_last else 0) for i in idx)
    from ..arch.terms import Widths
    from .finetune import policy_ops

    ops = policy_ops(cfg, spec, Widths.of(spec))
    kept = {id(op) for op in saved_ops(ops)}
    per_block = sum(f for op in ops if id(op) not in kept for f in (op[3],))
    if skip_last and ops and id(ops[-1]) not in kept:
        per_block -= ops[-1][3]
    return len(block_fwd) * per_block


def _head(cfg, spec, w: _Walk, in_rg: bool) -> tuple[int, int]:
    """The output head: (its forward and backward matmuls, a fused loss's recompute of the logits)."""
    from ..losses import is_fused
    from ..arch.base import resolved_loss

    h, V, n = cfg.hidden, cfg.vocab_size, w.n
    heads = [lin for lin in w.lins if lin.role == "head"]
    if heads:
        head_trains = w.trains(heads[0].module + ".weight")
    else:  # a tied head is the embedding's weight
        head_trains = any(w.trains(t.name) for t in w.inv if t.kind == "param" and t.role == "embed")
    in_rg = in_rg or w.role_trains(None, "norm.final")
    f = 2 * n * h * V
    total = f + (f if in_rg else 0) + (f if head_trains else 0)
    loss = resolved_loss(w.family, spec)
    # chunked-ce: each chunk's logits recomputed in its checkpoint's backward; cce: each block's logits recomputed
    # in the backward (planner/models/losses.py), when any grad is needed
    extra = f if is_fused(loss) and (in_rg or head_trains) else 0
    return total, extra


# ---------------------------------------------------------------- bytes: HBM and PCIe

_STATE_BYTES = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2, "adamw-8bit": 2, "paged-adamw-8bit": 2,
                "paged-adamw": 2}  # states per trainable element (torch.optim / bitsandbytes)


@per_config
def train_bytes(cfg, spec) -> dict:
    """Bytes memory-bound work moves per optimizer step: HBM (optimizer update, autocast casts, accumulation,
    QLoRA dequantization) and PCIe (offloads). Element widths from the run's dtypes."""
    from ..finetune import quantized_linears

    family = family_of(cfg)
    inv = tensor_inventory(cfg)
    keep = trainable_names(family, cfg, spec)
    e_p = 2 if spec.precision == "bf16" else 4
    n_train = sum(t.numel for t in inv if t.kind == "param" and (keep is None or t.name in keep))
    n_train += sum(spec.lora_r * (lin.n_in + lin.n_out) for lin in adapted_linears(family, cfg, spec))
    e_adapter = 4 if spec.lora_r else e_p  # peft keeps the adapters fp32 (autocast_adapter_dtype)
    e_t = e_adapter if spec.lora_r else e_p
    states = _STATE_BYTES[spec.optimizer]
    e_s = 1 if "8bit" in spec.optimizer else e_t
    # the update: read parameter, grad and states, write parameter and states (on the host with --offload-optimizer:
    # no HBM traffic; the host's own update is not priced)
    optimizer = 0 if spec.offload_optimizer else n_train * (3 * e_t + 2 * states * e_s)
    accumulate = n_train * 2 * e_t * (spec.grad_accum - 1)
    passes = spec.grad_accum * (1 + (1 if spec.checkpointing else 0))  # forwards, recomputes
    casts = 0
    if spec.autocast_dtype is not None:  # autocast's weight copies: read fp32, write 2-byte, per forward
        n_lin = sum(lin.n_in * lin.n_out for lin in linears(inv))
        casts = passes * n_lin * (4 + 2)
    dequant = 0
    if spec.quantize_base != "none":  # read the packed weight (+ absmax), write bf16: forward, recompute, input grad
        packed = {"nf4": 0.5, "fp4": 0.5, "int8": 1.0}[spec.quantize_base]
        n_q = sum(lin.n_in * lin.n_out for lin in quantized_linears(cfg))
        dequant = int((passes + spec.grad_accum) * n_q * (packed + 2))
    pcie = 0
    if spec.offload_optimizer:  # grads to the host, updated parameters back
        pcie += 2 * n_train * e_t
    if spec.offload_activations:
        from .training import estimate_training

        rec = estimate_training(cfg, spec).to_dict()
        pcie += 2 * int(rec.get("transients", {}).get("host_activation_offload", 0))
    return {"optimizer": optimizer, "accumulate": accumulate, "autocast_casts": casts, "dequantize": dequant,
            "hbm_bytes": optimizer + accumulate + casts + dequant, "pcie_bytes": pcie}


# ---------------------------------------------------------------- inference

def infer_flops(cfg, ispec) -> dict:
    """FLOPs of generate(): the prefill (b x p tokens through every linear, attention at p x p, the head on the
    last position: generate's logits_to_keep) and n - 1 decode steps (b tokens each, attention over the cache: the
    last token never enters the model). A family without a KV cache (Family.infer_kv_cache False: the book's
    generate_text_simple) runs n forwards over the whole sequence so far, every position's logits included."""
    family = family_of(cfg)
    inv = tensor_inventory(cfg)
    b, p, new = ispec.batch_size, ispec.prompt_len, ispec.new_tokens
    per_token = sum(2 * lin.n_in * lin.n_out for lin in linears(inv) if lin.role != "head")
    per_token += sum(op.flops for i in range(cfg.layers) for op in family.compute_block_ops(cfg, _RowsSpec(1), i))
    a, d = family.attention_dims(cfg)
    head = 2 * cfg.hidden * cfg.vocab_size
    if not family.infer_kv_cache:
        lengths = [p + j for j in range(new)]
        total = sum(b * L * (per_token + head) + cfg.layers * 4 * b * a * L * L * d for L in lengths)
        return {"prefill": 0, "decode": total, "flops_per_step": total}
    prefill = b * p * per_token + cfg.layers * 4 * b * a * p * p * d + b * head
    steps = max(new - 1, 0)
    cache = sum(p + j for j in range(1, steps + 1))
    decode = steps * b * (per_token + head) + cfg.layers * 4 * b * a * d * cache
    return {"prefill": prefill, "decode": decode, "flops_per_step": prefill + decode}


@dataclass(frozen=True)
class _RowsSpec:
    """A stand-in TrainSpec for compute_block_ops at `rows` tokens (batch rows, sequence 1)."""
    batch_size: int
    seq_len: int = 1


def infer_bytes(cfg, ispec) -> dict:
    """Decode's HBM reads: every weight once a step, and the KV cache read so far (b sequences)."""
    from ..accounting import param_count

    from ..finetune import quantized_linears

    e_w = {"float32": 4, "bfloat16": 2, "float16": 2}.get(ispec.param_dtype, 2)
    weights = param_count(cfg) * e_w
    q = getattr(ispec, "quantize_weights", "none")
    if q != "none":  # bitsandbytes' packed linears: 4 bits (nf4 / fp4) or 1 byte (int8) an element
        n_q = sum(lin.n_in * lin.n_out for lin in quantized_linears(cfg))
        weights -= int(n_q * (e_w - (1.0 if q == "int8" else 0.5)))
    family = family_of(cfg)
    steps = max(ispec.new_tokens - 1, 0)
    kv_tok = family.kv_bytes_per_token(cfg, e_w)
    kv = ispec.batch_size * kv_tok * sum(ispec.prompt_len + j for j in range(1, steps + 1))
    return {"decode_weights": steps * weights, "decode_kv": kv, "prefill_weights": weights,
            "hbm_bytes": (steps + 1) * weights + kv}


# ---------------------------------------------------------------- roofline

def _matmul_dtype(spec) -> str:
    if spec.precision == "bf16" or spec.precision == "bf16-amp":
        return "bfloat16"
    return "float16" if spec.precision == "fp16-amp" else "float32"


def _part_time(flops: float, peak: float, hbm: float, g, pcie: float = 0.0) -> float:
    t_c = flops / (peak * MATMUL_EFFICIENCY) if flops else 0.0
    t_m = hbm / (g.hbm_bytes_per_s * MEMORY_EFFICIENCY) if hbm else 0.0
    t_p = pcie / (g.pcie_bytes_per_s * MEMORY_EFFICIENCY) if pcie else 0.0
    return max(t_c, t_m, t_p)


_PRICE_CACHE: dict = {}


def price(cfg, spec, gpu, world: int = 1) -> dict:
    """The step's compute price on `gpu` (a planner.gpus.GPU or its name) for the plan search: {"flops_per_step",
    "step_time_s", "tokens_per_s", "parts": {name: {"flops", "hbm_bytes", "pcie_bytes", "time_s"}}, "basis"}.
    world: data-parallel ranks, each running `spec` (tokens_per_s counts all ranks; collectives not priced yet).
    Memoised per (config, spec, gpu, world)."""
    from ..gpus import gpu as lookup, peak_flops

    g = lookup(gpu) if isinstance(gpu, str) else gpu
    key = (config_key(cfg), spec, g.name, world)
    hit = _PRICE_CACHE.get(key)
    if hit is not None:
        return hit
    fl = train_flops(cfg, spec)
    by = train_bytes(cfg, spec)
    peak = peak_flops(g, _matmul_dtype(spec))
    parts = {
        "forward": (fl["forward"], 0, 0),
        "backward": (fl["backward"], 0, 0),
        "recompute": (fl["recompute"], 0, 0),
        "loss": (fl["loss"], 0, 0),
        "autocast_casts": (0, by["autocast_casts"], 0),
        "dequantize": (0, by["dequantize"], 0),
        "optimizer": (0, by["optimizer"] + by["accumulate"], 0),
        "offload": (0, 0, by["pcie_bytes"]),
    }
    out_parts = {name: {"flops": f, "hbm_bytes": int(hb), "pcie_bytes": int(pb), "time_s": _part_time(f, peak, hb, g, pb)}
                 for name, (f, hb, pb) in parts.items()}
    step = sum(p["time_s"] for p in out_parts.values())
    tokens = spec.batch_size * spec.seq_len * spec.grad_accum * world
    out = {"flops_per_step": fl["flops_per_step"], "step_time_s": step, "tokens_per_s": tokens / step if step else 0.0,
           "parts": out_parts, "basis": ROOFLINE_LABEL, "gpu": g.name}
    if len(_PRICE_CACHE) > 65536:
        _PRICE_CACHE.clear()
    _PRICE_CACHE[key] = out
    return out


def price_infer(cfg, ispec, gpu) -> dict:
    """Inference's roofline: the prefill compute-bound, each decode step max(its FLOPs, its weight and KV reads)."""
    from ..gpus import gpu as lookup, peak_flops

    g = lookup(gpu) if isinstance(gpu, str) else gpu
    fl = infer_flops(cfg, ispec)
    by = infer_bytes(cfg, ispec)
    peak = peak_flops(g, ispec.param_dtype if ispec.param_dtype in ("float32", "bfloat16", "float16") else "bfloat16")
    parts = {"prefill": {"flops": fl["prefill"], "hbm_bytes": by["prefill_weights"], "pcie_bytes": 0,
                         "time_s": _part_time(fl["prefill"], peak, by["prefill_weights"], g)},
             "decode": {"flops": fl["decode"], "hbm_bytes": by["decode_weights"] + by["decode_kv"], "pcie_bytes": 0,
                        "time_s": _part_time(fl["decode"], peak, by["decode_weights"] + by["decode_kv"], g)}}
    step = parts["prefill"]["time_s"] + parts["decode"]["time_s"]
    tokens = ispec.batch_size * ispec.new_tokens
    return {"flops_per_step": fl["flops_per_step"], "step_time_s": step, "tokens_per_s": tokens / step if step else 0.0,
            "parts": parts, "basis": ROOFLINE_LABEL, "gpu": g.name}
