"""Per-rank memory of tensor parallelism (TP) and FSDP2 + TP on a 2-D mesh, from the config alone (no torch).

The plan is torchtitan's for Llama-style blocks (planner/measure/tensor_parallel.py has it on transformers'
names): q/k/v and gate/up ColwiseParallel (output features sharded: dim 0 of the weight, and of q/k/v's
biases), o_proj and down_proj RowwiseParallel (input features: dim 1 of the weight), the embedding
RowwiseParallel over the vocabulary (dim 0), the head ColwiseParallel (dim 0), norms replicated. A DTensor
Shard(d) splits dim d as torch.chunk does: ceil(d/tp) per rank, the last ranks possibly fewer
(torch/distributed/tensor/placement_types.py Shard._split_tensor). With FSDP2 on the "dp" mesh dimension
each rank's TP-local tensor is chunked again on dim 0 over dp (_fsdp_param.py _init_sharded_param on the
DTensor's local tensor).

This module is the arithmetic of what each rank holds (parameters, gradients, optimizer state) and of the
step's activations, collective buffers and high points; every term names what allocates it. Terms were
read off the op-by-op timeline of the simulated and real gloo ranks (planner.measure.distributed).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..accounting import per_config, tensor_inventory
from ..config import ModelConfig

# Which weight dimension torchtitan's plan shards, by the inventory's role (planner/arch/*: role names).
SHARD_DIM = {"embed": 0, "head": 0, "attn.in": 0, "mlp.in": 0, "attn.out": 1, "mlp.out": 1}


def chunk(d: int, n: int) -> int:
    """Rows per rank of torch.chunk over n: ceil(d/n)."""
    return -(-d // n)


def local_len(d: int, n: int, r: int) -> int:
    """Rank r's length of a dimension d split as torch.chunk splits it (clamped to 0 past the end)."""
    c = chunk(d, n)
    return max(0, min(c, d - r * c))


@dataclass(frozen=True)
class TPParam:
    name: str
    shape: tuple[int, ...]
    role: str
    is_bias: bool
    block: int | None

    @property
    def shard_dim(self) -> int | None:
        """The dimension TP shards, or None (replicated): a RowwiseParallel bias is replicated."""
        d = SHARD_DIM.get(self.role)
        if d == 1 and self.is_bias:
            return None
        return d

    def tp_local_shape(self, tp: int, t: int) -> tuple[int, ...]:
        d = self.shard_dim
        if d is None:
            return self.shape
        return tuple(local_len(s, tp, t) if i == d else s for i, s in enumerate(self.shape))


@per_config
def tp_params(cfg: ModelConfig) -> tuple[TPParam, ...]:
    return tuple(TPParam(t.name, tuple(t.shape), t.role, t.is_bias, t.block)
                 for t in tensor_inventory(cfg) if t.kind == "param")


def rank_coords(pspec, rank: int) -> tuple[int, int]:
    """(dp index, tp index) of a rank: the mesh (dp, tp) is row-major, tp innermost (init_device_mesh)."""
    tp = pspec.tp_degree
    return rank // tp, rank % tp


def local_numels(cfg: ModelConfig, pspec, rank: int) -> list[tuple[int, int]]:
    """Per parameter (registration order): (elements this rank holds unpadded, elements of its padded storage).
    TP alone: the DTensor's local tensor. FSDP + TP: FSDP2's dim-0 chunk of that local tensor over dp, its
    storage padded to ceil(d0/dp) rows on every rank."""
    d_idx, t_idx = rank_coords(pspec, rank)
    dp = pspec.dp_degree if pspec.parallel == "fsdp+tp" else 1
    out = []
    for p in tp_params(cfg):
        shape = p.tp_local_shape(pspec.tp_degree, t_idx)
        rest = prod(shape[1:])
        if dp == 1:
            n = prod(shape)
            out.append((n, n))
        else:
            out.append((local_len(shape[0], dp, d_idx) * rest, chunk(shape[0], dp) * rest))
    return out


