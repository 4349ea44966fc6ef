"""The plan search (issue #35, item 3): every combination of the run's settings that fits a GPU, priced, ranked.

Not planner/plan.py (the page's facade): this is the search behind `python -m planner plan` (no torch).

Given the model, the task, the sequence length, the tokens per optimizer step, the GPU's memory and count, and the
host's RAM, it enumerates (SPACE below) precision x checkpointing policy x optimizer (its 8-bit and paged
variants) x fused loss x offloads (optimizer, activations) x data-parallel layout (one device; DDP or FSDP2 on 2 to
`gpus` ranks) and, only where the user allows a different task, LoRA / QLoRA; for each combination the largest
micro-batch whose estimated peak fits (accumulation holding the tokens per step), bisected on the peak's
monotonicity in the micro-batch as planner/fit.py's max_batch_size does. What fits is kept; each kept plan is
priced by `time_of`, a callable the caller gives (the compute model: planner/estimate/compute.py's price, wired
by the CLI when it is importable); without one the plans are ranked on the memory side only and say so, never
with a made-up time.

Fits means: the estimated device peak (planner/estimate/training.py, planner/estimate/distributed.py per rank)
is at most planner.fit.tensor_budget(budget) (the CUDA context and the caching allocator's measured reserve off
the GPU's bytes), and the host bytes (the offloads' copies, paged optimizer state: every rank's on one host) at
most the host RAM.

The answer: the fastest plan per quality class (QUALITY), the Pareto front of peak memory against step time, and
`best`: the fastest plan of the user's own task (its exact, bf16 and 8-bit classes); only when none of those fits,
the fastest of the allowed LoRA, then QLoRA. Nothing fits: the smallest peak found, and the plan that has it.

Pruning, all on memory (the time callable is called once per kept plan, so any time model gives the fastest):
- the peak grows with the micro-batch among the accumulating ones (the gradients held between micro-batches in
  each; planner/fit.py bisects on the same fact); accumulation 1 holds none between micro-batches and is tried on
  its own, first; the largest fitting accumulating micro-batch is bisected over the divisors of the samples per
  rank;
- within a group (same task and layout), each axis has a memory order (MEMORY_ORDER: no checkpointing keeps more
  than every policy; the optimizer on the device more than on the host; AdamW's states more than 8-bit or paged
  ones; AMP and fp32 more than pure bf16): a combination whose lower neighbour on one axis has its smallest peak
  over this one's budget is not estimated, and its largest micro-batch is at most its lower neighbours'.
  tests/test_search.py checks that the pruned search keeps what the unpruned enumeration keeps, plan for plan.
  Not ordered (the enumeration found the estimate's peak higher with them at some micro-batch): the checkpointing
  policies among themselves, or against none with the activations offloaded or on several ranks; the fused losses (chunked-ce above
  the default loss at a short micro-batch); the activations' offload (its device figure above none's at
  micro-batch 1, fp32, Qwen2.5-0.5B); the two paged optimizers.
Settings left out of the space, each dominated in memory and time: eager attention (sdpa: the same maths, no
s x s tensors, faster kernels), the foreach and for-loop optimizers (fused: no temporaries and PyTorch's fastest,
torch/optim/optimizer.py's docs "fused > foreach > for-loop"), fp16-AMP where the GPU has bf16 (the same bytes as
bf16-AMP, and loss scaling's skipped steps); tests/test_search.py checks the memory side of the first two.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple

from .config import ConfigError, ModelConfig, with_attention
from .spec import TrainSpec, check_fits_model, run_args

# Quality classes, best first: what each changes in the maths.
QUALITY = {
    "exact": "fp32 maths and 32-bit optimizer state: the step as the model's users run it (offloads, "
             "checkpointing, the fused losses and accumulation change where bytes live, not the maths)",
    "bf16": "bf16 numerics: matmuls in bf16 under autocast (fp32 master weights), or everything in bf16 "
            "(updates below ~1/256 of a weight are lost)",
    "8bit": "AdamW's states blockwise-quantized to 8 bits (bitsandbytes; Dettmers et al. 2022 report 32-bit "
            "Adam's results)",
    "lora": "a different fine-tune: peft LoRA adapters on a frozen base (less capacity than full fine-tuning)",
    "qlora": "LoRA on a 4-bit NF4 base (QLoRA: the base carries quantization error; dequantized every step)",
}
TASK_CLASSES = ("exact", "bf16", "8bit")  # the user's own task; lora / qlora only where allowed
ALLOWABLE = ("lora", "qlora")
TASKS = ("finetune", "train")  # train (from scratch): no LoRA / QLoRA whatever --allow says

CHECKPOINTING = (None, "full", "selective", "every:2", "every:4")  # None: no checkpointing
LOSSES = ("default", "chunked-ce", "cce")
# The user's optimizer and the variants the search may swap in (planner/spec.py OPTIMIZERS): the same update
# with 8-bit and / or paged state (bitsandbytes). Other optimizers are searched as themselves only.
OPTIMIZER_VARIANTS = {"adamw": ("adamw", "adamw-8bit", "paged-adamw-8bit", "paged-adamw")}
# The torch optimizers' implementation searched: fused (see the module docstring); bitsandbytes' run their own kernel.
BNB = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw")

# Memory order per axis: value -> the values that keep no more bytes than it (the lower ones), all else equal.
MEMORY_ORDER = {
    # (none above every policy only, and not with the activations offloaded: Gemma 2 2B's every:2 and every:4 peaks
    # fell below full checkpointing's at accumulation 1, fp32; Qwen3-0.6B's selective and full above none's with
    # save_on_cpu, bf16; the enumeration found)
    "checkpointing": {None: ("full", "selective", "every:2", "every:4"), "every:4": (), "every:2": (),
                      "selective": (), "full": ()},
    "offload_optimizer": {False: (True,), True: ()},
    # (paged-adamw-8bit and paged-adamw are not ordered: with the 32-bit states paged out, the 8-bit one's unpaged
    # small states and quantization maps kept more on GPT-2 small, the enumeration found)
    "optimizer": {"adamw": ("adamw-8bit", "paged-adamw"), "adamw-8bit": ("paged-adamw-8bit",),
                  "paged-adamw": (), "paged-adamw-8bit": ()},
    "precision": {"fp32": ("bf16",), "bf16-amp": ("bf16",), "fp16-amp": ("bf16",), "bf16": ()},
}
AXES = tuple(MEMORY_ORDER)

# Each kept plan's time: seconds, or a mapping with "step_time_s" (and, if the model gives them, "flops_per_step",
# "tokens_per_s"); pspec is None on one device, else the planner.parallel.ParallelSpec of the layout.
TimeOf = Callable[..., "float | Mapping"]


class Combo(NamedTuple):
    """One point of the space but the micro-batch: what the search varies, in the order of AXES, and its group."""
    task: str                   # full | lora | qlora
    layout: str                 # single | ddp | fsdp
    world: int
    checkpointing: str | None
    loss: str
    offload_optimizer: bool
    offload_activations: bool
    optimizer: str
    precision: str

    @property
    def group(self) -> tuple:
        return (self.task, self.layout, self.world)

    def axis(self, name: str):
        return getattr(self, name)


@dataclass
class Plan:
    spec: TrainSpec
    attention: str
    pspec: object | None        # planner.parallel.ParallelSpec, None on one device
    peak_bytes: int             # the device peak (per rank: the largest rank's)
    budget_bytes: int           # what it was compared with (planner.fit.tensor_budget)
    host_bytes: int             # host RAM the plan holds (every rank's): offloads' copies, paged state
    quality: str
    step_time_s: float | None = None
    flops_per_step: float | None = None
    tokens_per_s: float | None = None
    combo: Combo | None = None  # the point of the space it is (the tests compare the search with the enumeration)
    cfg: ModelConfig | None = dataclasses.field(default=None, repr=False)  # the model as it runs (its attention)

    def flags(self, model_flags: list[str]) -> list[str]:
        """The command line that runs this plan as is: `python -m planner estimate|simulate|measure train FLAGS`."""
        out = list(model_flags) + run_args(self.spec) + ["--attention", self.attention]
        if self.pspec is not None:
            out += ["--world-size", str(self.pspec.world_size), "--parallel", self.pspec.parallel]
        return out

    def to_dict(self, model_flags: list[str]) -> dict:
        return {"flags": self.flags(model_flags), "peak_bytes": self.peak_bytes, "flops_per_step": self.flops_per_step,
                "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s, "quality": self.quality,
                "budget_bytes": self.budget_bytes, "host_bytes": self.host_bytes,
                "world_size": self.pspec.world_size if self.pspec is not None else 1,
                "micro_batch": self.spec.batch_size, "grad_accum": self.spec.grad_accum}


@dataclass
class SearchResult:
    plans: list[Plan]                   # every combination that fits, at its largest micro-batch
    best: Plan | None
    by_quality: dict[str, Plan]         # the fastest plan of each class that has one
    pareto: list[Plan]                  # over `plans`: peak against step time, fastest first (none without a time model)
    smallest: Plan | None               # the smallest peak found (what the refusal quotes when nothing fits)
    timed: bool                         # a time model priced the plans
    stats: dict                         # combinations, estimates, pruned, seconds


def quality_of(spec: TrainSpec) -> str:
    if spec.quantize_base != "none":
        return "qlora"
    if spec.lora_r:
        return "lora"
    if spec.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        return "8bit"
    return "exact" if spec.precision == "fp32" else "bf16"


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def combinations(cfg: ModelConfig, task: str = "finetune", allow=(), gpus: int = 1, samples: int = 1,
                 optimizer: str = "adamw", half: str = "bf16") -> list[Combo]:
    """Every point of the space (micro-batch aside) for this question, before any check: the layouts' world sizes
    divide the samples per step (each rank takes an equal share); `half` is the GPU's 16-bit float (fp16 where it
    has no bf16: fp16-AMP then, and no pure bf16)."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    bad = set(allow) - set(ALLOWABLE)
    if bad:
        raise ConfigError(f"--allow takes {', '.join(ALLOWABLE)}, not {', '.join(sorted(bad))}")
    if task == "train" and allow:
        raise ConfigError("LoRA and QLoRA fine-tune a pretrained model: --allow goes with --task finetune")
    precisions = ("fp32", "bf16-amp", "bf16") if half == "bf16" else ("fp32", "fp16-amp")
    layouts = [("single", 1)] + [(lay, w) for w in range(2, gpus + 1) if samples % w == 0 for lay in ("ddp", "fsdp")]
    out = []
    for task_kind in ("full",) + tuple(a for a in ALLOWABLE if a in allow):
        opts = OPTIMIZER_VARIANTS.get(optimizer, (optimizer,)) if task_kind == "full" else (optimizer,)
        precs = ("bf16",) if task_kind == "qlora" else precisions
        if task_kind == "qlora" and half != "bf16":
            continue  # QLoRA computes in bf16 (planner/finetune.py check_quantize_settings)
        for layout, world in layouts:
            if task_kind == "qlora" and layout != "single":
                continue  # a quantized base is estimated for one process (planner/cli/args.py parse_train)
            for ck in CHECKPOINTING:
                for loss in LOSSES:
                    if layout != "single" and loss != "default":
                        continue  # the fused losses with --parallel are not modelled (parse_train)
                    for off_opt in (False, True):
                        for off_act in (False, True):
                            if layout != "single" and (off_opt or off_act):
                                continue  # the offloads with --parallel are not modelled (parse_train, offload.py)
                            if off_act and loss != "default":
                                continue  # save_on_cpu is modelled with the model's own loss (offload_act.py)
                            if off_opt and (optimizer not in ("adam", "adamw") or task_kind != "full" and not off_act):
                                # torchao's CPUOffloadOptimizer: adam / adamw; with fine-tuning, modelled with the
                                # activations offloaded beside it (estimate/offload.py check_offload_optimizer)
                                continue
                            for opt in opts:
                                if off_opt and opt != optimizer:
                                    continue  # its 8-bit / paged variants are bitsandbytes', not torchao's
                                for prec in precs:
                                    out.append(Combo(task_kind, layout, world, ck, loss, off_opt, off_act, opt, prec))
    return out


