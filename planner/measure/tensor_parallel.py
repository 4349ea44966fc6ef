"""Tensor parallelism of a transformers decoder, as torchtitan applies it to Llama (child side, torch).

torchtitan's plan (torchtitan/models/llama3/infra/parallelize.py apply_tp), on transformers' names:
  model.embed_tokens          RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()): the
                              vocabulary rows sharded, each rank looks up its own rows (a _MaskPartial
                              output), all-reduced into the full embeddings
  layers.*.self_attn.q/k/v    ColwiseParallel(): output features (heads) sharded; each rank runs its own
                              heads (transformers reshapes with view(..., -1, head_dim))
  layers.*.self_attn.o_proj   RowwiseParallel(): input features sharded, the partial sums all-reduced
  layers.*.mlp.gate/up_proj   ColwiseParallel()
  layers.*.mlp.down_proj      RowwiseParallel()
  lm_head                     ColwiseParallel(output_layouts=Replicate()), or with loss parallel
                              ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) and the
                              cross-entropy under torch.distributed.tensor.parallel.loss_parallel()
Norms stay replicated (plain tensors) unless --sequence-parallel: then torchtitan's whole plan (sp_plan) shards
the residual stream on the sequence (SequenceParallel on the norms, PrepareModuleInput Shard(1) -> Replicate on
attention and MLP, o/down RowwiseParallel(output_layouts=Shard(1)), the embedding's output Shard(1), the head
ColwiseParallel(input_layouts=Shard(1))). Measured on 2 gloo ranks, its loss and gradients equal the unsharded
model's (to 2e-9). Off by default here (torchtitan applies it by default) so plain-TP figures keep their values.
The block plan without it is the one transformers' own `base_model_tp_plan` uses (colwise q/k/v/gate/up, rowwise
o/down), with torchtitan's vocabulary-parallel embedding and head.

With FSDP on a 2-D mesh (dp, tp) the TP plan goes first, then fully_shard(mesh=mesh["dp"]) on every
block and the root, as torchtitan does.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


def make_tp_mesh(pspec, device: torch.device):
    from torch.distributed.device_mesh import init_device_mesh

    if pspec.parallel == "tp":
        return init_device_mesh(device.type, (pspec.world_size,), mesh_dim_names=("tp",))
    mesh = init_device_mesh(device.type, (pspec.world_size // pspec.tp, pspec.tp), mesh_dim_names=("dp", "tp"))
    # The 1-D meshes, sliced here, outside any FakeTensorMode (see submesh)
    mesh._planner_submeshes = {name: mesh[name] for name in ("dp", "tp")}
    return mesh


def tp_plan(model: torch.nn.Module, loss_parallel: bool, sequence_parallel: bool = False) -> dict:
    if sequence_parallel:
        return sp_plan(model, loss_parallel)
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    base = getattr(model, model.base_model_prefix)
    prefix = model.base_model_prefix
    plan = {f"{prefix}.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                       use_local_output=not loss_parallel)}
    for i, _ in enumerate(base.layers):
        p = f"{prefix}.layers.{i}"
        plan.update({f"{p}.self_attn.q_proj": ColwiseParallel(), f"{p}.self_attn.k_proj": ColwiseParallel(),
                     f"{p}.self_attn.v_proj": ColwiseParallel(), f"{p}.self_attn.o_proj": RowwiseParallel(),
                     f"{p}.mlp.gate_proj": ColwiseParallel(), f"{p}.mlp.up_proj": ColwiseParallel(),
                     f"{p}.mlp.down_proj": RowwiseParallel()})
    return plan


def sp_plan(model: torch.nn.Module, loss_parallel: bool) -> dict:
    """torchtitan's apply_tp as it is (torchtitan/models/llama3/infra/parallelize.py, sequence parallel on): the
    residual stream sharded on the sequence (Shard(1)) between blocks; SequenceParallel on the attention / MLP
    norms and the final norm; PrepareModuleInput Shard(1) -> Replicate on attention (transformers passes
    hidden_states by keyword) and on the MLP; o/down RowwiseParallel(output_layouts=Shard(1)); the embedding
    RowwiseParallel(output_layouts=Shard(1)); the head ColwiseParallel(input_layouts=Shard(1)). Departure: the
    embedding's and o/down's outputs stay DTensors (use_local_output=False) because transformers reads the
    sequence length off the embeddings for its RoPE positions and causal mask (a local tensor would give the
    rank's s/tp)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    base = getattr(model, model.base_model_prefix)
    prefix = model.base_model_prefix
    plan = {f"{prefix}.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                                      use_local_output=False),
            f"{prefix}.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                       use_local_output=not loss_parallel)}
    for i, _ in enumerate(base.layers):
        p = f"{prefix}.layers.{i}"
        plan.update({
            f"{p}.input_layernorm": SequenceParallel(),
            f"{p}.self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                 desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            f"{p}.self_attn.q_proj": ColwiseParallel(), f"{p}.self_attn.k_proj": ColwiseParallel(),
            f"{p}.self_attn.v_proj": ColwiseParallel(),
            f"{p}.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            f"{p}.post_attention_layernorm": SequenceParallel(),
            f"{p}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            f"{p}.mlp.gate_proj": ColwiseParallel(), f"{p}.mlp.up_proj": ColwiseParallel(),
            f"{p}.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})
    return plan


def apply_tp(model: torch.nn.Module, tp_mesh, loss_parallel: bool, sequence_parallel: bool = False) -> torch.nn.Module:
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, tp_mesh, tp_plan(model, loss_parallel, sequence_parallel))


def submesh(mesh, name: str):
    """mesh[name] as make_tp_mesh sliced it: slicing computes this rank's coordinates with
    `(mesh == rank).nonzero()` (torch/distributed/device_mesh.py _compute_coordinates_from_mesh), which inside
    the simulation's FakeTensorMode finds no coordinate (measured: get_coordinate() None), so DTensor takes
    the rank for one outside the mesh and gives it empty shards."""
    pre = getattr(mesh, "_planner_submeshes", None)
    return pre[name] if pre else mesh[name]


def wrap_tp(model: torch.nn.Module, pspec, mesh, blocks: list | None = None) -> torch.nn.Module:
    """TP on the "tp" mesh dimension; with fsdp+tp, then FSDP2 on "dp" (every block of `blocks`, the decoder's
    repeated blocks as planner.measure.distributed.transformer_blocks finds them, then the root)."""
    apply_tp(model, submesh(mesh, "tp") if pspec.parallel == "fsdp+tp" else mesh, pspec.loss_parallel,
             getattr(pspec, "sequence_parallel", False))
    if pspec.parallel == "fsdp+tp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from ..models import TORCH_DTYPES

        dp = submesh(mesh, "dp")
        mp = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES.get(pspec.mp_param_dtype),
                                  reduce_dtype=TORCH_DTYPES.get(pspec.mp_reduce_dtype))
        for block in blocks or []:
            fully_shard(block, mesh=dp, reshard_after_forward=pspec.reshard_after_forward, mp_policy=mp)
        fully_shard(model, mesh=dp, reshard_after_forward=pspec.reshard_after_forward, mp_policy=mp)
    return model


@contextmanager
def maybe_loss_parallel(on: bool):
    if not on:
        yield
        return
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        yield


def with_loss_parallel(step) -> None:
    """The whole step (forward, loss, backward) under loss_parallel(), as torch asks (tensor/parallel/loss.py:
    the backward must run inside it too)."""
    run = step.run

    def run_in_context(*args, **kwargs):
        with maybe_loss_parallel(True):
            return run(*args, **kwargs)

    step.run = run_in_context
