"""`--offload-optimizer`: the optimizer state on the host (issue #24; no torch), as torchao's CPUOffloadOptimizer
does it (torchao/optim/cpu_offload.py, pytorch/ao at 173b31ec; `CPUOffloadOptimizer(model.parameters(),
torch.optim.AdamW, fused=True)`, its defaults offload_gradients=False, minimal_size=4096):

  device  the weights and their grads stay (offload_gradients=False); a parameter under `minimal_size` (4,096)
          elements keeps its AdamW on the device (`d_opt`, fused); the others' states are not on the device, and the
          step there is only `p_device.copy_(p_host)` (in place): no update temporaries on the device.
  host    per offloaded parameter a pinned copy `p_host = torch.empty_like(p, device="cpu", pin_memory=True)` and a
          pinned grad buffer `p_host.grad` of its size and dtype, and its own fused CPU AdamW (exp_avg, exp_avg_sq in
          the parameter's dtype, a 0-d fp32 step). Pinned memory comes from PyTorch's CachingHostAllocator, which
          rounds every request up to a power of two (aten/src/ATen/core/CachingHostAllocator.h allocate:
          `c10::llvm::PowerOf2Ceil(size)`); the optimizer states are ordinary (pageable) host memory.

The device and host are different budgets: `peak_bytes` is the device's; the host's bytes are a line of their own
(`transients.host_optimizer_offload`). CPUOffloadOptimizer asserts a CUDA or XPU device ("CPU Offload currently
only supports CUDA & XPU"), so on this CPU-only machine torchao itself cannot run; `--device cpu` runs its plain-torch
equivalent (planner/routines/offload_optim.py: the same tensors and copies, the "device" being the CPU), which
`measure` and `simulate` measure, the host tensors counted apart. Its estimate (`--device cpu`) has no CUDA terms:
no 512 B blocks on the device, and no pinning (pin_memory needs CUDA), so the host holds each copy at its own size.
On CUDA the same routine runs with pinned host copies, as torchao (`measure --device cuda`); the pinned
power-of-two rounding and the device figure there are for the CUDA check (no GPU record holds them yet).
"""
from __future__ import annotations

import dataclasses

from ..accounting import DTYPE_BYTES, tensor_inventory
from ..validation import ConfigError
from . import step

CUDA_BLOCK_BYTES = 512  # the CUDA caching allocator's block granularity (planner/estimate/training.py)
MINIMAL_SIZE = 4096  # torchao CPUOffloadOptimizer's default minimal_size: smaller tensors keep their optimizer on the device
# the CUDA figures: `measure --device cuda` runs the routine there (pinned, as torchao), no GPU record holds it yet
NOT_MEASURED = "not measured on a GPU yet (measure --device cuda runs it)"


def check_offload_optimizer(spec, estimating: bool = True) -> None:
    """One line for the combinations not modelled; estimating False: what a measurement or simulation can run (the
    plain-torch equivalent runs any trainable set, fine-tuning's alone too: the beside-it run of a fine-tuning
    row, bench/offload_act.py finetune_mix_rows)."""
    if spec.optimizer not in ("adam", "adamw"):
        raise ConfigError(f"--offload-optimizer is modelled for adam / adamw (torchao CPUOffloadOptimizer's default "
                          f"optimizer_class), not {spec.optimizer}")
    if estimating and spec.finetuning and not getattr(spec, "offload_activations", False):
        # (measured with --offload-activations beside it: bench/offload_act.py finetune_mix_rows)
        raise ConfigError("--offload-optimizer with fine-tuning is modelled with --offload-activations beside it "
                          "(the dense RMSNorm decoders), not alone yet")
    if spec.device_type not in ("cuda", "cpu"):
        raise ConfigError("--offload-optimizer is modelled on cuda (torchao's CPUOffloadOptimizer supports only CUDA "
                          f"and XPU) and on cpu (its plain-torch equivalent), not {spec.device_type}")
    if spec.device_type == "cpu" and spec.precision == "fp16-amp":
        raise ConfigError("--offload-optimizer on the CPU is modelled for fp32, bf16 and bf16-amp, not fp16-amp "
                          "(GradScaler's unscale over the host copies is not modelled)")