def spec_of(c: Combo, seq_len: int, micro: int, accum: int, optimizer_impl_fused: bool = True) -> TrainSpec:
    from .finetune import ALL_LINEAR, DEFAULT_LORA_R

    lora = {} if c.task == "full" else {"lora_r": DEFAULT_LORA_R, "lora_targets": ALL_LINEAR}
    if c.task == "qlora":  # the QLoRA paper's recipe: NF4 with double quantization (planner/fit.py's qlora change)
        lora.update(quantize_base="nf4", double_quant=True)
    impl = "default" if c.optimizer in BNB or not optimizer_impl_fused else "fused"
    return TrainSpec(batch_size=micro, seq_len=seq_len, precision=c.precision, optimizer=c.optimizer,
                     optimizer_impl=impl, checkpointing=c.checkpointing is not None,
                     checkpoint_policy=c.checkpointing or "full", grad_accum=accum, device="cuda", loss=c.loss,
                     offload_optimizer=c.offload_optimizer, offload_activations=c.offload_activations, **lora)


def _pspec(c: Combo):
    if c.layout == "single":
        return None
    from .parallel import ParallelSpec

    return ParallelSpec(world_size=c.world, parallel=c.layout)


# Estimates kept between searches in one process (the page searches again on every move of a control): keyed by the
# model's repr, the question's shape and the point; cleared past this many (a few MB of tuples).
ESTIMATES_KEPT = 100_000
_ESTIMATES: dict = {}
_CHOICES: dict = {}  # the same for each combination's attention kernel (its validity checks walk the model)


