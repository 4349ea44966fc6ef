"""`--offload-activations`: the forward and loss under `torch.autograd.graph.save_on_cpu(pin_memory=True)` (issue #24;
no torch). Two figures, two budgets:

  host    every tensor autograd saves is copied to a fresh host tensor by save_on_cpu's pack hook
          (torch/autograd/graph.py: `torch.empty(tensor.size(), ..., pin_memory=is_pinnable)` + `copy_`), one copy per
          saved variable: a tensor two nodes save is copied twice and a matmul's weight (its t() view, or autocast's
          low-precision copy) is copied too, so the host holds more than the deduplicated activations. The family
          lists the copies (planner/arch/<family>.py `offload_copies`); their sum is the host's peak (all alive at
          the end of the loss). On CUDA pinned memory comes from PyTorch's CachingHostAllocator, which rounds each
          request up to a power of two (aten/src/ATen/core/CachingHostAllocator.h): `host_pinned_rounded` says how
          much that adds; the CPU mechanism measured here has no pinning (is_pinnable needs CUDA). Against the
          H200 record (tests/data/cuda/2026-11-27-h200, pinned_host allocated_bytes.peak per row) it is a rough
          figure, -54%..+14%: it rounds each Term, where a Term can sum several saved tensors that are each their
          own pinned block (Qwen 2 / Qwen 3 V1000 h64 b2 s64 fp32 checkpointed: per tensor 1,510,660 B against
          1,510,661 measured, per Term 1,573,888), and the allocator counts a freed block until the event of its
          non_blocking H2D copy is processed, so other rows' peaks hold blocks of an earlier step too (Mistral /
          Gemma at the same shape: 1,937,159 B).
  device  the step without the saved activations: what the device still holds is the persistent state, autocast's
          cached weight copies (alive until the autocast region exits), the tensors alive but not saved
          (transformers' KV cache, the last hidden state and the labels while the loss runs inside the model), and
          the working set of the moment: the logits, their fp32 copy and the log-softmax output in the loss; the
          two b*s*V gradients at the start of backward, then the grads and one block's gradients.

On a CPU device the pack hook still copies (pin_memory=True; with pin_memory=False `tensor.cpu()` returns the CPU
tensor itself and nothing moves) and the unpack hook's `packed.to("cpu")` returns the host copy itself, so backward
reads the copies in place. On CUDA the unpack hook makes a device copy of each saved tensor for its node's backward
(a transient of one node's saved inputs that the CPU run cannot show). Modelled on CUDA (measured on an H200,
tests/data/cuda/2026-11-27-h200, the backward phase to the byte on every family's bf16-AMP and fp32 rows but the fp32
GQA ones): the log-softmax output's copy at the loss backward (b*s*V*e_ce) and, under checkpointing, the current
block's input copy through its recompute and backward (b*s*h*e_r). Not yet: the copies of a block's own saved
tensors at its nodes without checkpointing (the backward phase low by 393,232 B on Mixtral V1000 h64 b2 s64 fp32 and
bf16-AMP, by 73,736 B and 147,464 B on Llama V300 h48 b2 s32 / V200 h96 b1 s64 fp32 under SDPA's math kernel, by
24,584 B on Llama V200 h96 b1 s64 bf16-AMP; each below the step's peak on the recorded grid, the optimizer's).
Checkpointing: checkpoint's own hooks are innermost in a checkpointed block, so save_on_cpu sees only each block's
input (and the tensors outside the blocks); the recompute in backward runs outside save_on_cpu and stays on the
device.
Fine-tuning (LoRA, --train-layers): planner/estimate/offload_ft.py (the walk's host view, autocast's cache of the
trainable copies, the fine-tuning sweep); QLoRA its fp32 twin's offloaded step (offload_qlora, as
planner/estimate/quantized.py). With --grad-accum, every:K / selective and --offload-optimizer too: the fine-tuning
sweep's own later micro-batch and policies with the saved sets on the host (offload_ft.py ft_sweep, _policy_sweep).
Gradient accumulation (--grad-accum N): each micro-batch's backward frees its host copies, so the host holds one
micro-batch's; a later micro-batch's forward, loss and backward run with every .grad alive (measured: Llama, Gemma 2,
Qwen 3 tiny, fp32 and bf16-AMP, checkpointing off and on).
Checkpointing policies (planner/checkpointing.py): under every:K a block not checkpointed saves through save_on_cpu's
hook (its saved set is copied to the host, its backward reads the copies: no recompute), a checkpointed one its input;
under selective the policy's kept outputs are held by the checkpoint's own cache on the device, the host holds each
block's input as under full (host_terms; measured, the same configs); with --grad-accum too (a later micro-batch's
points with every grad alive).
--offload-optimizer beside it: planner/estimate/offload.py takes the offloaded parameters' states off this step's
device phases; the host holds both (the optimizer's copies and states all step, these copies up to the loss).
"""
from __future__ import annotations

