"""The checkpointing policies' real code (planner/checkpointing.py says what each is and whom it follows)."""
from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..checkpointing import every_k

# torchtitan's _save_list (torchtitan/models/llama3/infra/parallelize.py), with the CPU's fused attention kernel
# added beside the CUDA ones (SDPA runs _scaled_dot_product_flash_attention_for_cpu on the CPU). On CUDA, SDPA runs
# cuDNN attention for bf16 / fp16 and the math kernel for fp32 with enable_gqa (measured on an H200), neither in this
# list: their outputs are recomputed (the estimate follows: planner/arch/decoder.py attention_op). torchtitan's later
# list (torchtitan/distributed/activation_checkpoint.py _op_sac_save_list) adds _scaled_dot_product_cudnn_attention and
# _scaled_dot_product_attention_math; adding them here changes what a CUDA run keeps (and needs a GPU re-measure).
_SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten.abs.default,
    torch.ops.aten.max.default,
}


def _torchtitan_policy():
    """torchtitan's _custom_policy: save the outputs of the ops in _SAVE, except every second mm (counted
    separately in the forward and in the recompute), and recompute everything else."""
    meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        save = func in _SAVE and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_context_fn():
    return create_selective_checkpoint_contexts(_torchtitan_policy())


def enable_policy(family, model, policy: str) -> None:
    """Checkpointing with `policy` ("full" is the family's own enable_checkpointing)."""
    if policy == "full":
        family.enable_checkpointing(model)
        return
    kwargs = {"use_reentrant": False}
    if policy == "selective":
        kwargs["context_fn"] = selective_context_fn
    if family.source == "book":  # planner/models/gpt2.py GPTModel: the same rule as transformers'
        model.gradient_checkpointing = True
        model.checkpoint_every = every_k(policy)
        model.checkpoint_kwargs = {k: v for k, v in kwargs.items() if k != "use_reentrant"}
        return
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every_k(policy))