def rank_signature(cfg: ModelConfig, pspec, rank: int) -> tuple:
    """Ranks with equal signatures hold tensors of equal shapes (so equal bytes at every point of the step)."""
    d_idx, t_idx = rank_coords(pspec, rank)
    return tuple(local_numels(cfg, pspec, rank)) + tuple(
        p.tp_local_shape(pspec.tp_degree, t_idx) for p in tp_params(cfg))


def tp_rank_runs(cfg: ModelConfig, pspec) -> list[tuple[int, int, int]]:
    """Contiguous runs of ranks with the same signature, as (first, last, representative): the representative is
    the first rank with that signature (simulated once, standing for every rank that shares it)."""
    runs: list[tuple[int, int, int]] = []
    seen: dict[tuple, int] = {}
    prev = None
    for r in range(pspec.world_size):
        sig = rank_signature(cfg, pspec, r)
        rep = seen.setdefault(sig, r)
        if sig != prev:
            runs.append((r, r, rep))
            prev = sig
        else:
            runs[-1] = (runs[-1][0], r, rep)
    return runs


# ---------------------------------------------------------------- the per-rank estimate

def local_config(cfg: ModelConfig, pspec) -> ModelConfig:
    """The model one TP rank computes, as a Llama config: its heads (H/tp query, KV/tp key-value heads of the
    same head_dim), its slice of the MLP (I/tp) and of the vocabulary (V/tp rows of the embedding and the head),
    the residual stream whole (no sequence parallel). Its tensor inventory is the rank's TP-local shapes
    (Colwise: out_features/tp; Rowwise: in_features/tp), so the single-device formulas
    (planner.estimate.training) give the rank's weights, gradients, optimizer state and block activations.
    Qwen2's q/k/v biases: Llama's attention_bias, which adds an o_proj bias of h elements per layer that Qwen2
    has not (h*L elements, noted)."""
    from ..arch.llama import LlamaConfig

    tp = pspec.tp_degree
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return LlamaConfig(
        vocab_size=cfg.vocab_size // tp, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size // tp,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads // tp,
        num_key_value_heads=cfg.num_key_value_heads // tp, head_dim=hd,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False,
        rms_norm_eps=getattr(cfg, "rms_norm_eps", 1e-6),
        attention_bias=bool(getattr(cfg, "attention_bias", False) or getattr(family_q_bias(cfg), "q_bias", False)),
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)), attention=getattr(cfg, "attention", "sdpa"),
        hidden_act=getattr(cfg, "hidden_act", "silu"))


def family_q_bias(cfg: ModelConfig):
    from ..arch import family_of

    return family_of(cfg)


def _no_o_bias(cfg: ModelConfig, lcfg: ModelConfig, spec) -> dict[str, int]:
    """Bytes the local Llama config counts for an o_proj bias the family has not (Qwen2: q/k/v biases only,
    planner/arch/qwen2.py o_bias=False): L*h elements of weights and gradients, and their optimizer state
    (Adam: two moments and a 0-d fp32 step per tensor; SGD with momentum: one buffer)."""
    from ..accounting import DTYPE_BYTES
    from ..arch import family_of

    fam = family_of(cfg)
    if not lcfg.attention_bias or getattr(fam, "o_bias", True) or getattr(cfg, "attention_bias", False):
        return {}
    e_p = DTYPE_BYTES[spec.param_dtype]
    n = cfg.num_hidden_layers * cfg.hidden_size
    opt = {"adam": 2 * n * e_p + 4 * cfg.num_hidden_layers, "adamw": 2 * n * e_p + 4 * cfg.num_hidden_layers,
           "sgd-momentum": n * e_p}.get(spec.optimizer, 0)
    # under autocast its bf16 copy is cached through forward and loss (planner.estimate.training autocast_bias_bytes)
    return {"params": n * e_p, "optimizer": opt, "autocast": 2 * n if spec.autocast_dtype is not None else 0}


