"""Will it fit, and what do I change so it fits? (no torch; every answer comes from estimate_training)

max_batch_size / max_seq_len bisect on the estimated peak (which grows with batch and sequence). advice()
evaluates each single change and the combinations of the cheap ones, keeps those that lower the peak (every
change in a combination doing its part), labels each with its full change, and ranks those that fit by cost.
default_budget is stable (the GPU's total, else the total RAM); on cuda tensor_budget takes the CUDA context
off whatever budget is given.

The offloads (optimizer, activations) are offered on every device the estimate models them on. On a GPU each is
ranked by the device peak it leaves, its host RAM beside it (Option.host_bytes, a budget of its own). On the CPU the
"device" and the host are the same RAM: an offload's host copies add to the one memory that matters, so it is
ranked only if device + host falls below the run's peak (none did over every preset at fp32 / bf16-AMP / bf16,
with and without checkpointing, batch 1 and 8, seq 128 and 1,024: 1,056 offload runs; the activations' copies
include the weights the matmuls save, the optimizer's the parameters and grads); unranked() states the others
beside the advice, with their device figure (measured here, the CUDA check's) and host bytes.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

from .accounting import per_config
from .config import ConfigError, ModelConfig, with_attention
from .estimate.training import CUDA_CONTEXT_BYTES, estimate_training
from .spec import OPTIMIZERS, TrainSpec, check_fits_model
from .units import fmt_bytes

# Cost rank of each change, cheapest first, and what it costs. The order is this project's judgement:
# free > same maths but slower > more compute > lower precision > a different optimizer > a different task.
CHANGES = {
    "sdpa": (0, "none: the same attention maths in a fused kernel (no s x s tensors)"),
    "fused": (0, "none: the same update in one fused kernel per parameter group (no temporaries)"),
    "for-loop": (1, "same update, one parameter at a time: more, smaller kernels (slower on a GPU)"),
    "grad-accum": (1, "same gradients; smaller micro-batches run slower per sample (smaller matmuls)"),
    # Issue #24 (planner/losses.py, planner/estimate/losses.py): the same loss, the logits never whole.
    "chunked-ce": (1, "the same cross-entropy over chunks of tokens (Liger-Kernel's chunking; torch.utils.checkpoint "
                      "per chunk): each chunk's head matmul is recomputed in backward, ~1/3 more head work, ~0% of "
                      "the step for a large model"),
    "cce": (1, "the same cross-entropy by Cut Cross-Entropy's algorithm (Wijmans et al. 2024, arXiv 2411.09009: "
               "no slowdown with its CUDA kernels); measured here as a plain-torch equivalent, which recomputes the "
               "logits block by block"),
    "checkpointing": (2, "recomputes each block's forward in backward: ~1 extra forward per step"),
    # Issue #24 (planner/checkpointing.py, planner/estimate/ckpt_policy.py): between none and full checkpointing;
    # the recompute share is computed per run from the ops' FLOPs (recompute_share) and put before these words.
    # Ranked with the other "same maths, more compute" changes, before full checkpointing: they recompute less.
    "selective-checkpointing": (1, "torchtitan's selective policy (torch.utils.checkpoint's "
                                   "create_selective_checkpoint_contexts): every block keeps every second matmul's "
                                   "output and the fused attention's, pointwise ops are recomputed"),
    "every-k-checkpointing": (1, "transformers' every_n_layers: only every K-th block is checkpointed and "
                                 "recomputed, the others keep their activations"),
    # Issue #24 (planner/estimate/offload.py): torchao's CPUOffloadOptimizer; its host bytes are put before these words
    "offload-optimizer": (3, "AdamW's states on the host (torchao CPUOffloadOptimizer): every grad is copied to the "
                             "host and the step runs on CPU cores, slower per step (estimated only, not measured here)"),
    # Issue #24 (planner/estimate/offload_act.py): save_on_cpu; its host bytes and copy time are put before these words
    "offload-activations": (3, "every saved tensor copied to host RAM in forward and back in backward "
                               "(torch.autograd.graph.save_on_cpu(pin_memory=True)): no recompute, but the copies "
                               "cross PCIe twice a step and overlap compute only in part (device figure measured on "
                               "the CPU mechanism, for the CUDA check)"),
    "bf16-amp": (3, "matmuls in bf16 (8-bit mantissa); fp32 master weights keep updates exact; usually no loss change"),
    "fp16-amp": (4, "matmuls in fp16 with dynamic loss scaling (GradScaler); overflow-skipped steps possible"),
    "sgd-momentum": (5, "a different optimizer: needs its own learning rate; often slower to converge than AdamW"),
    "bf16": (6, "weights, grads and optimizer states in bf16: updates below ~1/256 of a weight are lost"),
    "shorter-seq": (7, "less context per sample: the model learns shorter dependencies"),
    # Fine-tuning (issue #12): each says plainly what it costs in quality, with its source.
    "adamw-8bit": (4, "AdamW's two states kept in 8 bits, blockwise-quantized (bitsandbytes AdamW8bit; Dettmers et al. "
                      "2022, '8-bit Optimizers via Block-wise Quantization', report 32-bit Adam's results); tensors "
                      "under 4,096 elements keep 32-bit states"),
    "lora": (6, "a different fine-tune: trains a low-rank update of each linear layer, not the weights (peft LoRA); "
                "less capacity than full fine-tuning, so it can fall short on tasks far from pre-training (Biderman et "
                "al. 2024, 'LoRA Learns Less and Forgets Less')"),
    "qlora": (6, "LoRA on frozen weights stored in 4-bit NF4 (QLoRA, Dettmers et al. 2023, matched 16-bit LoRA on "
                 "their benchmarks): the base carries quantization error, and dequantizing it every step costs time"),
}
# Changes that combine with each other (each combination is offered only if every change in it lowers the peak).
COMBINABLE = ("sdpa", "fused", "checkpointing", "bf16-amp", "chunked-ce")


@dataclass
class Option:
    changes: list[str]   # keys of CHANGES
    label: str           # the full change, unique within one advice list: "grad-accum 4 x batch 2"
    spec: dict
    attention: str
    peak_bytes: int
    fits: bool
    cost_rank: int
    cost: str
    host_bytes: int = 0  # host RAM the option's offloads hold beside peak_bytes (the device's): a budget of its own


@dataclass(frozen=True)
class _Change:
    key: str
    label: str
    spec: TrainSpec
    attention: str


def _peak(cfg: ModelConfig, spec: TrainSpec) -> int:
    return estimate_training(cfg, spec).peak_bytes


def bisect_fitting(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest n in [lo, hi) with fits(n), given fits(lo) and a monotone fits (hi fails or is past the end)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_fitting(fits: Callable[[int], bool], lo: int, limit: int) -> int:
    """The largest n in [lo, limit] with fits(n), given fits(lo): doubling from lo, then bisection."""
    hi = lo * 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    return bisect_fitting(fits, lo, min(hi, limit + 1))


@per_config
def max_batch_size(cfg: ModelConfig, spec: TrainSpec, budget: int, limit: int = 1 << 20) -> tuple[int, str]:
    """The largest batch whose estimated peak fits `budget` (spec.batch_size is ignored); 0 with the reason.
    Memoised: the app asks again for every slider move that does not change the answer."""
    at = lambda b: _peak(cfg, dataclasses.replace(spec, batch_size=b))
    if at(1) > budget:
        one = estimate_training(cfg, dataclasses.replace(spec, batch_size=1))
        fixed = one.params_bytes + one.buffers_bytes + one.optimizer_bytes + one.grads_bytes
        why = ("the weights, grads and optimizer states alone" if fixed > budget
               else "batch 1 (its activations and transients)")
        return 0, (f"{why} need more than the budget: peak at batch 1 is {fmt_bytes(one.peak_bytes)} > "
                   f"{fmt_bytes(budget)}")
    lo = largest_fitting(lambda b: at(b) <= budget, 1, limit)
    return lo, f"batch {lo + 1} would need {fmt_bytes(at(lo + 1))}" if lo < limit else "search limit reached"


@per_config
def max_seq_len(cfg: ModelConfig, spec: TrainSpec, budget: int) -> tuple[int, str]:
    """The longest sequence (up to the model's context) whose estimated peak fits at spec.batch_size
    (spec.seq_len is ignored). Memoised as max_batch_size."""
    at = lambda s: _peak(cfg, dataclasses.replace(spec, seq_len=s))
    if at(1) > budget:
        return 0, f"even a sequence of 1 needs {fmt_bytes(at(1))} > {fmt_bytes(budget)}"
    if at(cfg.max_seq_len) <= budget:
        return cfg.max_seq_len, "the model's full context fits"
    lo = bisect_fitting(lambda s: at(s) <= budget, 1, cfg.max_seq_len + 1)
    return lo, f"seq_len {lo + 1} would need {fmt_bytes(at(lo + 1))}"


def _singles(cfg: ModelConfig, spec: TrainSpec, budget: int) -> list[_Change]:
    """Each single change from the run (spec, with cfg's attention), with the label that states it in full."""
    out, att = [], cfg.attention
    if att == "eager":
        out.append(_Change("sdpa", "sdpa attention", spec, "sdpa"))
    # bitsandbytes' optimizers run their own kernel: torch's implementations are no change for them
    impl = "fused" if spec.optimizer in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw") else spec.resolved_optimizer_impl
    if impl != "fused":
        out.append(_Change("fused", "fused optimizer", dataclasses.replace(spec, optimizer_impl="fused"), att))
    if impl == "foreach":
        out.append(_Change("for-loop", "for-loop optimizer", dataclasses.replace(spec, optimizer_impl="for-loop"), att))
    for k in (2, 4, 8, 16):
        if spec.batch_size % k == 0:
            new = dataclasses.replace(spec, batch_size=spec.batch_size // k, grad_accum=spec.grad_accum * k)
            out.append(_Change("grad-accum", f"grad-accum {new.grad_accum} x batch {new.batch_size}", new, att))
    from .losses import is_fused

    if not is_fused(spec.loss):  # a loss that takes the hidden states: refused where the family cannot (peak None)
        out.append(_Change("chunked-ce", "chunked cross-entropy (--loss chunked-ce)", dataclasses.replace(spec, loss="chunked-ce"), att))
        out.append(_Change("cce", "Cut Cross-Entropy (--loss cce)", dataclasses.replace(spec, loss="cce"), att))
    if not spec.checkpointing:
        out.append(_Change("checkpointing", "checkpointing", dataclasses.replace(spec, checkpointing=True), att))
        out.append(_Change("selective-checkpointing", "selective checkpointing (--checkpointing selective)",
                           dataclasses.replace(spec, checkpointing=True, checkpoint_policy="selective"), att))
        for k in (2, 4):
            if k < cfg.layers:
                out.append(_Change("every-k-checkpointing", f"checkpointing every {k} blocks (--checkpointing every:{k})",
                                   dataclasses.replace(spec, checkpointing=True, checkpoint_policy=f"every:{k}"), att))
    elif spec.checkpoint_policy != "full":  # every:K / selective: full checkpointing keeps less
        out.append(_Change("checkpointing", "full checkpointing (--checkpointing full)",
                           dataclasses.replace(spec, checkpoint_policy="full"), att))
    for prec in (() if spec.quantize_base != "none" else ("bf16-amp", "fp16-amp", "bf16")):  # QLoRA: bf16 only
        if spec.precision != prec:
            out.append(_Change(prec, prec, dataclasses.replace(spec, precision=prec), att))
    if spec.optimizer in ("adam", "adamw"):
        new = dataclasses.replace(spec, optimizer="sgd-momentum")
        out.append(_Change("sgd-momentum", "sgd-momentum optimizer", new, att))
    if spec.optimizer == "adamw" and "adamw-8bit" in OPTIMIZERS:
        new = dataclasses.replace(spec, optimizer="adamw-8bit", optimizer_impl="default")
        out.append(_Change("adamw-8bit", "AdamW8bit optimizer", new, att))
    out += _offload_changes(cfg, spec)
    out += _finetune_changes(cfg, spec)
    s, _ = max_seq_len(cfg, dataclasses.replace(spec, seq_len=1), budget)
    if 0 < s < spec.seq_len:
        out.append(_Change("shorter-seq", f"seq {s} instead of {spec.seq_len}", dataclasses.replace(spec, seq_len=s), att))
    return out


HOST_KEYS = {"offload-optimizer": "host_optimizer_offload", "offload-activations": "host_activation_offload"}


def _offload_changes(cfg: ModelConfig, spec: TrainSpec) -> list[_Change]:
    """The optimizer's and the activations' offload, on every device where the estimate models them (its own
    checks decide: planner/estimate/offload.py, offload_act.py). Their host bytes are a budget of their own;
    on the CPU the host is the same RAM, and advice() counts the two together there (one_memory)."""
    from .estimate.offload import check_offload_optimizer
    from .estimate.offload_act import check_offload_activations

    out, att = [], cfg.attention
    for key, flag, label, check in (
            ("offload-optimizer", "offload_optimizer", "optimizer on the host (--offload-optimizer)",
             check_offload_optimizer),
            ("offload-activations", "offload_activations", "activations on the host (--offload-activations)",
             lambda new: check_offload_activations(cfg, new))):
        if getattr(spec, flag, False):
            continue
        new = dataclasses.replace(spec, **{flag: True})
        try:
            check(new)
        except ConfigError:
            continue  # not modelled for this run: not offered
        out.append(_Change(key, label, new, att))
    return out


def host_bytes_of(est) -> int:
    """The host RAM an estimate's offloads hold beside its (device) peak: the offloads' own lines."""
    return sum(est.transients.get(k, 0) for k in HOST_KEYS.values())


def one_memory(spec: TrainSpec) -> bool:
    """True where the device and the host are the same RAM (a CPU run): offloading moves nothing out of it."""
    return spec.device_type == "cpu"


def _finetune_changes(cfg: ModelConfig, spec: TrainSpec) -> list[_Change]:
    """LoRA for a full training run, and a 4-bit base (QLoRA) for a LoRA run or a full one (planner/finetune.py's
    defaults: r=16 on every linear layer, NF4 with double quantization as in the QLoRA paper)."""
    from .finetune import ALL_LINEAR, DEFAULT_LORA_R

    out, att = [], cfg.attention
    if spec.finetuning and not spec.lora_r:
        return out  # a trainable subset: the user chose what trains
    lora = {} if spec.lora_r else {"lora_r": DEFAULT_LORA_R, "lora_targets": ALL_LINEAR}
    what = f"LoRA r={spec.lora_r or DEFAULT_LORA_R}" + ("" if spec.lora_r else " on all linear layers")
    if not spec.lora_r:
        out.append(_Change("lora", what, dataclasses.replace(spec, **lora), att))
    if spec.quantize_base == "none":  # bitsandbytes computes in bf16 (planner/finetune.py check_quantize_settings)
        new = dataclasses.replace(spec, **lora, quantize_base="nf4", double_quant=True, precision="bf16")
        out.append(_Change("qlora", f"QLoRA: NF4 base (bf16 compute) + {what}", new, att))
    return out


def _combine(spec: TrainSpec, attention: str, changes: tuple[_Change, ...]) -> tuple[TrainSpec, str]:
    """Apply several COMBINABLE changes at once (each touches its own setting)."""
    for c in changes:
        if c.key == "sdpa":
            attention = "sdpa"
        elif c.key == "fused":
            spec = dataclasses.replace(spec, optimizer_impl="fused")
        elif c.key == "checkpointing":
            spec = dataclasses.replace(spec, checkpointing=True)
        elif c.key == "chunked-ce":
            spec = dataclasses.replace(spec, loss="chunked-ce")
        else:
            spec = dataclasses.replace(spec, precision=c.spec.precision)
    return spec, attention


def advice(cfg: ModelConfig, spec: TrainSpec, budget: int, costs: dict[str, float] | None = None) -> list[Option]:
    """The options that lower the estimated peak, with their peak, whether they fit, and their cost; those
    that fit first, cheapest first. An option is offered only if it lowers the peak, and a combination only
    if each of its changes lowers it further (so none is presented as a remedy that does nothing).

    costs: step-time ratios measured here (measure_costs); when both are known, checkpointing and gradient
    accumulation are ranked by them instead of by the static order in CHANGES."""
    costs = costs or {}
    rank = {c: r for c, (r, _) in CHANGES.items()}
    if "checkpointing" in costs and "grad-accum" in costs and costs["checkpointing"] < costs["grad-accum"]:
        rank["checkpointing"], rank["grad-accum"] = rank["grad-accum"], rank["checkpointing"]
    known: dict = {}
    hosts: dict = {}  # the host RAM each estimated run's offloads hold beside its device peak

    def peak_of(s: TrainSpec, att: str) -> int | None:
        """The option's estimated peak; None for a run this model refuses or the estimate does not model
        (such a change is not offered)."""
        if (s, att) not in known:
            try:
                run_cfg = with_attention(cfg, att)
                check_fits_model(run_cfg, s)
                est = estimate_training(run_cfg, s)
                known[(s, att)] = est.peak_bytes
                hosts[(s, att)] = host_bytes_of(est)
            except ConfigError:
                known[(s, att)] = None
        return known[(s, att)]

    now = peak_of(spec, cfg.attention)
    singles = [c for c in _singles(cfg, spec, budget) if peak_of(c.spec, c.attention) is not None]
    candidates = [((c,), c.spec, c.attention) for c in singles]
    base = [c for c in singles if c.key in COMBINABLE]
    peaks = {frozenset(): now} | {frozenset([c.key]): peak_of(c.spec, c.attention) for c in base}
    for n in range(2, len(base) + 1):
        for combo in itertools.combinations(base, n):
            new_spec, att = _combine(spec, cfg.attention, combo)
            peaks[frozenset(c.key for c in combo)] = peak_of(new_spec, att)
            candidates.append((combo, new_spec, att))
    options = []
    for combo, new_spec, attention in candidates:
        keys = frozenset(c.key for c in combo)
        host = hosts.get((new_spec, attention), 0)
        if len(combo) == 1:
            peak, before = peak_of(new_spec, attention), now
            if one_memory(spec) and combo[0].key in HOST_KEYS:
                # the device and the host are the same RAM here: the one memory holds both (each at its own peak),
                # so it is ranked only if their sum falls below the run's; unranked() states the others
                peak += host - hosts.get((spec, cfg.attention), 0)
        else:  # each change must lower the peak of the others alone
            others = [peaks[keys - {k}] for k in keys]
            peak, before = peaks[keys], min((p for p in others if p is not None), default=now)
        if peak is None or peak >= before:
            continue  # a change that leaves the peak where it was is not a remedy
        words = []
        for c in combo:
            text = CHANGES[c.key][1]
            if c.key in costs:
                what = "2 micro-batches of half the batch, " if c.key == "grad-accum" else ""
                text += (f" (measured here, {what}2-block proxy: step time x{costs[c.key]:.2f})" if costs[c.key] >= 1.02
                         else f" (measured here, {what}2-block proxy: within timing noise)")
            if c.key in ("chunked-ce", "cce") and len(combo) == 1:  # what it saves, beside what it costs
                text = f"lowers the peak by {fmt_bytes(now - peak)}; " + text
            if c.key == "offload-optimizer" and len(combo) == 1:
                from .estimate.offload import host_bytes

                text = (f"lowers the device peak by {fmt_bytes(now - peak_of(c.spec, c.attention))} and needs "
                        f"{fmt_bytes(sum(host_bytes(cfg, c.spec).values()))} of host RAM; " + text)
            if c.key == "offload-activations" and len(combo) == 1:
                from .estimate.offload_act import copy_seconds, host_terms

                host = sum(t.bytes for t in host_terms(cfg, c.spec))
                text = (f"lowers the device peak by {fmt_bytes(now - peak_of(c.spec, c.attention))} and needs {fmt_bytes(host)} of host RAM; "
                        f"~{copy_seconds(host) * 1e3:.0f} ms of PCIe copies per step at 32 GB/s (PCIe Gen4 x16, "
                        "NVIDIA's published figure); " + text)
            if c.key in ("selective-checkpointing", "every-k-checkpointing") and len(combo) == 1:
                from .estimate.ckpt_policy import recompute_share

                share = recompute_share(cfg, c.spec)  # the recomputed ops' FLOPs over the step's (3 x the forward)
                text = (f"lowers the peak by {fmt_bytes(now - peak)} for ~{100.0 * share:.0f}% more compute (the "
                        "recomputed matmul and attention FLOPs over the step's, Kaplan et al. 2020); " + text)
            words.append(f"{c.label}: {text}")
        options.append(Option(changes=[c.key for c in combo], label=" + ".join(c.label for c in combo),
                              spec=dataclasses.asdict(new_spec), attention=attention, peak_bytes=peak,
                              fits=peak <= budget, cost_rank=sum(rank[c.key] + 1 for c in combo),
                              cost="; ".join(words), host_bytes=host))
    options.sort(key=lambda o: (not o.fits, o.cost_rank, o.peak_bytes))
    return options


def unranked(cfg: ModelConfig, spec: TrainSpec) -> list[dict]:
    """The offloads on a run whose device and host are the same RAM (a CPU run), which advice() does not rank:
    each with its device figure, its host bytes and what the two add up to, in plain words. The mechanism is
    measured here (docs/accuracy.md, Optimizer and Activation offloading), so its device figure is the one the
    CUDA check compares; but on a CPU-only machine the host copies are in the same RAM as the "device" tensors,
    so it moves nothing out of the budget: advice() counts the device figure and the host copies together there
    and ranks an offload only if their sum is below the run's; those it does not rank are listed here. Empty on a
    device with a host of its own (there advice() ranks them by the device peak, their host bytes beside)."""
    if not one_memory(spec):
        return []
    try:
        check_fits_model(cfg, spec)
        now = estimate_training(cfg, spec)
    except ConfigError:
        return []
    now_ram = now.peak_bytes + host_bytes_of(now)  # the run's own offloads, if any, in the same RAM
    out = []
    for c in _offload_changes(cfg, spec):
        try:
            est = estimate_training(cfg, c.spec)
        except ConfigError:
            continue
        host = host_bytes_of(est)
        ram = est.peak_bytes + host  # each at its own peak: at most this much of the one RAM at once
        if ram < now_ram:
            continue  # it lowers the one RAM after all: advice() ranks it
        out.append({"changes": [c.key], "label": c.label, "spec": dataclasses.asdict(c.spec),
                    "device_peak_bytes": est.peak_bytes, "host_bytes": host, "ram_bytes": ram,
                    "why": (f"not ranked on a CPU device: the \"device\" and the host are this machine's same RAM, so "
                            f"it moves {fmt_bytes(max(now.peak_bytes - est.peak_bytes, 0))} of tensors out of the device "
                            f"figure ({fmt_bytes(now.peak_bytes)} -> {fmt_bytes(est.peak_bytes)}) into "
                            f"{fmt_bytes(host)} of host copies: up to {fmt_bytes(ram)} of RAM in all (each at its own "
                            f"peak), {'more than' if ram > now_ram else 'as much as'} the run's {fmt_bytes(now_ram)} now. The "
                            "mechanism is measured here, the device figure and the host bytes apart; on a GPU the "
                            "host is a budget of its own and the device figure is the one that drops")})
    return out


def default_budget(device: str) -> tuple[int, str]:
    """A default that does not move between runs: the GPU's total memory on cuda (nvidia-smi), else this
    machine's total RAM; with the words saying where it came from. On cuda, tensor_budget() takes the CUDA
    context off it as its own line."""
    if device.startswith("cuda"):
        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise ConfigError("no GPU memory figure here (nvidia-smi not found): give --budget")
        index = device.split(":")[1] if ":" in device else "0"
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", index],
                             capture_output=True, text=True, timeout=10)
        if out.returncode:
            raise ConfigError(f"nvidia-smi could not read GPU {index}: give --budget")
        return int(out.stdout.strip().splitlines()[0]) * 2**20, f"GPU {index}'s total memory (nvidia-smi)"
    import psutil

    return psutil.virtual_memory().total, "this machine's total RAM"


def cuda_context_bytes(device: str) -> int:
    """The CUDA context (driver, kernels) lives outside PyTorch's allocator, so the estimate leaves it out;
    on cuda it comes off the budget as its own line, whatever the budget's source."""
    return CUDA_CONTEXT_BYTES if device.startswith("cuda") else 0


# The caching allocator reserves more than the tensors it holds (blocks split and cached, segments that a large
# request cannot reuse). Measured on an H200 (docs/gpu.md, fresh processes, max_memory_reserved over
# max_memory_allocated of one training step): 1.8% to 6.1% without checkpointing (14 realistic rows and
# llama-3.2-1b b20 s2048 bf16), 9.0% to 30.3% with full checkpointing (gpt2-medium fp32 b4 s1024: +30.3%). There,
# llama-3.2-1b b21 s2048 bf16 (estimate 138.92 GiB, exact at b20 to 0.004%) ran out of memory with 16.29 GiB
# reserved but unallocated (and with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, 0.23 GiB short).
# A training run's fit on cuda keeps the worst measured share of its peak free for it.
ALLOCATOR_RESERVE = {False: 0.061, True: 0.303}  # keyed by "checkpointing on": the worst measured share


def allocator_reserve_fraction(device: str, checkpointing: bool | None) -> float:
    """The share of a training peak kept free for the caching allocator's reserve on cuda (0 on a CPU, and for
    a run of no training spec: inference's reserve is not measured)."""
    if checkpointing is None or not device.startswith("cuda"):
        return 0.0
    return ALLOCATOR_RESERVE[bool(checkpointing)]


def tensor_budget(budget: int, device: str, checkpointing: bool | None = None,
                  reserve_bytes: int | None = None) -> int:
    """What the estimated peak (tensors the allocator holds) is compared with: the budget less the CUDA context
    and, for a training run on cuda (`checkpointing` given), less the allocator's reserve on top of the peak.
    reserve_bytes: the reserve a caching-allocator replay found for this run (planner/allocator.py: a simulate
    record's fragmentation_bytes, reserved less allocated at the peak), kept free instead of the measured worst
    share (ALLOCATOR_RESERVE)."""
    if reserve_bytes is not None and device.startswith("cuda"):
        return budget - cuda_context_bytes(device) - reserve_bytes
    return int((budget - cuda_context_bytes(device)) / (1 + allocator_reserve_fraction(device, checkpointing)))


def measure_costs(cfg: ModelConfig, spec: TrainSpec, timeout_s: float = 300,
                  on_step: Callable[[str], None] | None = None) -> dict[str, float]:
    """Step-time ratios measured here on a 2-block proxy of the model (same widths, the run's batch and
    sequence, scaled down until the proxy's peak is under 2 GiB): checkpointing over plain, and two
    micro-batches of half the batch over one full batch. This machine's costs, not a rule of thumb."""
    from .arch import family_of
    from .config import config_to_dict
    from .runner import run_worker

    proxy = family_of(cfg).with_layers(cfg, 2)
    # a paged bitsandbytes optimizer is GPU only; on the CPU bitsandbytes itself runs the unpaged one
    unpaged = {"paged-adamw-8bit": "adamw-8bit", "paged-adamw": "adamw"}.get(spec.optimizer, spec.optimizer)
    base = dataclasses.replace(spec, grad_accum=1, device="cpu", optimizer=unpaged)
    while _peak(proxy, base) > 2 * 2**30 and (base.batch_size > 1 or base.seq_len > 64):
        base = (dataclasses.replace(base, batch_size=base.batch_size // 2) if base.batch_size > 1
                else dataclasses.replace(base, seq_len=base.seq_len // 2))
    variants = {"plain": base, "checkpointing": dataclasses.replace(base, checkpointing=True)}
    if base.batch_size >= 2:
        variants["grad-accum"] = dataclasses.replace(base, batch_size=base.batch_size // 2, grad_accum=2)
    times = {}
    for i, (name, run) in enumerate(variants.items(), start=1):
        if on_step:
            on_step(f"timing a {name} step on a 2-block proxy ({i}/{len(variants)})")
        out = run_worker({"config": config_to_dict(proxy), "spec": dataclasses.asdict(run)}, timeout_s=timeout_s)
        if out.exit_code:
            return {}
        times[name] = out.record["step_time_s"]
    return {k: v / times["plain"] for k, v in times.items() if k != "plain" and times["plain"] > 0}


def gpu_info() -> dict | None:
    """The first GPU's name and memory from nvidia-smi (no torch import), or None on a CPU-only machine."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode or not out.stdout.strip():
        return None
    name, total = out.stdout.strip().splitlines()[0].rsplit(",", 1)
    return {"name": name.strip(), "total_bytes": int(total) * 2**20}


def fit_report(cfg, spec, budget: int, batch_given: bool, costs: dict | None = None,
               reserve_bytes: int | None = None) -> dict:
    """The fit answer as the CLI prints it and the app shows it (one place, so both agree). reserve_bytes: the
    allocator's reserve from a replay of this run (see tensor_budget); `allocator_reserve_source` says which."""
    rec: dict = {"budget_bytes": budget, "cuda_context_bytes": cuda_context_bytes(spec.device)}
    usable = tensor_budget(budget, spec.device, spec.checkpointing, reserve_bytes)
    if spec.device.startswith("cuda") and reserve_bytes is not None:
        rec["allocator_reserve_bytes"] = reserve_bytes
        rec["allocator_reserve_source"] = "replay: the caching allocator replayed on the run's events (planner/allocator.py)"
    elif allocator_reserve_fraction(spec.device, spec.checkpointing):
        rec["allocator_reserve_bytes"] = budget - rec["cuda_context_bytes"] - usable
        rec["allocator_reserve_source"] = ("measured share: the worst measured on an H200 (planner/fit.py ALLOCATOR_RESERVE, "
                                           f"{ALLOCATOR_RESERVE[bool(spec.checkpointing)]:.1%} of the peak)")
    budget = usable
    if batch_given:
        rec["max_seq_len"], rec["reason"] = max_seq_len(cfg, spec, budget)
        target = spec
    else:
        rec["max_batch_size"], rec["reason"] = max_batch_size(cfg, spec, budget)
        # No batch was asked for: the run is the answer, the largest batch (or batch 1, when none fits).
        target = dataclasses.replace(spec, batch_size=max(1, rec["max_batch_size"]))
    rec["run"] = dataclasses.asdict(target)
    rec["peak_bytes"] = estimate_training(cfg, target).peak_bytes
    rec["fits"] = rec["peak_bytes"] <= budget
    # Advice is for a run that does not fit, or one the user chose (with no batch given, nothing to change).
    rec["advice"] = ([] if rec["fits"] and not batch_given else
                     [dataclasses.asdict(o) for o in advice(cfg, target, budget, costs)])
    # On a CPU the offloads are not remedies (one RAM): shown beside the advice, unranked, with their figures.
    rec["unranked"] = unranked(cfg, target) if rec["advice"] or batch_given else []
    if costs:
        rec["measured_costs"] = costs
    return rec


# ---------------------------------------------------------------- per rank (DDP / FSDP2 at a world size)

RANK_LIMIT = 1 << 16  # the fewest-GPUs search stops here (65,536 ranks: beyond any data-parallel job)


def _rank_peak(cfg: ModelConfig, spec: TrainSpec, pspec) -> int:
    from .estimate.distributed import estimate_distributed

    return estimate_distributed(cfg, spec, pspec).peak_bytes


@per_config
def max_batch_per_rank(cfg: ModelConfig, spec: TrainSpec, pspec, budget: int, limit: int = 1 << 20) -> tuple[int, str]:
    """The largest per-rank batch whose per-rank peak (the largest rank's) fits `budget`; 0 with the reason."""
    at = lambda b: _rank_peak(cfg, dataclasses.replace(spec, batch_size=b), pspec)
    if at(1) > budget:
        return 0, f"batch 1 per rank needs {fmt_bytes(at(1))} on its largest rank > {fmt_bytes(budget)}"
    lo = largest_fitting(lambda b: at(b) <= budget, 1, limit)
    return lo, (f"batch {lo + 1} per rank would need {fmt_bytes(at(lo + 1))}" if lo < limit else "search limit reached")


@per_config
def max_seq_per_rank(cfg: ModelConfig, spec: TrainSpec, pspec, budget: int) -> tuple[int, str]:
    """The longest sequence (up to the model's context) whose per-rank peak fits at spec.batch_size."""
    at = lambda s: _rank_peak(cfg, dataclasses.replace(spec, seq_len=s), pspec)
    if at(1) > budget:
        return 0, f"even a sequence of 1 needs {fmt_bytes(at(1))} per rank > {fmt_bytes(budget)}"
    if at(cfg.max_seq_len) <= budget:
        return cfg.max_seq_len, "the model's full context fits"
    lo = bisect_fitting(lambda s: at(s) <= budget, 1, cfg.max_seq_len + 1)
    return lo, f"seq_len {lo + 1} would need {fmt_bytes(at(lo + 1))} per rank"


@per_config
def fewest_ranks(cfg: ModelConfig, spec: TrainSpec, pspec, budget: int) -> tuple[int, str]:
    """The fewest devices of `budget` bytes each that fit this run (spec.batch_size per rank) in the
    layout of `pspec` (its world size is what is searched); 0 with the reason. DDP keeps a whole replica
    on every rank, so more ranks never lower its per-rank peak: 1 if one device fits, else none. FSDP's
    per-rank peak falls as shards shrink; the search doubles, then bisects (it falls monotonically apart
    from the padding of dim-0 shards, which moves it by a few rows)."""
    if pspec.parallel in ("tp", "fsdp+tp"):  # planner/parallel_solver.py: TP degrees, FSDP2 x TP meshes
        from .parallel_solver import fewest_ranks_tp

        return fewest_ranks_tp(cfg, spec, pspec, budget)
    if pspec.parallel == "ddp":
        rank = _rank_peak(cfg, spec, dataclasses.replace(pspec, world_size=2))
        if rank <= budget:
            return 1, (f"one device fits: {fmt_bytes(rank)} per DDP rank; DDP keeps a whole replica on every "
                       "rank, so more ranks add throughput, not room")
        return 0, (f"DDP keeps a whole replica (weights, grads, optimizer state) on every rank: {fmt_bytes(rank)} "
                   "per rank at any world size; FSDP shards them")
    at = functools.cache(lambda n: _rank_peak(cfg, spec, dataclasses.replace(pspec, world_size=n)))
    # Doubling from 2. Past the largest dim-0 (rows) a shard is one padded row and every all-gather output
    # N rows, so the per-rank peak rises again: the search stops at the first fit or at RANK_LIMIT.
    lo, hi, best = 1, 2, None
    while at(hi) > budget:  # each world size is estimated once (at is cached)
        best = min(best or (at(hi), hi), (at(hi), hi))
        if hi >= RANK_LIMIT:
            return 0, (f"no world size up to {RANK_LIMIT:,} fits: the lowest per-rank peak is {fmt_bytes(best[0])} "
                       f"at {best[1]:,} ranks > {fmt_bytes(budget)} (what FSDP does not shard, the activations and "
                       "the gathered blocks, alone exceeds it)")
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mid >= 2 and at(mid) <= budget else (mid, hi)
    return hi, (f"{hi} ranks: {fmt_bytes(at(hi))} per rank" + (f"; {hi - 1} would need {fmt_bytes(at(hi - 1))}"
                                                                if hi > 2 else ""))


def choose_layout(cfg: ModelConfig, spec, budget: int, base=None) -> dict:
    """The layout among DDP, FSDP2 and FSDP2 + TP (TP_SIZES) that fits `spec` (batch per rank) in the fewest
    devices of `budget` bytes; every candidate with its fewest devices (0: none) and reason. base: FSDP2 options
    (reshard, mixed precision) carried to the FSDP layouts."""
    from .parallel import ParallelSpec
    from .parallel_solver import TP_SIZES, _valid, fewest_ranks_tp

    fsdp_kw = {} if base is None or base.parallel not in ("fsdp", "fsdp+tp") else {
        "reshard_after_forward": base.reshard_after_forward, "mp_param_dtype": base.mp_param_dtype,
        "mp_reduce_dtype": base.mp_reduce_dtype}
    cands = [("ddp", ParallelSpec(2, "ddp")), ("fsdp", ParallelSpec(2, "fsdp", **fsdp_kw))]
    cands += [(f"fsdp+tp (tp {t})", ParallelSpec(2 * t, "fsdp+tp", tp=t, **fsdp_kw)) for t in TP_SIZES]
    rows = []
    for order, (name, pspec) in enumerate(cands):
        if not _valid(cfg, spec, pspec):
            rows.append({"layout": name, "devices": 0, "reason": "not applicable to this model or run", "order": order})
            continue
        n, why = (fewest_ranks(cfg, spec, pspec, budget) if pspec.parallel in ("ddp", "fsdp")
                  else fewest_ranks_tp(cfg, spec, pspec, budget))
        rows.append({"layout": name, "devices": n, "reason": why, "order": order,
                     "parallel": pspec.parallel, "tp": pspec.tp})
    fits = [r for r in rows if r["devices"]]
    best = min(fits, key=lambda r: (r["devices"], r["order"])) if fits else None
    return {"best": best, "candidates": rows,
            "reason": (f"{best['layout']} on {best['devices']} devices ({best['reason']})" if best
                       else "no layout fits this budget at this batch per rank")}


# ---------------------------------------------------------------- the allocator's reserve from a replay (cuda)

def replay_reserve(cfg: ModelConfig, spec: TrainSpec, timeout_s: float = 900) -> dict:
    """Simulate `spec` on cuda in a child (planner/measure/simulate.py replays its whole run through the caching
    allocator, planner/allocator.py) and return its figures: {"fragmentation_bytes", "reserved_peak_bytes"}, or
    {"oom": {...}} where the replay ran out of the device's memory. ConfigError (one line) if it cannot run."""
    from .config import config_to_dict
    from .runner import run_worker

    out = run_worker({"kind": "simulate", "spec": dataclasses.asdict(spec), "config": config_to_dict(cfg)},
                     timeout_s=timeout_s)
    if out.exit_code:
        raise ConfigError(f"the allocator replay needs simulate --device cuda: "
                          f"{out.record.get('error') or 'the simulation failed (exit ' + str(out.exit_code) + ')'}")
    rep = out.record.get("allocator_replay") or {}
    if rep.get("oom"):
        return {"oom": rep["oom"]}
    return {k: out.record[k] for k in ("fragmentation_bytes", "reserved_peak_bytes")}


def fit_report_replayed(cfg, spec, budget: int, batch_given: bool, costs: dict | None = None,
                        replay: Callable[[ModelConfig, TrainSpec], dict] = replay_reserve, rounds: int = 3) -> dict:
    """fit_report on cuda with the allocator's reserve from a replay of the answer's own run instead of the measured
    share: the measured share's answer is simulated and replayed, the fit redone keeping that run's reserve free,
    until the answer's run is the one replayed (at most `rounds` replays). A replay that runs out of the device's
    memory moves the answer one batch (or 64 tokens of sequence) down. `allocator_reserve_run` names the replayed
    run; a neighbour of it is judged with its reserve."""
    rec = fit_report(cfg, spec, budget, batch_given, costs)
    replayed: dict = {}
    for _ in range(rounds):
        run = TrainSpec(**rec["run"])
        key = (run.batch_size, run.seq_len)
        if key in replayed:
            break
        got = replayed[key] = replay(cfg, run)
        if "oom" in got:
            smaller = (dataclasses.replace(run, seq_len=run.seq_len - 64) if batch_given
                       else dataclasses.replace(run, batch_size=run.batch_size - 1))
            if smaller.batch_size < 1 or smaller.seq_len < 1:
                rec.update({"fits": False, "allocator_replay_oom": got["oom"]})
                return rec
            reserve = replay(cfg, smaller).get("fragmentation_bytes")
            if reserve is None:
                rec.update({"fits": False, "allocator_replay_oom": got["oom"]})
                return rec
            key = (smaller.batch_size, smaller.seq_len)
            replayed[key] = {"fragmentation_bytes": reserve}
        new = fit_report(cfg, spec, budget, batch_given, costs, reserve_bytes=replayed[key]["fragmentation_bytes"])
        new["allocator_reserve_run"] = {"batch_size": key[0], "seq_len": key[1]}
        rec = new
    rec["allocator_replays"] = [{"batch_size": b, "seq_len": s, **v} for (b, s), v in replayed.items()]
    final = replayed.get((rec["run"]["batch_size"], rec["run"]["seq_len"]), {})
    if "oom" in final:  # the answer is a run whose own replay ran out of memory: say so, do not offer it
        rec.update({"fits": False, "allocator_replay_oom": final["oom"]})
    return rec