import dataclasses

from ..accounting import DTYPE_BYTES, tensor_inventory
from ..arch import family_of
from ..arch.base import resolved_loss
from ..arch.terms import Widths
from ..checkpointing import checkpointed_blocks, every_k, policy_of, selective_saved
from ..losses import cuda_amp_cross_entropy
from ..validation import ConfigError
from . import step
from .offload_ft import (check_offload_finetune, ft_last_adapted, ft_policy_ops, finetune_host_terms, ft_cache, ft_embed_trains,
                         ft_head_trains, ft_pending, ft_sweep)

DEVICE_NOTE = "device figure: for the CUDA check"
# PCIe x16 bandwidth per direction, NVIDIA's published figures: Gen4 x16 32 GB/s and Gen5 x16 64 GB/s (H100 PCIe
# product brief: "PCIe Gen5 128 GB/s" bidirectional; A100: "PCIe Gen4 64 GB/s" bidirectional). The copy time
# below uses Gen4's 32 GB/s each way, the common host link.
PCIE_GEN4_X16_BYTES_PER_S = 32e9


def check_offload_activations(cfg, spec) -> None:
    """One line for the combinations not modelled."""
    if spec.finetuning:
        check_offload_finetune(cfg, spec)
    if policy_of(spec) == "selective" and family_of(cfg).selective_ops(cfg, spec, Widths.of(spec)) is None:
        raise ConfigError(f"selective checkpointing is not modelled for the {family_of(cfg).name} family")
    if spec.precision not in ("fp32", "bf16-amp", "bf16"):
        raise ConfigError(f"--offload-activations is modelled for fp32, bf16 and bf16-amp, not {spec.precision}")
    family = family_of(cfg)
    w = Widths.of(spec, loss_upcast=family.loss_upcast(cfg, spec))
    why = family.offload_why_not(cfg, spec) if hasattr(family, "offload_why_not") else None
    if why:
        raise ConfigError(why)
    if family.offload_copies(cfg, spec, w) is None:
        raise ConfigError(f"--offload-activations is not modelled for {family.arch} with this configuration (measured "
                          "for the RMSNorm decoders with SiLU or an aten GELU, GPT-2, the book's GPT-2 and the MoE "
                          "families; see planner/arch/<family>.py offload_copies)")
    if not family.offload_combinations and (spec.grad_accum > 1 or policy_of(spec) != "full"
                                            or getattr(spec, "offload_optimizer", False)):
        # (measured on the RMSNorm decoders; a family with its own backward points is measured for one
        # micro-batch under full checkpointing or none, without --offload-optimizer: planner/arch/base.py)
        raise ConfigError(f"--offload-activations for {family.arch} is modelled with one micro-batch, full "
                          "checkpointing or none, and the optimizer on the device (not --grad-accum > 1, "
                          "every:K / selective or --offload-optimizer with it yet)")
    if resolved_loss(family, spec) != family.default_loss:
        raise ConfigError("--offload-activations is modelled with the model's own loss (--loss default: "
                          f"{family.default_loss}), not {spec.loss}")