class _Space:
    """One question's memoised estimates: (combo, micro-batch) -> (peak, host bytes), or None where the estimate
    refuses the run (not modelled)."""

    def __init__(self, cfgs: list[ModelConfig], seq_len: int, samples: int):
        """cfgs: the model with its attention kernels, preferred first (sdpa, then the model's own where a run of
        the family is estimated with it only: the book's GPT-2 fine-tuned)."""
        self.cfgs, self.seq_len, self.samples = list(cfgs), seq_len, samples
        self.cfg = self.cfgs[0]
        self.keys = [repr(c) for c in self.cfgs]  # every field (planner/accounting.py per_config keys on it too)
        self.choice: dict = {}  # combo -> index in cfgs of the kernel it runs with, None: no kernel runs it
        self.memo: dict = {}
        self.estimates = 0  # made by this search (not found kept from an earlier one)

    def spec(self, c: Combo, micro: int) -> TrainSpec:
        per_rank = self.samples // c.world
        return spec_of(c, self.seq_len, micro, per_rank // micro)

    def cfg_of(self, c: Combo) -> ModelConfig:
        return self.cfgs[self.choice.get(c) or 0]

    def valid(self, c: Combo) -> bool:
        """The cheap checks (no estimate): the spec's own, the model's, the estimate's policy and offload checks;
        the first attention kernel that passes them is the combination's."""
        if c not in self.choice:
            shared = (self.keys[0], self.seq_len, self.samples, c)  # kept between searches, as the estimates
            if shared not in _CHOICES:
                if len(_CHOICES) > ESTIMATES_KEPT:
                    _CHOICES.clear()
                _CHOICES[shared] = next((i for i, cfg in enumerate(self.cfgs) if self._valid(cfg, c)), None)
            self.choice[c] = _CHOICES[shared]
        return self.choice[c] is not None

    def _valid(self, cfg: ModelConfig, c: Combo) -> bool:
        try:
            spec = self.spec(c, 1)
            check_fits_model(cfg, spec)
            if c.offload_optimizer:
                from .estimate.offload import check_offload_optimizer

                check_offload_optimizer(spec)
            if c.offload_activations:
                from .estimate.offload_act import check_offload_activations

                check_offload_activations(cfg, spec)
        except ConfigError:
            return False
        return True

    def micro_batches(self, c: Combo) -> list[int]:
        per_rank = self.samples // c.world
        if c.layout == "fsdp":  # accumulation with FSDP is not modelled (estimate_distributed): accum 1 only
            return [per_rank]
        if c.checkpointing in (None, "full"):
            return divisors(per_rank)
        from .cli.args import policy_estimated

        # a checkpointing policy the estimate does not model with accumulation (planner/estimate/ckpt_policy.py)
        return [m for m in divisors(per_rank) if policy_estimated(self.cfg_of(c), self.spec(c, m))]

    def peak(self, c: Combo, micro: int) -> tuple[int, int] | None:
        key = (c, micro)
        if key not in self.memo:
            shared = (self.keys[self.choice.get(c) or 0], self.seq_len, self.samples, c, micro)
            if shared not in _ESTIMATES:
                if len(_ESTIMATES) > ESTIMATES_KEPT:
                    _ESTIMATES.clear()
                self.estimates += 1
                _ESTIMATES[shared] = self._estimate(c, micro)
            self.memo[key] = _ESTIMATES[shared]
        return self.memo[key]

    def _estimate(self, c: Combo, micro: int) -> tuple[int, int] | None:
        spec = self.spec(c, micro)
        try:
            if c.layout == "single":
                from .estimate.training import estimate_training
                from .fit import host_bytes_of

                est = estimate_training(self.cfg_of(c), spec)
                host = host_bytes_of(est) + est.transients.get("paged_optimizer_state_not_counted", 0)
                return est.peak_bytes, host
            from .estimate.distributed import estimate_distributed

            est = estimate_distributed(self.cfg_of(c), spec, _pspec(c))
            paged = 0
            if c.optimizer in ("paged-adamw-8bit", "paged-adamw"):
                from .estimate.training import estimate_training

                paged = estimate_training(self.cfg_of(c), spec).transients.get("paged_optimizer_state_not_counted", 0)
            return est.peak_bytes, (est.host_bytes + paged) * c.world
        except ConfigError:
            return None


def _largest(values: list[int], fits: Callable[[int], bool], bisect: bool) -> int:
    """How many of `values` (ascending) fit, fits being monotone (true up to a point); bisect=False tries them all
    and answers the count up to the first that does not fit (the exhaustive enumeration)."""
    if not bisect:
        return max((i + 1 for i, v in enumerate(values) if fits(v)), default=0)
    if not values or not fits(values[0]):
        return 0
    lo, hi = 1, len(values)  # values[:lo] fit; values[hi:] do not (or are past the end)
    if fits(values[-1]):
        return len(values)
    hi -= 1
    while hi - lo > 0:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(values[mid - 1]) else (lo, mid - 1)
    return lo


def _plan(space: "_Space", c: Combo, micro: int, tb: int) -> Plan:
    peak, host = space.peak(c, micro)
    spec = space.spec(c, micro)
    cfg = space.cfg_of(c)
    return Plan(spec, cfg.attention, _pspec(c), peak, tb, host, quality_of(spec), combo=c, cfg=cfg)


def _lower_neighbours(c: Combo, members: set) -> list[Combo]:
    out = []
    for name in AXES:
        if name == "checkpointing" and (c.offload_activations or c.layout != "single"):
            # the saved tensors on the host: a policy's recompute can keep more (Qwen3-0.6B, bf16); FSDP2: selective
            # and every:K above none (Phi-3-mini, fp32, 2 ranks): the enumeration found
            continue
        for v in MEMORY_ORDER[name].get(c.axis(name), ()):
            n = c._replace(**{name: v})
            if n in members:
                out.append(n)
    return out


def _order_key(c: Combo) -> tuple:
    """A linear extension of the memory order (every lower neighbour before): the depth in each axis's order."""
    def depth(name, v):
        lower = MEMORY_ORDER[name].get(v, ())
        return 1 + max((depth(name, w) for w in lower), default=0)
    return tuple([*c.group, sum(depth(n, c.axis(n)) for n in AXES)])


def _as_price(value) -> dict:
    if isinstance(value, Mapping):
        return dict(value)
    return {"step_time_s": float(value)}


def search(cfg: ModelConfig, *, seq_len: int, tokens_per_step: int, budget: int, gpus: int = 1,
           host_ram: int | None = None, task: str = "finetune", allow=(), optimizer: str = "adamw",
           half: str = "bf16", time_of: TimeOf | None = None, prune: bool = True,
           combos: list[Combo] | None = None) -> SearchResult:
    """The search (see the module docstring). budget: one GPU's bytes; gpus: how many; host_ram: the host's bytes
    (None: not limited). combos: a space of one's own (tests), else combinations(). prune=False estimates every
    combination at every micro-batch (the exhaustive enumeration the tests compare with)."""
    from .fit import tensor_budget

    t0 = time.perf_counter()
    if seq_len <= 0 or tokens_per_step <= 0:
        raise ConfigError("the sequence length and the tokens per step must be positive")
    if tokens_per_step % seq_len:
        raise ConfigError(f"the tokens per step ({tokens_per_step:,}) must be a multiple of the sequence length "
                          f"({seq_len:,}): a step holds whole samples")
    if gpus < 1 or budget <= 0:
        raise ConfigError("the GPU count and the budget must be positive")
    samples = tokens_per_step // seq_len
    cfgs = [cfg]
    try:
        cfgs = [with_attention(cfg, "sdpa"), cfg] if cfg.attention != "sdpa" else cfgs
    except ConfigError:
        pass  # a family without sdpa keeps its own kernel
    check_fits_model(cfgs[0], TrainSpec(batch_size=1, seq_len=seq_len, device="cuda"))  # the context, the family's
    if combos is None:
        combos = combinations(cfgs[0], task, allow, gpus, samples, optimizer, half)
    space = _Space(cfgs, seq_len, samples)
    # validated lazily (the checks walk the model for LoRA): a pruned combination is never checked
    members = {c for c in combos if samples % c.world == 0}
    invalid = 0
    # Per estimated combination: its tensor budget, its device peak at its smallest micro-batch, and its largest
    # micro-batch whose device peak fits (0: none). Pruning compares peaks with the pruned one's own budget (the
    # allocator's reserve differs with checkpointing), and host RAM never prunes (an offload raises it).
    tb_of: dict = {}
    peak1: dict = {}   # combo -> (its smallest micro-batch, the device peak there: a lower bound where pruned)
    dev_max: dict = {}
    plans, smallest, pruned = [], None, 0  # smallest: the smallest peak estimated (after the loop)
    for c in sorted(members, key=_order_key):
        tb = tensor_budget(budget, "cuda", c.checkpointing is not None)
        # lower neighbours whose bytes bound this one's: those run with the preferred kernel (sdpa keeps no more than
        # the model's own: tests/test_search.py), or pruned on such bounds
        lower = [n for n in _lower_neighbours(c, members) if not space.choice.get(n)] if prune else []
        try:
            micros = space.micro_batches(c)
        except ConfigError:  # the spec itself refuses the combination
            invalid += 1
            continue
        if not micros:
            continue
        # a lower neighbour keeps no more bytes at any micro-batch: its peak at a micro-batch no larger than this
        # one's smallest, over this one's budget, prunes it; where its budget is no smaller, its largest fitting
        # micro-batch bounds this one's
        over = [peak1[n] for n in lower if n in peak1 and peak1[n][0] <= micros[0] and peak1[n][1] > tb]
        if over:
            peak1[c] = (micros[0], max(p for _, p in over))  # a lower bound, enough for its upper neighbours
            dev_max[c], tb_of[c] = 0, tb
            pruned += 1
            continue
        if not space.valid(c):
            invalid += 1
            continue
        cap = min((dev_max[n] for n in lower if n in dev_max and tb_of[n] >= tb), default=micros[-1])
        tb_of[c] = tb
        ok = [m for m in micros if m <= cap]

        def dev_fits(m: int) -> bool:
            got = space.peak(c, m)
            return got is not None and got[0] <= tb

        def host_fits(m: int) -> bool:
            return host_ram is None or space.peak(c, m)[1] <= host_ram

        top = micros[-1]  # accumulation 1: no gradients held between micro-batches, so its peak may be the lower
        # the largest fitting micro-batch: accumulation 1 first (one estimate when it fits: the peak at the others
        # then prunes no upper neighbour, theirs being no smaller and their budget no smaller), else bisected among
        # the accumulating ones (the peak grows with the micro-batch there, the gradients held in each)
        dev_top = top in ok and dev_fits(top)
        if dev_top and host_fits(top):
            dev_max[c] = top
            plans.append(_plan(space, c, top, tb))
            continue
        ends = [space.peak(c, m) for m in dict.fromkeys((micros[0], top))]
        ends = [e[0] for e in ends if e is not None]
        if not ends:
            continue  # not modelled: no memory fact to pass on
        # the lowest peak over its micro-batches: the smallest accumulating one's or accumulation 1's
        peak1[c] = (micros[0], min(ends))
        rest = [m for m in ok if m != top]
        n_dev = _largest(rest, dev_fits, prune)
        dev_max[c] = top if dev_top else rest[n_dev - 1] if n_dev else 0
        n_all = _largest(rest[:n_dev], host_fits, prune)
        if n_all:
            plans.append(_plan(space, c, rest[n_all - 1], tb))
    found = [(v[0], k) for k, v in space.memo.items() if v is not None]
    if found:  # the smallest device peak of every estimate made
        _, (c, m) = min(found, key=lambda f: (f[0], _order_key(f[1][0]), f[1][1]))
        smallest = _plan(space, c, m, tensor_budget(budget, "cuda", c.checkpointing is not None))
    stats = {"combinations": len(combos), "invalid": invalid, "estimates": space.estimates, "pruned": pruned,
             "fitting": len(plans), "seconds": time.perf_counter() - t0}
    return rank(cfg, plans, smallest, stats, tokens_per_step, time_of)


def rank(cfg: ModelConfig, plans: list[Plan], smallest: Plan | None, stats: dict, tokens_per_step: int,
         time_of: TimeOf | None) -> SearchResult:
    """Price the kept plans with time_of (once each) and answer: the fastest per quality class, best, the front."""
    plans = [dataclasses.replace(p) for p in plans]  # a copy each: a plan ranked again keeps its first prices
    timed = time_of is not None
    if timed:
        for p in plans:
            price = _as_price(time_of(p.cfg or cfg, p.spec, p.pspec))
            p.step_time_s = price["step_time_s"]
            p.flops_per_step = price.get("flops_per_step")
            p.tokens_per_s = price.get("tokens_per_s", tokens_per_step / p.step_time_s if p.step_time_s else None)
    key = _rank_key(timed)
    by_quality: dict[str, Plan] = {}
    for p in sorted(plans, key=key):
        by_quality.setdefault(p.quality, p)
    best = None
    for tier in (TASK_CLASSES, ("lora",), ("qlora",)):
        tier_plans = [by_quality[q] for q in tier if q in by_quality]
        if tier_plans:
            best = min(tier_plans, key=key)
            break
    pareto = pareto_front(plans) if timed else []
    return SearchResult(plans, best, by_quality, pareto, smallest, timed, stats)


def slowing_rank(p: Plan) -> int:
    """Without a time model: the cost rank (planner/fit.py CHANGES, the project's ordinal judgement) of the plan's
    changes that add work to a step. An ordinal, never a time."""
    from .fit import CHANGES

    s = p.spec
    keys = []
    if s.checkpointing:
        keys.append({"full": "checkpointing", "selective": "selective-checkpointing"}.get(
            s.checkpoint_policy, "every-k-checkpointing"))
    keys += [k for k in ("chunked-ce", "cce") if s.loss == k]
    keys += [k for k, on in (("offload-optimizer", s.offload_optimizer), ("offload-activations", s.offload_activations))
             if on]
    keys += ["grad-accum"] if s.grad_accum > 1 else []
    return sum(CHANGES[k][0] for k in keys)


def _rank_key(timed: bool):
    """Fastest (or cheapest changes) first, then the smaller peak; equal plans are told apart by their own flags, so
    the answer does not depend on the order the space was enumerated in (a set's order follows PYTHONHASHSEED)."""
    if timed:
        return lambda p: (p.step_time_s, p.peak_bytes, p.flags([]))
    return lambda p: (slowing_rank(p), p.spec.grad_accum, p.peak_bytes, p.flags([]))


def pareto_front(plans: list[Plan]) -> list[Plan]:
    """The plans no other is both faster (or as fast) and smaller than: fastest first, each smaller than the last."""
    out: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.step_time_s, p.peak_bytes, p.flags([]))):
        if not out or p.peak_bytes < out[-1].peak_bytes:
            out.append(p)
    return out


