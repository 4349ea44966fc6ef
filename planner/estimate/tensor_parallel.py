"""Per-rank memory of tensor parallelism (TP) and FSDP2 + TP on a 2-D mesh, from the config alone (no torch).

The plan is torchtitan's for Llama-style blocks (planner/measure/tensor_parallel.py has it on transformers'
names): q/k/v and gate/up ColwiseParallel (output features sharded: dim 0 of the weight, and of q/k/v's
biases), o_proj and down_proj RowwiseParallel (input features: dim 1 of the weight), the embedding
RowwiseParallel over the vocabulary (dim 0), the head ColwiseParallel (dim 0), norms replicated. A DTensor
Shard(d) splits dim d as torch.chunk does: ceil(d/tp) per rank, the last ranks possibly fewer
(torch/distributed/tensor/placement_types.py Shard._split_tensor). With FSDP2 on the "dp" mesh dimension
each rank's TP-local tensor is chunked again on dim 0 over dp (_fsdp_param.py _init_sharded_param on the
DTensor's local tensor).

This module is the arithmetic of what each rank holds (its shards, the TP-local model, the whole-vocabulary loss
terms); the per-rank estimates that use it (estimate_tp, estimate_fsdp_tp) are in planner/estimate/distributed.py
beside FSDP2's schedule, which FSDP2 + TP runs over the TP-local model; every term names what allocates it. Terms were
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


def sp_phase_delta(cfg: ModelConfig, spec, pspec) -> dict[str, int]:
    """What torchtitan's SequenceParallel (planner/measure/tensor_parallel.py sp_plan) changes in a TP rank's
    phase peaks: the residual stream between blocks is Shard(1), b*s/tp*h per rank, so
      - every RMSNorm's saved tensors (its fp32 input and normed x, its rsqrt: the family's norm terms,
        planner/arch block_terms parts "norm.*" and outside_terms' final norm) are 1/tp of the local model's;
        with checkpointing the blocks' stash (each block's input, the residual stream) is 1/tp instead;
      - forward and loss hold one more b*s/tp*h tensor in e_r: the final norm's sharded output, alive beside
        the head's all-gathered input.
    Measured on 2 gloo ranks and the fake process group (Llama V320 h64 L2, b2 s16 fp32 AdamW, TP 2): forward
    and loss 37,184 B lower, backward 41,276 B lower (this formula: 37,184 and 41,280), optimizer unchanged."""
    import dataclasses

    from ..arch import family_of
    from ..arch.terms import Widths

    tp = pspec.tp_degree
    b, s, h, L = spec.batch_size, spec.seq_len, cfg.hidden_size, cfg.num_hidden_layers
    s_r = chunk(s, tp)  # rank 0's (the largest) sequence shard: Shard(1) splits as torch.chunk does
    w = Widths.of(spec)
    lcfg = local_config(cfg, pspec)  # the norms see the whole hidden width: their terms are the local model's
    family = family_of(lcfg)

    def norms(sp) -> tuple[int, int, int]:
        blk = sum(t.bytes for t in family.block_terms(lcfg, sp, w) if t.part.startswith("norm"))
        fin = sum(t.bytes for t in family.outside_terms(lcfg, sp, w) if t.name.startswith("RMSNorm"))
        return (b * sp.seq_len * h * w.e_r if spec.checkpointing else blk), fin, blk

    stash, fin, _ = norms(spec)
    stash_r, fin_r, _ = norms(dataclasses.replace(spec, seq_len=s_r))
    saved = L * (stash - stash_r) + fin - fin_r
    out = b * s_r * h * w.e_r
    # Measured, not yet traced to its op: under autocast the loss phase holds one b*s*h fp32 tensor less again
    # (simulated TP ranks, Llama b2 s16 TP 4 and Qwen2 b2 s24 TP 4 and b4 s64 TP 2, bf16-AMP: 4*b*s*h - 4 B each;
    # none in fp32).
    amp_loss = 4 * b * s * h if w.amp else 0
    return {"forward": out - saved, "loss": out - saved - amp_loss, "backward": -saved}