def host_terms(cfg, spec) -> list:
    """The family's copies, each Term's bytes times the blocks it is one block's copy for: L, or under every:K the
    checkpointed blocks' input copies and the others' whole saved sets (their saves reach save_on_cpu's hook:
    measured, Llama / Qwen 3 / Gemma 2 tiny L2 every:2, fp32 and bf16-AMP, host bytes exact). Under selective the
    policy's kept outputs are held by the checkpoint's own cache (create_selective_checkpoint_contexts), not by
    saved-tensor hooks: the host holds each block's input only, as under full (measured, the same configs)."""
    if spec.finetuning:
        return finetune_host_terms(cfg, spec)
    family = family_of(cfg)
    w = Widths.of(spec, loss_upcast=family.loss_upcast(cfg, spec))
    L = cfg.layers
    policy = policy_of(spec)
    if policy in ("full", "selective"):
        return [dataclasses.replace(t, bytes=t.bytes * (L if t.per_layer else 1), per_layer=False)
                for t in family.offload_copies(cfg, spec, w)]
    n_ckpt = len(checkpointed_blocks(policy, L))
    none = dataclasses.replace(spec, checkpointing=False, checkpoint_policy="full")
    ckpt = [dataclasses.replace(t, bytes=t.bytes * n_ckpt, per_layer=False,
                                name=f"{t.name} ({n_ckpt} checkpointed blocks)")
            for t in family.offload_copies(cfg, spec, w) if t.per_layer]
    return ckpt + [dataclasses.replace(t, bytes=t.bytes * (L - n_ckpt), per_layer=False,
                                       name=f"{t.name} ({L - n_ckpt} blocks not checkpointed)") if t.per_layer else t
                   for t in family.offload_copies(cfg, none, w)]


def offload_qlora(cfg, spec, offloaded):
    """QLoRA under --offload-activations, as planner/estimate/quantized.py builds QLoRA from its fp32 twin: the twin's
    offloaded step (`offloaded(twin)`) less the weights the quantization saves in every phase, with the dequantized
    weights' backward points (quantized.dequant_points) on the offloaded twin's sweep, and the host copies of the
    twin's walk without the quantized Linears' weights (MatMul4Bit keeps its packed weight on ctx: finetune_host_terms)."""
    from .quantized import dequant_points, fp32_twin, weights_delta

    twin = offloaded(fp32_twin(spec))
    delta = weights_delta(cfg, spec)
    base = twin.params_bytes + twin.buffers_bytes + twin.inputs_bytes + twin.optimizer_bytes
    points = dequant_points(cfg, spec, twin)
    phase = step.shifted(twin.phase_peak_bytes, backward_at_least=(base + max(points.values(), default=0),))
    phase = step.shifted(phase, every=-delta)
    peak_phase = step.peak(phase)[0]
    hterms = host_terms(cfg, spec)
    host = sum(t.bytes for t in hterms)
    twin_host = twin.transients["host_activation_offload"]
    transients = {**twin.transients, "host_activation_offload": host}
    if "host_pinned_rounded" in transients:
        transients["host_pinned_rounded"] = sum(pow2_ceil(t.bytes) for t in hterms)
    terms = [t for t in twin.terms if t.get("where") != "host"] + [
        {"name": t.name + " (host)", "formula": t.formula, "bytes": t.bytes, "per_layer": False, "where": "host",
         "part": ""} for t in hterms]
    notes = [f"QLoRA: {spec.quantize_base} base (bitsandbytes), the fp32 twin's offloaded step less {delta:,} B of "
             "weights; the quantized linears' packed weights are not saved tensors (no host copy)"] + [
        n.replace(f"{twin_host:,} B", f"{host:,} B") for n in twin.notes]
    return dataclasses.replace(twin, params_bytes=twin.params_bytes - delta, peak_bytes=phase[peak_phase],
                               peak_phase=peak_phase, phase_peak_bytes=phase, terms=terms, notes=notes,
                               transients=transients, backward_points={**twin.backward_points, **points})


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def copy_seconds(host: int, bytes_per_s: float = PCIE_GEN4_X16_BYTES_PER_S) -> float:
    """Each byte crosses twice a step (device to host in forward, back in backward): 2 * host / bandwidth."""
    return 2 * host / bytes_per_s