# ---------------------------------------------------------------- inference: weights x KV cache x batch

# Quality of a generate() plan, best first.
INFER_QUALITY = {
    "exact": "the weights in the checkpoint's dtype (or wider) and an unquantized KV cache",
    "16bit": "an fp32 checkpoint's weights cast to 16 bits",
    "8bit": "LLM.int8 weights (bitsandbytes), or the KV cache in fp8 (transformers' QuantizedCache)",
    "4bit": "NF4 weights (bitsandbytes; fp4 is left out: the same bytes, NF4 the better fit to normal weights, "
            "Dettmers et al. 2023)",
}
INFER_TIERS = (("exact", "16bit"), ("8bit",), ("4bit",))
# weight quantization searched: (quantize_weights, double_quant)
INFER_WEIGHTS = (("none", False), ("int8", False), ("nf4", False), ("nf4", True))
INFER_BATCH_LIMIT = 4096  # the largest batch searched (generate() calls of more prompts at once are rare)


@dataclass
class InferPlan:
    ispec: object               # planner.infer_spec.InferSpec
    attention: str
    peak_bytes: int
    budget_bytes: int
    host_bytes: int
    quality: str
    step_time_s: float | None = None   # the generate() call's
    flops_per_step: float | None = None
    tokens_per_s: float | None = None

    def flags(self, model_flags: list[str]) -> list[str]:
        """`python -m planner estimate|simulate|measure infer FLAGS` runs this plan as is."""
        s = self.ispec
        return (list(model_flags) + ["--batch-size", str(s.batch_size), "--prompt-len", str(s.prompt_len),
                                     "--new-tokens", str(s.new_tokens), "--precision", s.precision,
                                     "--attention", self.attention, "--cache", s.cache, "--quantize-weights",
                                     s.quantize_weights] + (["--double-quant"] if s.double_quant else [])
                + ["--device", s.device])

    def to_dict(self, model_flags: list[str]) -> dict:
        return {"flags": self.flags(model_flags), "peak_bytes": self.peak_bytes, "flops_per_step": self.flops_per_step,
                "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s, "quality": self.quality,
                "budget_bytes": self.budget_bytes, "host_bytes": self.host_bytes, "batch_size": self.ispec.batch_size}


