"""`--offload-activations` with fine-tuning (LoRA, --train-layers, QLoRA nf4 / fp4; issue #24; no torch): the pieces
planner/estimate/offload_act.py takes where a fine-tuned step differs from full training's.

  host    the block walk's host view (planner/arch/saved.py: one copy per saved variable, by what needs grad: a
          frozen prefix saves nothing, a frozen Linear its weight when its input needs grad, an adapter its input,
          lora_A's output and its weights): finetune_host_terms
  device  autocast caches the trainable leaves' copies only (ft_cache; a frozen weight's copy is fresh at its
          matmul, saved and freed with it), so the family's "not made yet" copies are the trainable ones
          (ft_pending); a frozen head's copy is fresh at the head (ft_head_trains); a tied head accumulates only
          where the embedding trains (ft_embed_trains); the backward is the fine-tuning sweep with the saved sets
          on the host (ft_sweep)
Measured: every dense RMSNorm decoder family, LoRA q,v / all-linear, last:1, QLoRA nf4; fp32 and bf16-AMP;
checkpointing off and on (bench/offload_act.py finetune_rows; tests/test_offload_finetune.py); in
combination, --grad-accum 2 (a later micro-batch: ft_sweep's grads_exist), --checkpointing every:2 / selective
(_policy_sweep; every:K's host copies in planner/arch/decoder.py offload_walk) and --offload-optimizer (planner/
estimate/offload.py over the trainable tensors) (bench/offload_act.py finetune_mix_rows; tests/
test_offload_finetune_mix.py). The MoE families and GPT-2 are refused (check_offload_finetune; planner/arch/moe.py
offload_finetune).
"""
from __future__ import annotations

from ..accounting import tensor_inventory
from ..arch import family_of
from ..arch.terms import Widths
from ..checkpointing import checkpointed_blocks, policy_of
from ..validation import ConfigError


def check_offload_finetune(cfg, spec) -> None:
    """Fine-tuning (LoRA, a trainable subset) is modelled where the block walk's host view is measured."""
    family = family_of(cfg)
    if spec.quantize_base not in ("none", "nf4", "fp4"):
        raise ConfigError(f"--offload-activations with --quantize-base {spec.quantize_base} is not modelled (QLoRA's "
                          "nf4 / fp4 are)")
    if not hasattr(family, "offload_walk") or not getattr(family, "offload_finetune", False):
        raise ConfigError(f"--offload-activations with fine-tuning is not modelled for the {family.arch} family "
                          "(measured for the dense RMSNorm decoders: Llama, Mistral, Qwen 2, Qwen 3, Phi-3, Gemma, "
                          "Gemma 2)")


def finetune_host_terms(cfg, spec) -> list:
    """Fine-tuning's host copies (LoRA, a trainable subset): the family's offload_walk (planner/arch/decoder.py) with
    the trainable names and the LoRA-wrapped linears (measured: a saved_tensors_hooks inventory of transformers'
    Llama / Qwen 3 / Gemma 2 with peft 0.21, fp32 and bf16-AMP, and the pack hook's bytes: tests/
    test_offload_finetune.py)."""
    from ..finetune import adapted_linears, trainable_names

    from .quantized import fp32_twin

    family = family_of(cfg)
    quantized = spec.quantize_base != "none"
    if quantized:  # QLoRA: the fp32 twin's walk, the quantized Linears' weights never reaching the hook
        spec = fp32_twin(spec)
    w = Widths.of(spec, loss_upcast=family.loss_upcast(cfg, spec))
    keep = trainable_names(family, cfg, spec)
    trains = {t.name for t in tensor_inventory(cfg) if t.kind == "param"} if keep is None else keep
    adapted = {lin.module: lin for lin in adapted_linears(family, cfg, spec)}
    return family.offload_walk(cfg, spec, w, trains, adapted, quantized)


def ft_embed_trains(cfg, spec) -> bool:
    """Whether the token embedding (a tied head's weight) trains."""
    from ..finetune import trainable_names

    keep = trainable_names(family_of(cfg), cfg, spec)
    return any(keep is None or t.name in keep for t in tensor_inventory(cfg) if t.kind == "param" and t.role == "embed")