def forward_alive(cfg, spec, w) -> tuple[int, int, int, dict[str, int]]:
    """The forward's device tensors that are alive but not saved, so on the device whatever the saved-tensor hooks
    do (with every saved tensor on the host they are the whole forward inside the blocks; without offloading the
    plain step adds its device-held saved tensors: planner/estimate/training.py forward_block_points):
    the family's KV cache (off under checkpointing), what every checkpointed block is given (RoPE's cos and sin,
    and the other keyword inputs, parts.checkpoint_inputs: position_ids, the additive mask under eager attention,
    Gemma 2's second sliding-window mask: the family's "kept" terms), the forward's MLP high point in the last
    block and the family's other points inside it (eager attention's s x s scores, RoPE, SDPA:
    planner/arch/<family>.py offload_alive / offload_forward_points). Returns (cache, held, mlp point, points)."""
    family = family_of(cfg)
    fwd_alive, held, mlp_point = family.offload_alive(cfg, spec, w)
    held += sum(t.bytes for t in family.outside_terms(cfg, spec, w) if t.where == "kept")
    points = family.offload_forward_points(cfg, spec, w) if hasattr(family, "offload_forward_points") else {}
    return fwd_alive, held, mlp_point, dict(points)


def estimate_offload_activations(cfg, spec, estimate_training, backward_sweep, autocast_weight_bytes,
                                 autocast_bias_bytes, later_sweep_points, quantized: bool = False):
    """The device and host figures; the functions are planner.estimate.training's (passed in: no import back up).
    quantized: QLoRA's fp32 twin (offload_qlora), whose selective policy sees the quantized base's custom ops
    (planner/estimate/finetune.py policy_ops)."""
    check_offload_activations(cfg, spec)
    if spec.quantize_base != "none":
        return offload_qlora(cfg, spec, lambda twin: estimate_offload_activations(
            cfg, twin, estimate_training, backward_sweep, autocast_weight_bytes, autocast_bias_bytes, later_sweep_points,
            quantized=True))
    policy = policy_of(spec)
    # the step without offloading under full checkpointing (or none); a policy's own terms are added below
    plain = dataclasses.replace(spec, offload_activations=False, checkpoint_policy="full")
    est = estimate_training(cfg, plain)
    family = family_of(cfg)
    w = Widths.of(spec, loss_upcast=family.loss_upcast(cfg, spec))
    b, s, h, V, L = spec.batch_size, spec.seq_len, cfg.hidden, cfg.vocab_size, cfg.layers
    bsV, bsh = b * s * V, b * s * h
    e_p = DTYPE_BYTES[spec.param_dtype]
    tr = est.transients
    base = est.params_bytes + est.buffers_bytes + est.inputs_bytes + est.optimizer_bytes + tr.get("gradscaler", 0)
    cuda = tr.get("allocator_rounding", 0) + tr.get("cublas_workspace", 0)  # 0 on the CPU
    # autocast's cache holds every matmul weight's low-precision copy until autocast exits (after the loss); under
    # fine-tuning only the trainable leaves' (the adapters', a trainable subset's): a frozen weight's copy is fresh
    # at each matmul, saved (a host copy) and freed with it
    ft = spec.finetuning
    amp_cache = (ft_cache(cfg, spec, w) if ft else autocast_weight_bytes(cfg, spec) + autocast_bias_bytes(cfg, spec))
    # Alive but not saved, so on the device whatever the hooks do (forward_alive)
    fwd_alive, rope_held, mlp_point, fam_points = forward_alive(cfg, spec, w)
    # fine-tuning under autocast: the family's points take the weight copies autocast has not made yet (o_proj's,
    # the MLP's, the head's) off a cache of every weight; here the cache holds the trainable ones only
    pend_all, pend_mlp = ft_pending(cfg, spec, w) if ft else (0, 0)
    if ft and w.amp and not spec.checkpointing:
        mlp_point += h * (cfg.intermediate_size + V) * w.e_m - pend_mlp
    if ft and hasattr(family, "offload_adapter_extra"):  # LoRA on the last block's MLP input (planner/arch/decoder.py)
        mlp_point += family.offload_adapter_extra(cfg, spec, w, ft_last_adapted(cfg, spec))
    # enable_input_require_grads (peft, or transformers' checkpointing enable) makes the embedding's output a leaf
    # that requires grad: the graph's AccumulateGrad node holds it on the device until backward reaches it (its
    # copy for block 0's checkpoint is a host copy besides); inside the model's forward the family's points count
    # it already (the model's inputs_embeds), after it (the head, the loss, backward) it is held here (measured:
    # Llama V1000 h64 b2 s64 LoRA and last:1, fp32 and bf16-AMP, b*s*h*e_r under on every phase before; Gemma 2
    # V1000 h64, the forward's attention point b*s*h*e_r over with it)
    leaf = bsh * w.e_r if ft and spec.checkpointing else 0
    labels = 8 * b * (s + 1)  # ForCausalLMLoss's padded labels, alive during the loss (training.py in_model_loss)
    ce_out = bsV * w.e_ce + w.e_ce  # log_softmax output, total_weight (alive in the loss)
    if cuda_amp_cross_entropy(spec, w, resolved_loss(family, spec)):
        # CUDA autocast's cross_entropy composite (planner/losses.py): log_softmax's e_m output and nll_loss's fp32
        # copy (measured on an H200, tests/data/cuda/2026-11-27-h200: the book's GPT-2 V1000 h64 a4 p0.1 b2 s64
        # bf16-AMP, the loss phase 2*b*s*V under without the copy, checkpointed or not)
        ce_out = bsV * (w.e_m + 4) + 4
    logits = bsV * w.e_m + tr.get("logits_fp32_copy", 0)
    # (the last hidden state, b*s*h*e_r, stays referenced while the loss runs inside the model's forward)
    if ft and w.amp:
        full = h * (cfg.num_attention_heads * cfg.head_dim + 3 * cfg.intermediate_size + V) * w.e_m
        fam_points = {k: v + full - pend_all for k, v in fam_points.items()}
    # the head: the final norm's output, under autocast its low-precision copy (lm_head's input), and the logits
    head = bsh * w.e_r + (bsh * w.e_m if w.amp else 0) + bsV * w.e_m
    if ft and w.amp and not ft_head_trains(cfg, spec):
        head += V * h * w.e_m  # a frozen head's fresh autocast copy, alive through its matmul
    forward = base + amp_cache + fwd_alive + rope_held + max([head + leaf, mlp_point,
                                                              *fam_points.values()])
    # alive beside the logits while the loss runs: transformers' loss inside the model holds the padded labels, their
    # shifted copy (8*b*s) and the last hidden state; a family whose loss runs outside its forward names its own
    # (offload_loss_held)
    held = (family.offload_loss_held(cfg, spec, w) if hasattr(family, "offload_loss_held")
            else labels + 8 * b * s + bsh * w.e_r)
    loss = base + amp_cache + fwd_alive + rope_held + leaf + held + logits + ce_out
    # Backward, start: cross-entropy's two b*s*V gradients (+ the 0-d loss gradient and grad_output: 2*e_ce)
    ce_start = tr.get("cross_entropy_grads", 0) + 2 * w.e_ce + rope_held + leaf
    # On CUDA the unpack hook (torch/autograd/graph.py save_on_cpu: `tensor.to(device, non_blocking=pin_memory)`)
    # brings each saved tensor back as a fresh device copy for its node's backward; _log_softmax_backward_data reads
    # its saved output (b*s*V*e_ce) beside the two gradients (on the CPU `.to("cpu")` returns the host copy itself):
    # measured on an H200, tests/data/cuda/2026-11-27-h200, the backward phase b*s*V*e_ce above the CPU device's
    unpacked_ce = bsV * w.e_ce if spec.device_type == "cuda" else 0
    ce_start += unpacked_ce

    def own(points: dict[str, int], ckpt: bool, grads_exist: bool = False) -> dict[str, int]:
        """The family's own backward points where the generic sweep does not hold (planner/arch/<family>.py
        offload_backward_points), for the blocks checkpointed (ckpt) or not; grads_exist: a later micro-batch
        (every .grad there, counted by the caller: the family's points count only the grads it holds apart and
        the new ones not yet added in place; passed only then, so a family measured for one micro-batch keeps
        its signature)."""
        if not hasattr(family, "offload_backward_points"):
            return points
        as_run = spec if ckpt == spec.checkpointing else dataclasses.replace(spec, checkpointing=ckpt,
                                                                             checkpoint_policy="full")
        later = {"grads_exist": True} if grads_exist else {}
        return family.offload_backward_points(cfg, as_run, w, points, **later)

    def sweep(grads_exist: bool, ckpt: bool = spec.checkpointing) -> dict[str, int]:
        """The backward sweep's points (training.py _backward_sweep) of the first micro-batch, or with every .grad
        already there (a later one of --grad-accum: new grads are transients added in place); ckpt: the blocks
        checkpointed, else not."""
        if ft:  # (its own policies: offload_ft.py)
            return ft_sweep(cfg, spec, w, est, grads_exist, quantized)
        if ckpt:
            # the recomputed block's saved set is on the device (the recompute runs outside save_on_cpu); every
            # stashed block input is a host copy (the sweep counts L of them at the last block, one at the first;
            # measured: the recompute reads the copy in place on the CPU, on CUDA the unpack hook brings one back)
            # On CUDA the unpack hook's device copy of the current block's input (b*s*h*e_r) is alive through its
            # recompute and backward (measured on an H200, tests/data/cuda/2026-11-27-h200: Gemma 2 and Mixtral
            # checkpointed, fp32 and bf16-AMP, the backward phase b*s*h*e_r above the CPU device's)
            got = later_sweep_points(cfg, plain) if grads_exist else est.backward_points
            back = 1 if spec.device_type == "cuda" else 0
            return own({k: v - ((L - back) if k.startswith("last block") else (1 - back) if k.startswith("first block")
                                else 0) * bsh * w.e_r for k, v in got.items()}, ckpt, grads_exist)
        # every saved tensor is a host copy: the sweep's points with empty saved sets, in the step's own widths
        # with autocast's weight copies gone (each one a saved tensor, so a host copy; the sweep runs as the fp32
        # step does at e_m / e_r: measured, the off-grid sweep's Llama / Qwen 2 / Gemma / Mistral bf16 and
        # bf16-AMP rows, the backward phase to the byte, +4.7% to +17% at fp32 widths before)
        fp = dataclasses.replace(plain, precision="fp32" if w.amp else spec.precision, checkpointing=False)
        wf = dataclasses.replace(w, amp=False)
        blk = [dataclasses.replace(t, bytes=0) for t in family.block_terms(cfg, fp, wf)]
        out = [dataclasses.replace(t, bytes=0) for t in family.outside_terms(cfg, fp, wf)]
        got = backward_sweep(cfg, fp, wf, blk, out, e_p, 0, 0, grads_exist=grads_exist)
        # the RMSNorm's input_norm point counts the norm's saved fp32 input (4*b*s*h: planner/arch/decoder.py
        # block_points), here a host copy the CPU backward reads in place (measured: Llama V200 h96 b1 s64, SGD)
        return own({k: v - (4 * bsh if k.endswith("input_norm") else 0) for k, v in got.items()}, ckpt,
                   grads_exist)

    note = []
    cache = tail = g_blk = unkept = 0
    ckpt = set()
    if policy == "selective":
        # every block keeps the outputs torchtitan's policy saves on the device (the checkpoint's own cache, not a
        # saved-tensor hook): L caches through the forward, loss and the backward's start, blocks 0..i-1's at block i
        # (the current block's are the recompute's own), as without offloading (planner/estimate/ckpt_policy.py)
        # (fine-tuning: the block's ops with LoRA's adapter matmuls, planner/estimate/finetune.py policy_ops)
        cache = selective_saved(ft_policy_ops(cfg, spec, w, quantized) if ft else family.selective_ops(cfg, spec, w))
        forward, loss, ce_start = forward + L * cache, loss + L * cache, ce_start + L * cache
        # and the current block's cached output its recompute never replays (planner/arch/base.py)
        tail = family.selective_unconsumed(cfg, spec, w)
        note = [f"selective checkpointing: each block's kept matmul and attention outputs ({cache:,} B a block) "
                "stay on the device (the checkpoint's own cache); save_on_cpu copies each block's input"]
    elif policy != "full":
        # every:K: a block not checkpointed saves through save_on_cpu's hook (its saved set on the host), so what
        # the device holds is full checkpointing's except at that block's backward, which is the step without
        # checkpointing's (no recompute) beside what the checkpointed blocks below it hold (RoPE's cos and sin,
        # position_ids and the masks they take). Block i of the sweep: the last block's points with the grads of
        # blocks i+1..L-1 (planner/estimate/ckpt_policy.py); block 0 is always checkpointed.
        ckpt = set(checkpointed_blocks(policy, L))
        # one block's grads (block 0's parameters, every one trains: full training)
        g_blk = e_p * sum(t.numel for t in tensor_inventory(cfg) if t.kind == "param" and t.block == 0)
        # the masks no checkpointed layer takes die with the model's forward, before the loss (planner/arch/
        # gemma2.py checkpoint_mask_count; measured: Gemma 2 every:2, the loss phase b*s^2*e_r under full's)
        unkept = ((family.mask_count(cfg) - family.checkpoint_mask_count(cfg, spec)) * b * s * s * w.e_r
                  if hasattr(family, "checkpoint_mask_count") else 0)
        loss, ce_start = loss - unkept, ce_start - unkept
        note = [f"checkpointing every {every_k(policy)} blocks: the {L - len(ckpt)} blocks not checkpointed save "
                "through save_on_cpu (their saved tensors on the host), the checkpointed ones their input"]

    def policy_points(grads_exist: bool) -> dict[str, int]:
        """The sweep's points under the policy (grads_exist: a later micro-batch, whose grads the caller counts)."""
        pts = sweep(grads_exist)
        if ft or policy == "full":  # (fine-tuning's sweep is the policy's own: offload_ft.py ft_sweep)
            return pts
        if policy == "selective":
            return {k: v + (L if k == "final norm" else L - 1 if k.startswith("last block") else 0) * cache
                    + (tail if k != "final norm" else 0) for k, v in pts.items()}
        if policy == "full":
            return pts
        none = sweep(grads_exist, ckpt=False)
        growth = 0 if grads_exist else g_blk  # later micro-batches: no grad is new
        out = {"final norm": pts["final norm"] - unkept}
        for i in range(L):
            src, prefix = ((pts, "first block ") if i == 0 else (pts, "last block ") if i in ckpt
                           else (none, "last block "))
            for k, v in src.items():
                if k.startswith(prefix):
                    held = (rope_held - unkept) if i not in ckpt else -unkept if i else 0
                    out[f"block {i} {k[len(prefix):]}"] = v + (L - 1 - i) * growth * (i > 0) + held
        return out

    points = policy_points(False)
    # the embedding's backward: every grad made and the first block's input gradient (b*s*h*e_r, measured)
    grads_end = est.grads_bytes + bsh * w.e_r + 2 * w.e_ce
    # a tied head: the head's V*h grad is held by the engine until the embedding's own V*h grad is added out of
    # place (training.py tied_embedding_accumulation), every grad and two V*h at once, the input grad freed (measured:
    # GPT-2 V1000 h64 b2 s64, Mixtral V2000 h48 b2 s48, fp32 and bf16-AMP, to the byte; the backward's top once
    # --offload-optimizer has taken AdamW's states off the device: llama-3.2-1b b1 s256 simulated, 11.17 GiB)
    # (fine-tuning: only where the tied weight trains; a frozen one makes no grad to accumulate)
    tied = (est.grads_bytes + 2 * V * h * e_p + 2 * w.e_ce
            if family.tied(cfg) and (not ft or ft_embed_trains(cfg, spec)) else 0)
    backward = base + max(ce_start, grads_end, tied, max(points.values()))
    # --grad-accum N: a later micro-batch's forward, loss and backward run with every .grad alive (measured: each
    # phase of accumulation 2 is the first micro-batch's plus the grads, Llama V300 h48 b2 s32)
    accum_grads = est.grads_bytes if spec.grad_accum > 1 else 0
    if accum_grads:
        forward, loss = forward + accum_grads, loss + accum_grads
        later = policy_points(True)
        # a tied head in a later micro-batch: the shared weight's .grad exists beside the head's part, the
        # embedding's part and their sum (tied's two V*h tensors and one more; measured: llama-3.2-1b b1 s256
        # accum2 checkpointed, simulated, backward 22,925,054,800 B, one V*h*e_p above tied's)
        tied_later = tied + V * h * e_p if tied else 0
        # an untied head under autocast in a later micro-batch: lm_head's new bf16 weight grad and its fp32 copy
        # (autocast's cast backward) before the copy is added in place, beside the head's input grad cast to fp32 (the
        # final norm's output) and what ce_start holds but the b*s*V grads, freed by then (measured: qwen1.5-moe-a2.7b
        # L2 b1 s256 bf16-AMP checkpointed accum 2, simulated, 1,869,350,920 B above the grads and the persistent
        # state, to the byte; -320 MB at full size before)
        untied_cast = (V * h * (w.e_m + e_p) + bsh * w.e_r + 2 * w.e_ce + rope_held
                       if w.amp and not family.tied(cfg) else 0)
        backward = max(backward, base + accum_grads + max(ce_start, untied_cast, max(later.values())),
                       base + tied_later)
    # the optimizer and zero_grad phases are the plain step's (nothing is saved for backward after it ends)
    opt_phase, zero_grad = est.phase_peak_bytes["optimizer"], est.phase_peak_bytes["zero_grad"]
    phase = step.phases(step.Step(base=base, grads=zero_grad - cuda - base, forward=forward - base,
                                  loss=loss - base, backward=[backward - base], optimizer_tmp=opt_phase - zero_grad,
                                  every_phase=cuda))
    peak_phase = step.peak(phase)[0]
    hterms = host_terms(cfg, spec)
    host = sum(t.bytes for t in hterms)
    pinned = sum(pow2_ceil(t.bytes) for t in hterms) if spec.device_type == "cuda" else 0
    secs = copy_seconds(host)
    # a shape class where the family's points are known to miss by more than 1% (off the measured grids): its
    # measured bound (planner/arch/<family>.py offload_bound_note; the off-grid sweep, bench/offload_act.py)
    bound = family.offload_bound_note(cfg, spec) if hasattr(family, "offload_bound_note") else None
    note += [bound] if bound else []
    notes = est.notes + note + [
        f"activations offloaded (torch.autograd.graph.save_on_cpu(pin_memory=True)): {host:,} B of saved-tensor "
        f"copies live on the host (one per saved variable, weights saved by the matmuls included); {DEVICE_NOTE} "
        "(on CUDA the unpack hook's device copy of each node's saved tensors adds a transient in backward). "
        f"Cost: every copied byte crosses PCIe twice a step, ~{secs * 1e3:.1f} ms at 32 GB/s (PCIe Gen4 x16, "
        "NVIDIA's published figure), overlapped with compute only in part"]
    terms = est.terms + [{"name": t.name + " (host)", "formula": t.formula, "bytes": t.bytes, "per_layer": False,
                          "where": "host", "part": ""} for t in hterms]
    transients = {**tr, "host_activation_offload": host}
    if pinned:
        transients["host_pinned_rounded"] = pinned
    return dataclasses.replace(est, peak_bytes=phase[peak_phase], peak_phase=peak_phase, phase_peak_bytes=phase,
                               activations_bytes=0, notes=notes, terms=terms, transients=transients,
                               backward_points={k: v for k, v in points.items()})