def _round512(n: int) -> int:
    return -(-n // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def refuse_run(spec) -> None:
    """measure / simulate: the plain-torch equivalent (planner/routines/offload_optim.py) runs on the CPU and on CUDA,
    where it does what torchao does with the same tensors (pinned host copies, each grad copied to the host as it is
    accumulated, the host AdamW's step, the weights copied back); the combinations the estimate refuses are refused
    here too, in one line."""
    if getattr(spec, "offload_optimizer", False):
        check_offload_optimizer(spec, estimating=False)


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def split_params(cfg, spec) -> tuple[list[int], list[int]]:
    """(offloaded, kept on the device) parameter sizes, in elements: the trainable tensors (with fine-tuning the
    fine-tuning step's, LoRA's adapters among them: CPUOffloadOptimizer is given the parameters that require grad)."""
    sized = trainable_sizes(cfg, spec)
    return [n for n, _ in sized if n >= MINIMAL_SIZE], [n for n, _ in sized if n < MINIMAL_SIZE]


def trainable_sizes(cfg, spec) -> list[tuple[int, int]]:
    """(numel, bytes per element) of every tensor the optimizer is given. Full training: every parameter, in the
    parameters' dtype. Fine-tuning (LoRA, --train-layers, QLoRA): planner/estimate/finetune.py trainable_params, the
    adapters in fp32 (peft's autocast_adapter_dtype) whatever the base's dtype."""
    if spec.finetuning:
        from .finetune import trainable_params

        return [(n, eb) for _, n, eb in trainable_params(cfg, spec)]
    e_p = DTYPE_BYTES[spec.param_dtype]
    return [(t.numel, e_p) for t in tensor_inventory(cfg) if t.kind == "param" and t.trainable]


def host_bytes(cfg, spec) -> dict[str, int]:
    """The host's bytes: the parameter and grad copies (on CUDA pinned, power-of-two rounded; on the CPU unpinned,
    their own sizes) and the CPU AdamW's states."""
    big = [(n, e) for n, e in trainable_sizes(cfg, spec) if n >= MINIMAL_SIZE]
    states = sum(2 * n * e + 4 for n, e in big)
    if spec.device_type != "cuda":
        return {"param_and_grad_copies": 2 * sum(n * e for n, e in big), "cpu_adamw_states": states}
    pinned = 2 * sum(pow2_ceil(n * e) for n, e in big)
    return {"pinned_param_and_grad_copies": pinned, "cpu_adamw_states": states}


def estimate_offload_optimizer(cfg, spec, estimate_training):
    """The device-side estimate: the run's own with torchao's fused AdamW, less the offloaded parameters' states;
    estimate_training is planner.estimate.training's (passed in: no import back up)."""
    check_offload_optimizer(spec)
    if getattr(spec, "offload_activations", False):  # both offloads: the activations' limits, seeing this flag too
        from .offload_act import check_offload_activations

        check_offload_activations(cfg, spec)
    on_device = dataclasses.replace(spec, offload_optimizer=False, optimizer_impl="fused")  # torchao sets fused=True
    est = estimate_training(cfg, on_device)
    sized = trainable_sizes(cfg, spec)  # (fine-tuning: the trainable tensors only, the adapters in fp32)
    big = [(n, e) for n, e in sized if n >= MINIMAL_SIZE]
    small = [n for n, _ in sized if n < MINIMAL_SIZE]
    # exp_avg, exp_avg_sq and the 0-d step of every offloaded parameter, as the device held them: each a CUDA
    # caching-allocator block, a multiple of 512 B (training.py _persistent_rounding_bytes counts the same rounding)
    cuda = spec.device_type == "cuda"
    moved = (sum(2 * _round512(n * e) + CUDA_BLOCK_BYTES for n, e in big) if cuda
             else sum(2 * n * e + 4 for n, e in big))
    phase = step.shifted(est.phase_peak_bytes, every=-moved)  # (planner/estimate/step.py)
    peak_phase = step.peak(phase)[0]
    host = host_bytes(cfg, spec)
    if cuda:
        how = ("pinned param and grad copies, rounded up to powers of two by PyTorch's CachingHostAllocator, and the "
               "CPU AdamW's states). Device and host figures are estimated, " + NOT_MEASURED + ": the CUDA check has "
               "to show the device's live bytes without the offloaded states and their 512 B blocks, and the pinned "
               "host allocator's allocated_bytes.peak (torch.cuda.host_memory_stats) equal to the pinned line; the "
               "step runs on the CPU (slower: every grad crosses PCIe and AdamW runs on host cores)")
    else:
        how = ("param and grad copies, unpinned on a CPU build, and the CPU AdamW's states), measured with the "
               "plain-torch equivalent (planner/routines/offload_optim.py); device figure: for the CUDA check (there "
               "the device's 512 B blocks and the pinned power-of-two rounding add)")
    notes = est.notes + [
        f"optimizer offloaded (torchao CPUOffloadOptimizer, AdamW fused): the states of {len(big)} parameters "
        f"(>= {MINIMAL_SIZE} elements) live on the host, {len(small)} small ones keep theirs on the device; the host "
        f"holds {sum(host.values()):,} B (" + how]
    terms = est.terms + [{"name": f"host: {k.replace('_', ' ')}" + (" (" + NOT_MEASURED + ")" if cuda else ""),
                          "formula": ("2 * sum(pow2_ceil(numel*e_p)) over params >= 4096 elements"
                                      if k.startswith("pinned") else "2 * sum(numel*e_p) over params >= 4096 elements"
                                      if k.startswith("param") else "sum(2*numel*e_p + 4) over params >= 4096 elements"),
                          "bytes": v, "per_layer": False, "where": "host", "part": ""} for k, v in host.items()]
    raw = sum(2 * n * e + 4 for n, e in big)  # the same without the allocator's rounding
    transients = {**est.transients, "host_optimizer_offload": sum(host.values())}
    if "allocator_rounding" in transients:
        transients["allocator_rounding"] -= moved - raw
    return dataclasses.replace(est, optimizer_bytes=est.optimizer_bytes - raw, peak_bytes=phase[peak_phase],
                               peak_phase=peak_phase, phase_peak_bytes=phase, notes=notes, terms=terms,
                               transients=transients)