def infer_quality(cfg: ModelConfig, ispec) -> str:
    from .config import checkpoint_dtype

    if ispec.quantize_weights in ("nf4", "fp4"):
        return "4bit"
    if ispec.quantize_weights == "int8" or ispec.cache == "quantized":
        return "8bit"
    wide = {"float32": 4, "bfloat16": 2, "float16": 2}
    same = ispec.param_dtype == checkpoint_dtype(cfg) or wide[ispec.param_dtype] > wide[checkpoint_dtype(cfg)]
    return "exact" if same else "16bit"


def search_infer(cfg: ModelConfig, *, prompt_len: int, new_tokens: int, budget: int, host_ram: int | None = None,
                 half: str = "bf16", time_of: TimeOf | None = None, batch_limit: int = INFER_BATCH_LIMIT) -> SearchResult:
    """Every weight precision x weight quantization x KV cache the family's generate() runs, each at its largest
    batch that fits (the peak grows with the batch: doubling, then bisection, planner/fit.py largest_fitting); the
    most tokens/s per quality class (INFER_QUALITY) and the front of peak against the call's time. Precisions: the
    checkpoint's dtype and the GPU's 16-bit float (fp32 for a 16-bit checkpoint is left out: the same maths, twice
    the bytes, slower)."""
    from .arch import family_of
    from .config import checkpoint_dtype
    from .estimate.inference import estimate_inference
    from .fit import largest_fitting, tensor_budget
    from .infer_spec import InferSpec, check_infer

    t0 = time.perf_counter()
    if prompt_len <= 0 or new_tokens <= 0:
        raise ConfigError("the prompt length and the new tokens must be positive")
    if budget <= 0:
        raise ConfigError("the budget must be positive")
    try:
        cfg = with_attention(cfg, "sdpa")
    except ConfigError:
        pass
    tb = tensor_budget(budget, "cuda")
    ckpt = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[checkpoint_dtype(cfg)]
    precisions = tuple(dict.fromkeys((half,) if ckpt != "fp32" else ("fp32", half)))
    if ckpt != "fp32" and ckpt != half:  # a bf16 checkpoint on a GPU without bf16: fp16 (and fp32, exact)
        precisions = ("fp32", half)
    caches = family_of(cfg).infer_caches(cfg)
    estimates = 0
    memo: dict = {}

    def at(ispec):
        nonlocal estimates
        if ispec not in memo:
            estimates += 1
            try:
                est = estimate_inference(cfg, ispec)
                memo[ispec] = (est["peak_bytes"], est.get("host_kv_cache_bytes", 0))
            except ConfigError:
                memo[ispec] = None
        return memo[ispec]

    plans, n, invalid = [], 0, 0
    for prec in precisions:
        for q, dq in INFER_WEIGHTS:
            for cache in caches:
                n += 1
                one = lambda b: InferSpec(batch_size=b, prompt_len=prompt_len, new_tokens=new_tokens, precision=prec,
                                          cache=cache, quantize_weights=q, device="cuda", double_quant=dq)
                try:
                    check_infer(cfg, one(1))
                except ConfigError:
                    invalid += 1
                    continue

                def fits(b: int) -> bool:
                    got = at(one(b))
                    return got is not None and got[0] <= tb and (host_ram is None or got[1] <= host_ram)

                if not fits(1):
                    continue
                b = largest_fitting(fits, 1, batch_limit)
                peak, host = at(one(b))
                ispec = one(b)
                plans.append(InferPlan(ispec, cfg.attention, peak, tb, host, infer_quality(cfg, ispec)))
    found = [(v[0], k) for k, v in memo.items() if v is not None]
    smallest = None
    if found:
        peak, ispec = min(found, key=lambda f: f[0])
        smallest = InferPlan(ispec, cfg.attention, peak, tb, memo[ispec][1], infer_quality(cfg, ispec))
    timed = time_of is not None
    if timed:
        for p in plans:
            price = _as_price(time_of(cfg, p.ispec, None))
            p.step_time_s = price["step_time_s"]
            p.flops_per_step = price.get("flops_per_step")
            p.tokens_per_s = price.get("tokens_per_s", p.ispec.batch_size * new_tokens / p.step_time_s
                                       if p.step_time_s else None)
        key = lambda p: (-p.tokens_per_s, p.peak_bytes)
    else:  # the memory side only: the most prompts at once, then the smallest peak (an ordinal, never a rate)
        key = lambda p: (-p.ispec.batch_size, p.peak_bytes)
    by_quality: dict = {}
    for p in sorted(plans, key=key):
        by_quality.setdefault(p.quality, p)
    best = None
    for tier in INFER_TIERS:
        tier_plans = [by_quality[q] for q in tier if q in by_quality]
        if tier_plans:
            best = min(tier_plans, key=key)
            break
    pareto = []
    if timed:
        for p in sorted(plans, key=lambda p: (p.step_time_s / p.ispec.batch_size, p.peak_bytes)):
            if not pareto or p.peak_bytes < pareto[-1].peak_bytes:
                pareto.append(p)  # per-token time against peak: fastest first, each smaller than the last
    stats = {"combinations": n, "invalid": invalid, "estimates": estimates, "pruned": 0, "fitting": len(plans),
             "seconds": time.perf_counter() - t0}
    return SearchResult(plans, best, by_quality, pareto, smallest, timed, stats)
