"""Per-rank peak of one data-parallel training step (DDP or FSDP2) from the config alone (no torch).

Built on the single-device record (planner.estimate.training): its activations, transients and the
named high points of its backward sweep stay; what changes is what each rank holds of the weights,
gradients and optimizer state, and the communication buffers. Every term below was read off the
op-by-op timeline of real gloo ranks (planner.measure.distributed, 2 and 4 ranks) and is named after
the PyTorch source that allocates it (torch 2.13).

DDP (torch/nn/parallel/distributed.py, c10d reducer.cpp): every rank holds the whole model, and the
  reducer's gradient buckets, one flat tensor per bucket (25 MiB cap, the first 1 MiB), allocated at
  construction and rebuilt in the second step's forward: one more copy of the gradients, alive for
  the whole step. With gradient_as_bucket_view=True the .grad tensors become views into the buckets
  at the end of backward, so the optimizer phases hold the gradients once.
FSDP2 (torch/distributed/fsdp/_fully_shard/, every block and the root fully_shard-ed): each parameter is
  chunked on dim 0 into ceil(d0/N) rows per rank; the sharded storage is padded to that size on every
  rank (_fsdp_param.py, _sharded_param_data), the optimizer state follows the unpadded local rows
  (rank r: clamp(d0 - r*ceil(d0/N), 0, ceil(d0/N)) rows). A group (a block, or the root's embeddings,
  final norm and head) is all-gathered into one flat buffer of N * padded-shard elements in the compute
  dtype, copied out into its unsharded parameters (per-parameter buffers of N padded shards, resized
  from 0; the parameter is a view of its buffer), and freed again
  (_fsdp_param_group.py wait_for_unshard: in forward the buffer lives until the next group's copy-out,
  the last one until the root's post-forward; in backward it is freed at once, and the next group in
  reverse order is prefetched). Unsharded gradients (compute dtype) are copied into a reduce-scatter
  input of N * padded-shard elements (reduce dtype) at each group's post-backward; its output, one flat
  padded shard per group, becomes the sharded gradients (cast to the parameters' dtype if needed).
  reshard_after_forward=False keeps every group unsharded from its forward to its post-backward.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from math import prod

from ..accounting import DTYPE_BYTES, per_config, tensor_inventory
from ..arch import family_of
from ..arch.base import resolved_loss
from ..config import ConfigError, ModelConfig
from ..parallel import ParallelSpec, block_prefixes, check_parallel_run, check_wrappable
from ..spec import TrainSpec
from .activations import Widths, block_terms, outside_terms
from .training import TrainEstimate, _grad_numels, autocast_weight_bytes, estimate_training
from . import step

# DDP's bucket caps (torch/nn/parallel/distributed.py: bucket_cap_mb=25 by default; the first bucket
# is capped at dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB so that the first all-reduce starts early).
DDP_BUCKET_CAP_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20
# The ZeRO paper's optimizer-state multiplier for mixed-precision Adam (fp32 master weights, momentum,
# variance: 4 + 4 + 4 bytes per parameter), arXiv:1910.02054 section 3.1.
ZERO_K = 12


@dataclass
class DistEstimate:
    """Per-rank figures; top-level fields are the rank with the largest peak (as the measured record)."""
    world_size: int
    parallel: dict
    peak_bytes: int
    peak_phase: str
    peak_rank: int
    phase_peak_bytes: dict[str, int]
    params_bytes: int         # this rank's parameters at rest (FSDP: the padded shards)
    buffers_bytes: int
    inputs_bytes: int
    grads_bytes: int          # gradients held after backward (FSDP: the sharded gradients)
    optimizer_bytes: int      # the peak rank's optimizer state
    activations_bytes: int
    comm_buffers_bytes: int   # persistent communication buffers (DDP's gradient buckets)
    host_bytes: int           # CPU offload: what lives in host RAM instead of on the device
    rank_groups: list[dict]   # ranks with identical shards share one figure: first/last rank, count, peak
    single_device: dict       # the same run on one device, for comparison
    reference: dict           # the ZeRO paper's and DeepSpeed's formulas, labelled as theirs
    terms: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- sharding arithmetic (FSDP2 dim-0 chunks)

@dataclass(frozen=True)
class _Param:
    name: str
    d0: int
    rest: int   # elements per dim-0 row

    @property
    def numel(self) -> int:
        return self.d0 * self.rest


@per_config
def _groups(cfg: ModelConfig) -> tuple[tuple[_Param, ...], tuple[tuple[_Param, ...], ...]]:
    """(root parameters, one tuple per block), in registration order (the optimizer's order)."""
    prefixes = block_prefixes(cfg)
    blocks: dict[str, list[_Param]] = {p: [] for p in prefixes}
    root: list[_Param] = []
    for t in tensor_inventory(cfg):
        if t.kind != "param":
            continue
        p = _Param(t.name, t.shape[0], prod(t.shape[1:]))
        owner = next((pre for pre in prefixes if t.name.startswith(pre + ".")), None)
        (blocks[owner] if owner else root).append(p)
    return tuple(root), tuple(tuple(v) for v in blocks.values())


def _chunk(d0: int, n: int) -> int:
    """Rows per rank: torch.chunk's ceil(d0/N) (_fsdp_param.py _chunk_with_empty)."""
    return -(-d0 // n)


def _local_rows(d0: int, n: int, rank: int) -> int:
    c = _chunk(d0, n)
    return max(0, min(c, d0 - rank * c))


def padded_shard_numel(params, n: int) -> int:
    return sum(_chunk(p.d0, n) * p.rest for p in params)


def rank_runs(params: list[_Param], n: int) -> list[tuple[int, int]]:
    """Contiguous runs of ranks whose local shards have the same shapes, as (first, last)."""
    d0s = sorted({p.d0 for p in params})
    runs: list[tuple[int, int]] = []
    prev = None
    for r in range(n):
        sig = tuple(_local_rows(d, n, r) for d in d0s)
        if sig != prev:
            runs.append((r, r))
            prev = sig
        else:
            runs[-1] = (runs[-1][0], r)
    return runs


@per_config
def _rank_runs_of(cfg: ModelConfig, n: int) -> list[tuple[int, int]]:
    return rank_runs(list(param_order(cfg)), n)


def _optimizer_local(cfg: ModelConfig, spec: TrainSpec, n: int, rank: int, e_p: int) -> tuple[int, int, str]:
    return _optimizer_local_cached(cfg, spec.optimizer, spec.resolved_optimizer_impl, n, rank, e_p)


@per_config
def _optimizer_local_cached(cfg: ModelConfig, optimizer: str, impl: str, n: int, rank: int,
                            e_p: int) -> tuple[int, int, str]:
    """(state bytes, step temporaries, formula) on one rank's local shards: the single-device formulas of
    planner.estimate.training applied to the unpadded local rows (Adam's zeros_like(p) of a DTensor)."""
    params = param_order(cfg)
    local = [_local_rows(p.d0, n, rank) * p.rest for p in params]
    total = sum(local)
    if optimizer in ("adam", "adamw"):
        state = 2 * total * e_p + 4 * len(params)  # exp_avg, exp_avg_sq + a 0-d fp32 step per tensor
    elif optimizer == "sgd-momentum":
        state = total * e_p
    else:
        state = 0
    if optimizer not in ("adam", "adamw") or impl == "fused":
        return state, 0, "0 (in-place update)"
    if impl == "foreach":
        return state, total * e_p, "sum(local) * e_p (foreach sqrt copy of every local shard)"
    worst = max(2 * x + (local[i - 1] if i else 0) for i, x in enumerate(local))
    return state, worst * e_p, "max_i(local[i-1] + 2*local[i]) * e_p (for-loop Adam on the local shards)"


# ---------------------------------------------------------------- DDP

def ddp_buckets(cfg: ModelConfig, e_g: int) -> list[int]:
    """Bucket sizes in bytes: parameters in reverse registration order (the reducer's initial order,
    distributed.py _build_params_for_reducer + compute_bucket_assignment_by_size), filled up to the cap;
    a parameter larger than the cap gets a bucket of its own."""
    sizes = [t.numel * e_g for t in tensor_inventory(cfg) if t.kind == "param"][::-1]
    buckets, cur, cap = [], 0, DDP_FIRST_BUCKET_BYTES
    for sz in sizes:
        cur += sz
        if cur >= cap:
            buckets.append(cur)
            cur, cap = 0, DDP_BUCKET_CAP_BYTES
    if cur:
        buckets.append(cur)
    return buckets


def _estimate_ddp(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec, single: TrainEstimate) -> DistEstimate:
    e_g = DTYPE_BYTES[spec.param_dtype]
    buckets = ddp_buckets(cfg, e_g)
    bucket_bytes = sum(buckets)
    phase = step.shifted(single.phase_peak_bytes, every=bucket_bytes)  # (planner/estimate/step.py)
    terms = [{"name": "DDP gradient buckets", "formula": "P*e_g (sum of the buckets; 25 MiB cap, first 1 MiB)",
              "bytes": bucket_bytes}]
    notes = [f"DDP: {len(buckets)} gradient bucket(s) of {', '.join(str(b) for b in buckets[:6])}"
             f"{' ...' if len(buckets) > 6 else ''} bytes, alive for the whole step (one more copy of the gradients)."]
    if pspec.gradient_as_bucket_view:
        # The reducer points .grad at the bucket views: after backward the gradients exist once.
        phase = step.shifted(phase, after_backward=-single.grads_bytes)
        terms.append({"name": "gradients as bucket views (optimizer phases)", "formula": "-P*e_g", "bytes": -single.grads_bytes})
        notes.append("gradient_as_bucket_view=True: the backward still creates each gradient before the reducer "
                     "copies it into its bucket, so the backward peak is counted as with False (an upper bound "
                     "where the peak falls late in the backward).")
    peak_phase = step.peak(phase)[0]
    n = pspec.world_size
    group = {"first_rank": 0, "last_rank": n - 1, "count": n, "peak_bytes": phase[peak_phase], "peak_phase": peak_phase,
             "phase_peak_bytes": phase, "optimizer_bytes": single.optimizer_bytes}
    return DistEstimate(
        world_size=n, parallel=asdict(pspec), peak_bytes=phase[peak_phase], peak_phase=peak_phase, peak_rank=0,
        phase_peak_bytes=phase, params_bytes=single.params_bytes, buffers_bytes=single.buffers_bytes,
        inputs_bytes=single.inputs_bytes, grads_bytes=single.grads_bytes, optimizer_bytes=single.optimizer_bytes,
        activations_bytes=single.activations_bytes, comm_buffers_bytes=bucket_bytes, host_bytes=0,
        rank_groups=[group], single_device=_single(single), reference=reference_formulas(cfg, spec, pspec),
        terms=terms, notes=notes)


# ---------------------------------------------------------------- FSDP2

def _compute_spec(spec: TrainSpec, pspec: ParallelSpec) -> TrainSpec:
    """The run as the blocks compute it: a MixedPrecisionPolicy(param_dtype=bf16/fp16) casts the
    all-gathered weights, so activations, logits and unsharded gradients are those of an all-bf16 run."""
    if pspec.mp_param_dtype in ("bfloat16", "float16"):
        return replace(spec, precision="bf16")
    return spec


def _estimate_fsdp(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec, single: TrainEstimate,
                   tp_extra: dict | None = None) -> DistEstimate:
    """tp_extra (FSDP2 over the dp dimension of a TP-local model, planner/estimate/tensor_parallel.py): bytes
    the TP layer adds at the forward's logits ("logits"), through the loss ("loss"), at the cross-entropy's
    backward ("ce"), at the blocks' in-block backward points ("block"), and the whole mesh's rank map ("mesh")."""
    n = pspec.world_size
    tpx = tp_extra or {}
    root, blocks = _groups(cfg)
    L = len(blocks)
    e_p = DTYPE_BYTES[spec.param_dtype]                       # sharded parameters, gradients, optimizer
    e_c = DTYPE_BYTES[pspec.mp_param_dtype] if pspec.mp_param_dtype else e_p   # unsharded (compute)
    e_r = DTYPE_BYTES[pspec.mp_reduce_dtype] if pspec.mp_reduce_dtype else e_c  # reduce-scatter
    cspec = _compute_spec(spec, pspec)
    # (FSDP's forward points are its own: the all-gathers over the end of the forward, forward_points=False)
    comp = estimate_training(cfg, cspec, forward_points=False) if cspec != spec else single

    blk = max(blocks, key=lambda g: sum(p.numel for p in g))  # blocks are alike; the largest if not
    u_root, u_blk = sum(p.numel for p in root), sum(p.numel for p in blk)
    s_root, s_blk = padded_shard_numel(root, n), padded_shard_numel(blk, n)
    s_all = s_root + sum(padded_shard_numel(g, n) for g in blocks)

    params_s = s_all * e_p                 # _sharded_param_data: padded shards
    grads_s = s_all * e_p                  # one flat padded reduce-scatter output per group, in e_p
    buffers = single.buffers_bytes         # buffers are not sharded (fully_shard leaves them replicated)
    inputs = single.inputs_bytes
    mesh = tpx.get("mesh", mesh_bytes(n, spec.device_type))
    scaler = single.transients.get("gradscaler", 0)
    ag_blk, ag_root = n * s_blk * e_c, n * s_root * e_c        # a group's flat all-gather output
    # The unsharded parameters are views into per-parameter all-gather buffers of N padded shards each
    # (_fsdp_param.py init_all_gather_outputs / init_unsharded_param: as_strided over the padded buffer),
    # so a group unsharded holds N * padded_shard elements, not its unpadded numel.
    root_c, blk_c = ag_root, ag_blk
    rs_root, rs_blk = n * s_root * e_r, n * s_blk * e_r       # reduce-scatter inputs
    keep = not pspec.reshard_after_forward
    # gloo (the CPU backend) reduce-scatters a flat copy of the input (ProcessGroupGloo _reduce_scatter_base
    # -> reduce_scatter flattens its inputs), alive from the collective until its result is copied out;
    # nccl works in place.
    gloo_copy = 1 if spec.device_type == "cpu" else 0
    all_unsharded = root_c + L * blk_c if keep else 0          # no reshard: held from forward to backward

    # The compute-precision run's own base (its weights, buffers, inputs, optimizer state in e_c).
    base_c = (comp.params_bytes + comp.buffers_bytes + comp.inputs_bytes + comp.optimizer_bytes
              + comp.transients.get("gradscaler", 0))
    fwd_acts = comp.phase_peak_bytes["forward"] - base_c   # saved activations + logits
    loss_acts = comp.phase_peak_bytes["loss"] - base_c
    ce_point = comp.activations_bytes + comp.transients["cross_entropy_grads"]

    # Rank-independent part of each phase (without the optimizer state, added per rank below).
    rest = params_s + buffers + inputs + scaler + mesh
    # Forward high points: the logits, with the root unsharded and the last block's all-gather output still
    # held (comm_ctx.all_gather_state); and the root's own all-gather at the start (output + copy-out).
    # Then each block's copy-out: the previous group's all-gather output is still held, so two outputs,
    # the new block's parameters and the root's are alive over the activations saved so far (the last
    # block's is the largest; with reshard_after_forward=False the earlier blocks stay gathered too).
    fwd = {"logits": rest + fwd_acts + (all_unsharded if keep else root_c) + ag_blk + tpx.get("logits", 0),
           "root all-gather": rest + ag_root + root_c}
    prev_ag = ag_blk if L > 1 else ag_root
    fwd["last block all-gather"] = (rest + _saved_before(cfg, cspec, L - 1) + root_c + prev_ag + ag_blk + blk_c
                                    + ((L - 1) * blk_c if keep else 0))
    forward = max(fwd.values())
    # transformers' `model(input_ids, labels=...)` computes the loss inside the root's forward, before its
    # post-forward: the root is still unsharded and the last block's all-gather output still held through the
    # loss (measured on the simulated ranks: root_c + ag_blk to the byte, also without resharding), and, when
    # resharding, through the loss's backward. The book's loss runs on the returned logits.
    in_forward = resolved_loss(family_of(cfg), spec) == "labels"
    loss = (rest + loss_acts + ((all_unsharded if keep else root_c) + ag_blk if in_forward else all_unsharded)
            + tpx.get("loss", 0))
    back = {"cross-entropy backward": rest + ce_point + (root_c + ag_blk if in_forward and not keep else all_unsharded)
            + tpx.get("ce", 0)}
    if not keep:
        # The root's all-gather at its pre-backward, after the cross-entropy backward: its gradient w.r.t.
        # the logits (b*s*V*e_ce) has replaced the log-softmax output it freed (the same size), so the saved
        # activations, the all-gather output and the unsharded root are alive at once.
        back["root all-gather"] = rest + comp.activations_bytes + ag_root + root_c
    for name, v in comp.backward_points.items():
        if name == "final norm" and v == 0:
            continue
        if name.startswith("first block"):
            # Blocks 1..L-1 are done: their gradients are sharded; only block 0 and the root are unsharded.
            # Block 1's reduce-scatter input is still held (comm_ctx.reduce_scatter_state, freed when the
            # next group's reduce-scatter starts).
            grads_adj = (L - 1) * (s_blk * e_p - u_blk * e_c)
            extras = root_c + blk_c + (rs_blk if L > 1 else 0)
            if L > 2:
                # Block 1, one block earlier in the sweep: one more block's saved set, one sharded gradient
                # less, and block 0 being prefetched (or, without resharding, still gathered).
                per_block = _saved_before(cfg, cspec, 1) - _saved_before(cfg, cspec, 0)
                back[f"second{name[5:]} (+ block 0 prefetched)"] = (
                    rest + v + grads_adj + extras + per_block - s_blk * e_p + (blk_c if keep else ag_blk)
                    + tpx.get("block", 0))
        elif name.startswith("last block"):
            grads_adj = 0
            extras = root_c + L * blk_c if keep else root_c + blk_c + (ag_blk if L > 1 else 0)
            if L > 2:
                # Block L-2, one block further: one block's saved set less, block L-1's gradients sharded,
                # and its reduce-scatter input still held while block L-2 computes (freed at the next
                # reduce-scatter); with reshard_after_forward=False block L-1 is no longer gathered.
                per_block = _saved_before(cfg, cspec, 1) - _saved_before(cfg, cspec, 0)
                back[f"second-last{name[4:]} (+ block L-1's reduce-scatter input)"] = (
                    rest + v - per_block + s_blk * e_p + rs_blk + extras - (blk_c if keep else 0) + tpx.get("block", 0))
        else:  # before the blocks (Llama's final RMSNorm backward): block L-1 is being prefetched
            grads_adj = 0
            extras = root_c + (L * blk_c if keep else ag_blk)
        back[f"{name} (+ unsharded root and block{'s' if keep else ''})"] = (rest + v + grads_adj + extras
                                                                            + tpx.get("block", 0))
    if L > 1:
        # Block 0's copy-out at its pre-backward, before it computes: its all-gather output and unsharded
        # parameters, block 1's reduce-scatter input still held, and what is saved for blocks <= 0.
        head_g = _head_grad_numel(cfg) * e_c
        back["first block all-gather"] = (rest + _saved_before(cfg, cspec, 1) + _grad_in(cfg, cspec) + head_g
                                          + (L - 1) * s_blk * e_p + root_c + blk_c + ag_blk + rs_blk)
        # A block's post-backward (block i = L-1, and i = 1): its unsharded gradients copied into its
        # reduce-scatter input while block i-1 is already gathered (its pre-backward ran first), over the
        # activations saved for blocks < i and the sharded gradients of blocks > i.
        # Then its output (the unsharded gradients freed), and on gloo the copy of the input it reduces.
        for i in sorted({L - 1, 1}):
            base_i = (rest + _saved_before(cfg, cspec, i) + _grad_in(cfg, cspec) + head_g + (L - 1 - i) * s_blk * e_p
                      + rs_blk + root_c + (i if keep else 1) * blk_c)
            back[f"block {i} reduce-scatter"] = base_i + u_blk * e_c
            back[f"block {i} reduce-scatter: output"] = base_i + s_blk * e_r + gloo_copy * rs_blk
    # The end of the backward, the embedding's: the root still gathered, every root gradient at once, block
    # 0's reduce-scatter input still held. A tied head's gradient is accumulated out of place there
    # (AccumulateGrad: head part + embedding part -> their sum), two more V*h gradients for a moment.
    tied = 2 * cfg.vocab_size * cfg.hidden * e_c if getattr(cfg, "tie_word_embeddings", False) else 0
    back["embedding backward"] = rest + L * s_blk * e_p + rs_blk + root_c + u_root * e_c + tied
    # The root's post-backward (_fsdp_collectives.py foreach_reduce), after the activations are gone:
    # every block's sharded gradients, then (a) the root's unsharded gradients (compute dtype) copied into
    # its reduce-scatter input (reduce dtype); (b) the gradients freed after the copy-in, except the
    # first one the backward created (the last root parameter's: the untied head's, else the final
    # norm's; still referenced there, measured), and the reduce-scatter output (reduce dtype); (c) with
    # a reduce dtype other than the parameters', that output's cast to e_p.
    survivor = root[-1].numel * e_c if root else 0
    rs_base = rest + L * s_blk * e_p + rs_root
    back["root reduce-scatter: copy-in"] = rs_base + u_root * e_c
    back["root reduce-scatter: output"] = (rs_base + survivor + s_root * e_r + gloo_copy * rs_root
                                           + (s_root * e_p if e_r != e_p else 0))
    runs = _rank_runs_of(cfg, n)
    groups = []
    for first, last in runs:
        opt, opt_tmp, opt_formula = _optimizer_local(cfg, spec, n, first, e_p)
        # the rank's step (planner/estimate/step.py): its shards and optimizer state as the base; the high
        # points above were counted with `rest` in them
        phase = step.phases(step.Step(base=rest + opt, grads=grads_s, optimizer_tmp=opt_tmp, forward=forward - rest,
                                      loss=loss - rest, backward=[max(back.values()) - rest]))
        pk = step.peak(phase)[0]
        groups.append({"first_rank": first, "last_rank": last, "count": last - first + 1, "peak_bytes": phase[pk],
                       "peak_phase": pk, "phase_peak_bytes": phase, "optimizer_bytes": opt,
                       "optimizer_temporary_bytes": opt_tmp})
    top = max(groups, key=lambda g: g["peak_bytes"])
    host = 0
    notes = [f"FSDP2 over {n} ranks: {L} blocks + the root fully_shard-ed; reshard_after_forward="
             f"{pspec.reshard_after_forward}; compute dtype {pspec.mp_param_dtype or spec.param_dtype}, "
             f"reduce dtype {pspec.mp_reduce_dtype or pspec.mp_param_dtype or spec.param_dtype}.",
             f"backward high point: {max(back, key=back.get)}."]
    if spec.device_type == "cpu":
        notes.append("gloo (CPU): a collective's output can outlive FSDP2's release of it, held by the c10d work "
                     "until gloo's worker thread drops it; a step where that happens peaks up to one group's "
                     f"all-gather output higher ({max(ag_blk, ag_root):,} B here). peak_bytes is FSDP2's own "
                     "schedule (what measure reports: it measures such a step again).")
    if pspec.cpu_offload:
        # CPUOffloadPolicy: sharded parameters, sharded gradients and the optimizer (state and step) live
        # in host RAM; the device holds the unsharded groups, all-gather / reduce-scatter buffers,
        # activations and the batch.
        host_parts = params_s + grads_s + top["optimizer_bytes"] + top["optimizer_temporary_bytes"]
        host = host_parts
        for g in groups:
            g["host_bytes"] = params_s + grads_s + g["optimizer_bytes"] + g["optimizer_temporary_bytes"]
        notes.append("cpu offload: host_bytes = sharded parameters + sharded gradients + optimizer state and "
                     "its step temporaries; on a CPU-only machine the device is the CPU, so peak_bytes counts both.")
    terms = [
        {"name": "sharded parameters (padded dim-0 shards)", "formula": "sum_p ceil(d0/N)*rest * e_p", "bytes": params_s},
        {"name": "sharded gradients (flat reduce-scatter outputs)", "formula": "sum_p ceil(d0/N)*rest * e_p", "bytes": grads_s},
        {"name": "optimizer state on the local rows (peak rank)", "formula": "single-device formula on clamp(d0 - r*ceil(d0/N), 0, ceil(d0/N)) rows",
         "bytes": top["optimizer_bytes"]},
        {"name": "the DeviceMesh's rank map (int32, one per rank; on the CPU)", "formula": "4*N on a CPU run, else 0 "
         "(host memory)", "bytes": mesh},
        {"name": "not in peak_bytes: a late release on gloo", "where": "not counted",
         "formula": "max(N * padded_shard(block), N * padded_shard(root)) * e_c",
         "bytes": max(ag_blk, ag_root) if spec.device_type == "cpu" else 0},
        {"name": "unsharded root (embeddings, final norm, head)", "formula": "N * padded_shard(root) * e_c",
         "bytes": root_c},
        {"name": "unsharded block", "formula": "N * padded_shard(block) * e_c", "bytes": blk_c},
        {"name": "all-gather output of a block", "formula": "N * padded_shard(block) * e_c", "bytes": ag_blk},
        {"name": "all-gather output of the root", "formula": "N * padded_shard(root) * e_c", "bytes": ag_root},
        {"name": "reduce-scatter input of the root", "formula": "N * padded_shard(root) * e_r", "bytes": rs_root},
        {"name": "reduce-scatter input of a block", "formula": "N * padded_shard(block) * e_r", "bytes": rs_blk},
    ] + [{"name": f"backward point: {k}", "formula": "see planner.estimate.distributed", "bytes": v, "where": "candidate"}
         for k, v in back.items()]
    return DistEstimate(
        world_size=n, parallel=asdict(pspec), peak_bytes=top["peak_bytes"], peak_phase=top["peak_phase"],
        peak_rank=top["first_rank"], phase_peak_bytes=top["phase_peak_bytes"], params_bytes=params_s,
        buffers_bytes=buffers, inputs_bytes=inputs, grads_bytes=grads_s, optimizer_bytes=top["optimizer_bytes"],
        activations_bytes=comp.activations_bytes, comm_buffers_bytes=0, host_bytes=host, rank_groups=groups,
        single_device=_single(single), reference=reference_formulas(cfg, spec, pspec), terms=terms, notes=notes)


def mesh_bytes(n: int, device_type: str) -> int:
    """The DeviceMesh's rank map: torch.arange(N, dtype=torch.int) made on the CPU whatever the device
    (torch/distributed/device_mesh.py init_device_mesh), alive with the mesh: 4*N bytes on a CPU run, host
    memory (not the device's) on CUDA. Found by a tracker running from the model's construction on."""
    return 4 * n if device_type == "cpu" else 0


def _saved_before(cfg: ModelConfig, spec: TrainSpec, blocks: int) -> int:
    """Activation bytes saved by the embeddings and the first `blocks` blocks (the accounting of
    planner.estimate.training's sweep; under checkpointing a block keeps only its stashed input)."""
    w = Widths.of(spec)
    bsh = spec.batch_size * spec.seq_len * cfg.hidden
    embed = sum(t.bytes for t in outside_terms(cfg, spec, w) if t.where == "embed")
    if spec.checkpointing:
        per_block = bsh * w.e_r
    else:
        per_block = (sum(t.bytes for t in block_terms(cfg, spec, w))
                     + autocast_weight_bytes(cfg, spec, blocks_only=True) // cfg.layers)
    return embed + blocks * per_block


def _grad_in(cfg: ModelConfig, spec: TrainSpec) -> int:
    """The gradient arriving at a block's output in backward (b*s*h*e_r)."""
    return spec.batch_size * spec.seq_len * cfg.hidden * Widths.of(spec).e_r


def _head_grad_numel(cfg: ModelConfig) -> int:
    """Root gradients that exist during the blocks' backward: the output head and final norm."""
    return _grad_numels(cfg)["head"]


@per_config
def param_order(cfg: ModelConfig) -> tuple[_Param, ...]:
    return tuple(_Param(t.name, t.shape[0], prod(t.shape[1:])) for t in tensor_inventory(cfg) if t.kind == "param")


def _single(est: TrainEstimate) -> dict:
    return {"peak_bytes": est.peak_bytes, "peak_phase": est.peak_phase, "phase_peak_bytes": est.phase_peak_bytes}


# ---------------------------------------------------------------- their formulas, for comparison

@per_config
def largest_layer_params(cfg: ModelConfig) -> int:
    """DeepSpeed's largest_layer_params: the most parameters one module owns directly
    (sum(p.numel() for p in m.parameters(recurse=False)), deepspeed/runtime/zero/stage3.py)."""
    per_module: dict[str, int] = {}
    for t in tensor_inventory(cfg):
        if t.kind == "param":
            mod = t.name.rsplit(".", 1)[0]
            per_module[mod] = per_module.get(mod, 0) + t.numel
    return max(per_module.values())


def zero_paper_bytes(psi: int, n: int, k: int = ZERO_K) -> dict[str, int]:
    """Model-state bytes per device in the ZeRO paper (arXiv:1910.02054 section 3 and Figure 1): fp16
    weights and gradients (2 + 2 bytes) and K bytes of optimizer state per parameter, partitioned by
    stage over N devices."""
    return {"DP": (2 + 2 + k) * psi, "ZeRO-1": 4 * psi + k * psi // n,
            "ZeRO-2": 2 * psi + (2 + k) * psi // n, "ZeRO-3": (2 + 2 + k) * psi // n}


def deepspeed_bytes(psi: int, largest_layer: int, n: int, cpu_offload: bool) -> dict[str, int]:
    """The GPU figure of DeepSpeed's estimators (deepspeed/runtime/zero/stage_1_and_2.py
    estimate_zero2_model_states_mem_needs: 2P + 18P/N since PR #5099, 2P with offload; stage3.py
    estimate_zero3_model_states_mem_needs: 4 * largest layer + 18P/N, the largest layer alone with
    parameters and optimizer offloaded). DeepSpeed has no ZeRO-1 estimator (its issue #5102)."""
    return {"ZeRO-2": 2 * psi if cpu_offload else 2 * psi + int(18 * psi / n),
            "ZeRO-3": 4 * largest_layer if cpu_offload else 4 * largest_layer + int(18 * psi / n)}


def reference_formulas(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec) -> dict:
    """Model-state formulas as their authors state them (no activations, no buffers, no communication
    buffers): the figures users compare against. psi = parameter count, N = world size."""
    from ..accounting import param_count

    psi, n = param_count(cfg), pspec.world_size
    ll = largest_layer_params(cfg)
    analog = ("DP" if pspec.parallel == "ddp" else "ZeRO-3" if pspec.reshard_after_forward else "ZeRO-2")
    return {
        "closest": analog,
        "zero_paper": {"source": "ZeRO paper (Rajbhandari et al., arXiv:1910.02054), mixed-precision Adam, K=12, "
                                 "model states only", **zero_paper_bytes(psi, n)},
        "deepspeed": {"source": "DeepSpeed estimate_zero2/zero3_model_states_mem_needs (GPU figure), model states only",
                      **deepspeed_bytes(psi, ll, n, pspec.cpu_offload), "largest_layer_params": ll,
                      "cpu_offload": pspec.cpu_offload},
    }


# ---------------------------------------------------------------- entry point

def estimate_distributed(cfg: ModelConfig, spec: TrainSpec, pspec: ParallelSpec) -> DistEstimate:
    check_parallel_run(spec, pspec)
    check_wrappable(cfg, pspec)
    if pspec.parallel == "fsdp" and spec.grad_accum > 1:
        raise ConfigError("gradient accumulation with FSDP (sharded gradients kept between micro-batches) "
                          "is not modelled yet; use --grad-accum 1")
    if pspec.parallel == "tp":  # tensor parallel (below; the shard arithmetic: planner/estimate/tensor_parallel.py)
        return estimate_tp(cfg, spec, pspec)
    if pspec.parallel == "fsdp+tp":
        return estimate_fsdp_tp(cfg, spec, pspec)
    if pspec.parallel == "ddp":
        return _estimate_ddp(cfg, spec, pspec, estimate_training(cfg, spec))
    # (FSDP's forward points are the all-gathers over the end of the forward: planner/estimate/training.py
    # forward_block_points are not composed with them yet)
    return _estimate_fsdp(cfg, spec, pspec, estimate_training(cfg, spec, forward_points=False))


# ---------------------------------------------------------------- tensor parallel, FSDP2 + TP (issue #23)

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
    from ..arch.terms import Widths
    from .tensor_parallel import _loss_side, _no_o_bias, local_config

    tp = pspec.tp_degree
    b, s, V, h = spec.batch_size, spec.seq_len, cfg.vocab_size, cfg.hidden_size
    lcfg = local_config(cfg, pspec)
    loc = estimate_training(lcfg, spec, forward_points=False)  # (the head's all-gather shifts the end of the forward)
    single = estimate_training(cfg, spec)
    e_p = DTYPE_BYTES[spec.param_dtype]
    w = Widths.of(spec, loss_upcast=family_of(cfg).loss_upcast(cfg, spec))
    mesh = mesh_bytes(pspec.world_size, spec.device_type)
    embed_full = (V - V // tp) * h * e_p          # the Replicate embedding gradient beyond the local rows
    phase = dict(loc.phase_peak_bytes)  # the local model's step, shifted by the TP layer's terms (estimate/step.py)
    fix = _no_o_bias(cfg, lcfg, spec)
    if fix:  # Qwen2: the local Llama config's o_proj bias is not there
        phase = step.shifted(phase, every=-(fix["params"] + fix["optimizer"]), after_backward=-fix["params"],
                             forward=-fix["autocast"], loss=-fix["autocast"])
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
        ce_point = (base + loc.activations_bytes + d["log_softmax"] - (8 * b * s if resolved_loss(family_of(cfg), spec) == "labels" else 0)
                    + full["ce_grads"])
        phase = step.shifted(phase, forward=d["logits"] + head_local + full["logits"],
                             loss=d["logits"] + d["fp32_copy"] + d["log_softmax"], backward_at_least=(ce_point,))
        terms.append({"name": "whole-vocabulary logits and loss tensors (head all-gathered)",
                      "formula": "b*s*(V - V/tp)*(e_m [+4] + e_ce ...)", "bytes": d["logits"] + d["fp32_copy"] + d["log_softmax"]})
    # The embedding's backward is the last: every gradient exists, the embedding's whole.
    phase = step.shifted(phase, after_backward=embed_full, backward_at_least=(base + loc.grads_bytes + embed_full,))
    if pspec.sequence_parallel:  # torchtitan's SequenceParallel on the norms (tensor_parallel.sp_phase_delta)
        from .tensor_parallel import sp_phase_delta

        sp = sp_phase_delta(cfg, spec, pspec)
        phase = {k: v + sp.get(k, 0) for k, v in phase.items()}
        terms.append({"name": "sequence parallel: norms' saved tensors (or the checkpoint stash) /tp, final norm "
                              "output b*s/tp*h", "formula": "sp_phase_delta", "bytes": sp["backward"]})
    phase = step.shifted(phase, every=mesh)
    pk = step.peak(phase)[0]
    n = pspec.world_size
    group = {"first_rank": 0, "last_rank": n - 1, "count": n, "peak_bytes": phase[pk], "peak_phase": pk,
             "phase_peak_bytes": phase, "optimizer_bytes": loc.optimizer_bytes}
    notes = [f"tensor parallel over {tp} ranks (torchtitan's plan: q/k/v, gate/up Colwise; o, down Rowwise; "
             f"embedding Rowwise, head Colwise{' with loss parallel' if pspec.loss_parallel else ', all-gathered'}"
             f"{'; SequenceParallel on the norms' if pspec.sequence_parallel else ''}); "
             "every rank holds the same shapes."]
    return DistEstimate(
        world_size=n, parallel=asdict(pspec), peak_bytes=phase[pk], peak_phase=pk, peak_rank=0,
        phase_peak_bytes=phase, params_bytes=loc.params_bytes, buffers_bytes=loc.buffers_bytes,
        inputs_bytes=loc.inputs_bytes, grads_bytes=loc.grads_bytes + embed_full, optimizer_bytes=loc.optimizer_bytes,
        activations_bytes=loc.activations_bytes, comm_buffers_bytes=0, host_bytes=0, rank_groups=[group],
        single_device=_single(single), reference=reference_formulas(cfg, spec, pspec), terms=terms, notes=notes)


def estimate_fsdp_tp(cfg: ModelConfig, spec, pspec):
    """Per-rank peak of `--parallel fsdp+tp` (2-D mesh dp x tp): FSDP2's schedule (planner.estimate.distributed,
    every block and the root fully_shard-ed on the dp dimension) over each rank's TP-local model (local_config:
    FSDP2 chunks the DTensor's local tensor on dim 0 over dp, _fsdp_param.py _init_sharding_spec_tp), with the
    TP layer's whole-vocabulary loss (_tp_loss_extra) and the 2-D mesh's rank map (4*N B on the CPU). The
    embedding's Replicate gradient (estimate_tp) is reduce-scattered by FSDP2 into its sharded gradient like
    any other: measured, it adds nothing after the backward."""
    from .tensor_parallel import _no_o_bias, _tp_loss_extra, local_config

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
    est = _estimate_fsdp(lcfg, spec, fsdp, estimate_training(lcfg, spec, forward_points=False), tp_extra=extra)
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
    est.parallel = asdict(pspec)
    est.rank_groups = _expand_groups(est.rank_groups, pspec)
    est.single_device = _single_of(cfg, spec)
    est.notes.insert(0, f"FSDP2 x{dp} (dp) over tensor parallel x{pspec.tp_degree} (torchtitan's plan); FSDP2's figures "
                        "below are those of each rank's TP-local model.")
    return est


def _single_of(cfg, spec) -> dict:
    return _single(estimate_training(cfg, spec))


def _expand_groups(groups: list[dict], pspec) -> list[dict]:
    """FSDP2's rank groups are dp indices; the global rank is dp_index * tp + tp_index (tp innermost)."""
    tp = pspec.tp_degree
    return [{**g, "first_rank": g["first_rank"] * tp, "last_rank": g["last_rank"] * tp + tp - 1,
             "count": g["count"] * tp} for g in groups]