def ft_head_trains(cfg, spec) -> bool:
    """Whether the output head trains (its autocast copy is then cached, not fresh at its matmul)."""
    from ..finetune import trainable_names

    family = family_of(cfg)
    keep = trainable_names(family, cfg, spec)
    return any(keep is None or t.name in keep for t in tensor_inventory(cfg) if t.kind == "param" and t.role == "head")


def ft_last_adapted(cfg, spec) -> set:
    """The short names of the last block's LoRA-wrapped linears (q_proj, gate_up_proj, ...)."""
    from ..finetune import adapted_linears

    last = cfg.layers - 1
    return {lin.module.rsplit(".", 1)[1] for lin in adapted_linears(family_of(cfg), cfg, spec) if lin.block == last}


def ft_cache(cfg, spec, w) -> int:
    """Fine-tuning under autocast: the cached e_m copies of every trainable autocast leaf (planner/estimate/
    finetune.py autocast_cache_bytes with nothing saved: the saved copies are host copies here)."""
    from .finetune import autocast_cache_bytes

    return autocast_cache_bytes(cfg, spec, w, [])


def ft_pending(cfg, spec, w) -> tuple[int, int]:
    """The trainable autocast copies not made yet at the last block's attention (its o_proj's, its MLP's and the
    head's) and at its MLP's product (its down_proj's and the head's): (attention, MLP)."""
    from ..finetune import adapted_linears, trainable_names

    if not w.amp:
        return 0, 0
    family = family_of(cfg)
    keep = trainable_names(family, cfg, spec)
    last = cfg.layers - 1

    def of(roles: tuple, block) -> int:
        n = sum(t.numel for t in tensor_inventory(cfg) if t.kind == "param" and t.autocast and not t.is_bias
                and t.role in roles and t.block == block and (keep is None or t.name in keep))
        n += sum(spec.lora_r * (lin.n_in + lin.n_out) for lin in adapted_linears(family, cfg, spec)
                 if lin.role in roles and lin.block == block)
        return n * w.e_m

    head = of(("head",), None)
    return of(("attn.out", "mlp.in", "mlp.out"), last) + head, of(("mlp.out",), last) + head


def ft_policy_ops(cfg, spec, w, quantized: bool = False) -> list:
    """The block's ops as torchtitan's selective policy sees them under fine-tuning (LoRA's adapter matmuls among
    them: planner/estimate/finetune.py policy_ops; quantized: QLoRA's fp32 twin, its base linears bitsandbytes'
    gemm_4bit, neither saved nor counted among the mms)."""
    from .finetune import policy_ops

    return policy_ops(cfg, spec, w, quantized)


LATER = "later micro-batch: "  # planner/estimate/finetune.py estimate_finetune's key for a later micro-batch's points


def _zeroed():
    """A term with its bytes 0 (dataclasses.replace), made once per Term object: the blocks that walk alike share
    their Term objects (planner/estimate/finetune.py block_saved's memo), and a replace costs ~10 us. The memo
    lives for one call, while the terms it is keyed by (their id) are alive."""
    import dataclasses as dc

    made: dict = {}

    def zeroed(t):
        z = made.get(id(t))
        if z is None:
            z = made[id(t)] = dc.replace(t, bytes=0)
        return z

    return zeroed