def _loss_side(b: int, s: int, V: int, w) -> dict[str, int]:
    """The cross-entropy's b*s*V tensors (planner.estimate.training's terms, transformers' labels loss):
    logits (e_m), their fp32 copy (ForCausalLMLoss's logits.float(); 4 B whatever the dtype, none when they
    are fp32 already without autocast), the saved log-softmax output (e_ce) and its two backward gradients."""
    bsV = b * s * V
    return {"logits": bsV * w.e_m, "fp32_copy": bsV * 4 if (w.amp or w.e_m < 4) else 0,
            "log_softmax": bsV * w.e_ce, "ce_grads": 2 * bsV * w.e_ce}


def estimate_tp(cfg: ModelConfig, spec, pspec):
    """Per-rank peak of `--parallel tp` (torchtitan's plan, planner/measure/tensor_parallel.py).

    The rank computes the local model (local_config): its weights, gradients, optimizer state and block
    activations are the single-device formulas on the TP-local shapes. On top of it, read off the op-by-op
    timeline of simulated and real gloo ranks (torch 2.13 DTensor):
      - the embedding's gradient is the whole V*h table on every rank: the embedding runs on Replicate ids and
        a Shard(0) weight, and DTensor's sharding rule for embedding_dense_backward returns a Replicate gradient
        (torch/distributed/tensor/_ops/_embedding_ops.py), kept as the parameter's .grad (a Replicate DTensor)
        from the embedding's backward (the last one) through the optimizer step to zero_grad;
      - without loss parallel the head's Colwise output is all-gathered (output_layouts=Replicate()): the
        logits and the loss's b*s*V tensors are the whole vocabulary's on every rank; the head's local
        b*s*V/tp output lives until the all-gather has copied it;
      - with loss parallel the logits stay sharded (b*s*V/tp), the local model's loss side exactly;
      - the DeviceMesh's rank map, 4*N bytes on the CPU (planner.estimate.distributed.mesh_bytes)."""
    from ..accounting import DTYPE_BYTES
    from ..arch import family_of
    from ..arch.base import resolved_loss
    from ..arch.terms import Widths
    from .distributed import DistEstimate, _single, mesh_bytes, reference_formulas
    from .training import estimate_training

    tp = pspec.tp_degree
    b, s, V, h = spec.batch_size, spec.seq_len, cfg.vocab_size, cfg.hidden_size
    lcfg = local_config(cfg, pspec)
    loc = estimate_training(lcfg, spec)
    single = estimate_training(cfg, spec)
    e_p = DTYPE_BYTES[spec.param_dtype]
    w = Widths.of(spec, loss_upcast=family_of(cfg).loss_upcast(cfg, spec))
    mesh = mesh_bytes(pspec.world_size, spec.device_type)
    embed_full = (V - V // tp) * h * e_p          # the Replicate embedding gradient beyond the local rows
    phase = dict(loc.phase_peak_bytes)
    fix = _no_o_bias(cfg, lcfg, spec)
    if fix:  # Qwen2: the local Llama config's o_proj bias is not there
        for k in phase:
            phase[k] -= (fix["params"] + fix["optimizer"] + (fix["params"] if k in ("optimizer", "zero_grad") else 0)
                         + (fix["autocast"] if k in ("forward", "loss") else 0))
        loc.params_bytes -= fix["params"]
        loc.grads_bytes -= fix["params"]
        loc.optimizer_bytes -= fix["optimizer"]
    base = loc.params_bytes + loc.buffers_bytes + loc.inputs_bytes + loc.optimizer_bytes + loc.transients.get("gradscaler", 0)
    terms = [{"name": "local model (TP-local shapes, single-device formulas)", "formula": "estimate_training(local_config)",
              "bytes": loc.peak_bytes},
             {"name": "embedding gradient, whole table (Replicate)", "formula": "(V - V/tp)*h*e_p beyond the local rows",
              "bytes": embed_full},
             {"name": "the DeviceMesh's rank map", "formula": "4*N on the CPU", "bytes": mesh}]
    if not pspec.loss_parallel:
        full, part = _loss_side(b, s, V, w), _loss_side(b, s, V // tp, w)
        d = {k: full[k] - part[k] for k in full}
        # The head's all-gather on the last dim: the Colwise local output (b*s*V/tp), gloo's all-gather buffer
        # (tp chunks stacked on dim 0: b*s*V) and their concatenation on the vocabulary (the logits, b*s*V)
        # are alive at once (DTensor redistribute Shard(-1) -> Replicate: all_gather_tensor then cat).
        head_local = part["logits"]
        phase["forward"] += d["logits"] + head_local + full["logits"]
        phase["loss"] += d["logits"] + d["fp32_copy"] + d["log_softmax"]
        ce_point = (base + loc.activations_bytes + d["log_softmax"] - (8 * b * s if resolved_loss(family_of(cfg), spec) == "labels" else 0)
                    + full["ce_grads"])
        phase["backward"] = max(phase["backward"], ce_point)
        terms.append({"name": "whole-vocabulary logits and loss tensors (head all-gathered)",
                      "formula": "b*s*(V - V/tp)*(e_m [+4] + e_ce ...)", "bytes": d["logits"] + d["fp32_copy"] + d["log_softmax"]})
    # The embedding's backward is the last: every gradient exists, the embedding's whole.
    phase["backward"] = max(phase["backward"], base + loc.grads_bytes + embed_full)
    for k in ("optimizer", "zero_grad"):
        phase[k] += embed_full
    phase = {k: v + mesh for k, v in phase.items()}
    pk = max(phase, key=phase.get)
    n = pspec.world_size
    group = {"first_rank": 0, "last_rank": n - 1, "count": n, "peak_bytes": phase[pk], "peak_phase": pk,
             "phase_peak_bytes": phase, "optimizer_bytes": loc.optimizer_bytes}
    notes = [f"tensor parallel over {tp} ranks (torchtitan's plan: q/k/v, gate/up Colwise; o, down Rowwise; "
             f"embedding Rowwise, head Colwise{' with loss parallel' if pspec.loss_parallel else ', all-gathered'}); "
             "every rank holds the same shapes."]
    return DistEstimate(
        world_size=n, parallel=asdict_(pspec), peak_bytes=phase[pk], peak_phase=pk, peak_rank=0,
        phase_peak_bytes=phase, params_bytes=loc.params_bytes, buffers_bytes=loc.buffers_bytes,
        inputs_bytes=loc.inputs_bytes, grads_bytes=loc.grads_bytes + embed_full, optimizer_bytes=loc.optimizer_bytes,
        activations_bytes=loc.activations_bytes, comm_buffers_bytes=0, host_bytes=0, rank_groups=[group],
        single_device=_single(single), reference=reference_formulas(cfg, spec, pspec), terms=terms, notes=notes)


def asdict_(pspec) -> dict:
    from dataclasses import asdict

    return asdict(pspec)


def _tp_loss_extra(cfg: ModelConfig, spec, pspec) -> dict[str, int]:
    """What the whole-vocabulary loss adds over the local model's (no loss parallel: the head all-gathered), at
    the forward's logits, through the loss and at the cross-entropy's backward (see estimate_tp)."""
    from ..arch import family_of
    from ..arch.terms import Widths

    if pspec.loss_parallel:
        return {"logits": 0, "loss": 0, "ce": 0}
    tp = pspec.tp_degree
    b, s, V = spec.batch_size, spec.seq_len, cfg.vocab_size
    w = Widths.of(spec, loss_upcast=family_of(cfg).loss_upcast(cfg, spec))
    full, part = _loss_side(b, s, V, w), _loss_side(b, s, V // tp, w)
    d = {k: full[k] - part[k] for k in full}
    return {"logits": d["logits"] + part["logits"] + full["logits"],
            "loss": d["logits"] + d["fp32_copy"] + d["log_softmax"],
            "ce": d["log_softmax"] + d["ce_grads"]}


def estimate_fsdp_tp(cfg: ModelConfig, spec, pspec):
    """Per-rank peak of `--parallel fsdp+tp` (2-D mesh dp x tp): FSDP2's schedule (planner.estimate.distributed,
    every block and the root fully_shard-ed on the dp dimension) over each rank's TP-local model (local_config:
    FSDP2 chunks the DTensor's local tensor on dim 0 over dp, _fsdp_param.py _init_sharding_spec_tp), with the
    TP layer's whole-vocabulary loss (_tp_loss_extra) and the 2-D mesh's rank map (4*N B on the CPU). The
    embedding's Replicate gradient (estimate_tp) is reduce-scattered by FSDP2 into its sharded gradient like
    any other: measured, it adds nothing after the backward."""
    from .distributed import _compute_spec, _estimate_fsdp, mesh_bytes
    from .training import estimate_training
    from ..parallel import ParallelSpec

    lcfg = local_config(cfg, pspec)
    dp = pspec.dp_degree
    fsdp = ParallelSpec(dp, "fsdp", reshard_after_forward=pspec.reshard_after_forward,
                        mp_param_dtype=pspec.mp_param_dtype, mp_reduce_dtype=pspec.mp_reduce_dtype)
    # the loss side in the compute dtype (a bf16 MixedPrecisionPolicy computes as an all-bf16 run)
    extra = {**_tp_loss_extra(cfg, _compute_spec(spec, fsdp), pspec), "mesh": mesh_bytes(pspec.world_size, spec.device_type)}
    if pspec.mp_param_dtype in ("bfloat16", "float16"):
        # Measured, not yet traced to its op: with a low-precision MixedPrecisionPolicy over TP, the blocks' in-block
        # backward high points hold one more b*s*h tensor in the compute dtype than FSDP2's schedule over the
        # TP-local model (simulated ranks: b*s*h*2 B to the byte on Llama-2-70B at FSDP 128 x TP 8 and on a Llama
        # h512 s1024 at FSDP 8 x TP 2; none in fp32, none without the policy, none with FSDP2 alone).
        extra["block"] = spec.batch_size * spec.seq_len * cfg.hidden_size * 2
    est = _estimate_fsdp(lcfg, spec, fsdp, estimate_training(lcfg, spec), tp_extra=extra)
    fix = _no_o_bias(cfg, lcfg, spec)
    if fix:  # Qwen2: the local Llama config's o_proj bias, sharded over dp (approximately 1/dp of it per rank)
        for g in est.rank_groups:  # est.phase_peak_bytes is the top group's dict
            for k in g["phase_peak_bytes"]:
                g["phase_peak_bytes"][k] -= (fix["params"] * (2 if k in ("optimizer", "zero_grad") else 1)
                                             + fix["optimizer"] + (fix["autocast"] if k in ("forward", "loss") else 0)) // dp
            g["peak_phase"] = max(g["phase_peak_bytes"], key=g["phase_peak_bytes"].get)
            g["peak_bytes"] = g["phase_peak_bytes"][g["peak_phase"]]
    top = max(est.rank_groups, key=lambda g: g["peak_bytes"])
    est.peak_bytes, est.peak_phase, est.phase_peak_bytes = top["peak_bytes"], top["peak_phase"], top["phase_peak_bytes"]
    est.world_size = pspec.world_size
    est.parallel = asdict_(pspec)
    est.rank_groups = _expand_groups(est.rank_groups, pspec)
    est.single_device = _single_of(cfg, spec)
    est.notes.insert(0, f"FSDP2 x{dp} (dp) over tensor parallel x{pspec.tp_degree} (torchtitan's plan); FSDP2's figures "
                        "below are those of each rank's TP-local model.")
    return est


def _single_of(cfg, spec) -> dict:
    from .distributed import _single
    from .training import estimate_training

    return _single(estimate_training(cfg, spec))


def _expand_groups(groups: list[dict], pspec) -> list[dict]:
    """FSDP2's rank groups are dp indices; the global rank is dp_index * tp + tp_index (tp innermost)."""
    tp = pspec.tp_degree
    return [{**g, "first_rank": g["first_rank"] * tp, "last_rank": g["last_rank"] * tp + tp - 1,
             "count": g["count"] * tp} for g in groups]