def ft_sweep(cfg, spec, w, est, grads_exist: bool = False, quantized: bool = False) -> dict[str, int]:
    """Fine-tuning's backward points with the saved tensors on the host. Without checkpointing: the fine-tuning
    sweep (planner/estimate/finetune.py _sweep) with every saved set emptied, so each point is what the backward
    holds beyond the saved tensors (the grads made, the residual's grad, the node's own temporaries; the CPU
    backward reads the host copies in place; measured: every fine-tuning row of `bench offload-activations`, the
    backward phase within 0.01% where it is not the peak's phase too). With checkpointing: below. grads_exist: a
    later micro-batch of --grad-accum (every trainable .grad alive, counted by the caller: the fine-tuning sweep's
    own grads_exist, planner/estimate/finetune.py _sweep, whose new grads are added in place). quantized: QLoRA's
    fp32 twin (its selective policy's ops)."""
    import dataclasses as dc

    from .finetune import _sweep, finetune_activations, trainable_params

    bsh = spec.batch_size * spec.seq_len * cfg.hidden
    policy = policy_of(spec)
    if spec.checkpointing and policy == "full":
        # the recompute runs outside save_on_cpu (its saved set on the device); each stashed block input is a
        # host copy: block i's point counts blocks 0..i's, of which block 0's is the embedding's output, a leaf
        # AccumulateGrad holds on the device (offload_act's held terms; measured: Llama V1000 h64 b2 s64 last:1
        # fp32, block 0's gated product backward). A later micro-batch: the plain estimate's own later points
        # (estimate_finetune, LATER), less the grads it adds to them (the caller adds them)
        accum = est.grads_bytes if spec.grad_accum > 1 else 0
        got = ({k[len(LATER):]: v - accum for k, v in est.backward_points.items() if k.startswith(LATER)}
               if grads_exist else {k: v for k, v in est.backward_points.items() if not k.startswith(LATER)})
        return {k: v - (int(k.split()[1]) * bsh * w.e_r if k.startswith("block ") else 0) for k, v in got.items()}
    plain = dc.replace(spec, offload_activations=False)
    terms, ce_saved, per_block = finetune_activations(cfg, plain, w, quantized)
    if spec.checkpointing:
        return _policy_sweep(cfg, plain, w, terms, ce_saved, per_block, grads_exist, quantized)
    zeroed = _zeroed()
    zero = [zeroed(t) for t in terms]
    blocks = [[zeroed(t) for t in blk] for blk in per_block]
    return _sweep(cfg, plain, w, zero, blocks, 0, trainable_params(cfg, plain), grads_exist=grads_exist)


def _policy_sweep(cfg, spec, w, terms, ce_saved, per_block, grads_exist: bool, quantized: bool) -> dict[str, int]:
    """Fine-tuning's backward points under every:K or selective with the saved tensors on the host: the fine-tuning
    sweep of the policy (planner/estimate/finetune.py _sweep, policy_kept) with what save_on_cpu moved taken off.
    A block not checkpointed (every:K) saved through save_on_cpu's hook: its saved set is on the host, so its points
    are the sweep's with that set emptied and the blocks below hold nothing of it (their kept sets emptied too). A
    checkpointed block's recompute runs outside save_on_cpu (its saved set on the device) and its stashed input is
    a host copy: block i's points less the stashed inputs of the checkpointed blocks below it, as under full
    checkpointing (ft_sweep). Under selective the policy's cached outputs are the checkpoint's own storage (not a
    saved-tensor hook): they stay on the device, in the sweep's kept sets (measured: every dense RMSNorm decoder's
    grid shape, LoRA r8 / last:1, fp32 and bf16-AMP, every:2 and selective, bench/offload_act.py
    finetune_mix_rows)."""
    from .finetune import _sweep, trainable_params

    b, s, L = spec.batch_size, spec.seq_len, cfg.layers
    ckpt = set(checkpointed_blocks(spec.checkpoint_policy, L))
    zeroed = _zeroed()
    blocks = [blk if i in ckpt else [zeroed(t) for t in blk] for i, blk in enumerate(per_block)]
    # the saved sets of the blocks not checkpointed are among the terms the loss's point counts: on the host here
    moved = sum(t.bytes for i, blk in enumerate(per_block) if i not in ckpt for t in blk)
    a_before_loss = sum(t.bytes for t in terms) - ce_saved - moved
    got = _sweep(cfg, spec, w, terms, blocks, a_before_loss, trainable_params(cfg, spec), grads_exist=grads_exist,
                 quantized=quantized)
    stash = b * s * cfg.hidden * w.e_r

    def below(k: str) -> int:
        return sum(1 for j in ckpt if j < int(k.split()[1])) if k.startswith("block ") else 0

    return {k: v - below(k) * stash for k, v in got.items()}
