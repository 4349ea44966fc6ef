"""Everything the Planner page shows for one set of settings, in one call (no torch, no streamlit).

The page reads its widgets, calls plan() once and renders the result. What a slider move does not change
is memoised per model and run settings: a batch move reuses the largest batch and the batch curve, a
sequence move the longest sequence and the sequence curve. With a ParallelSpec (DDP or FSDP2 at a world
size) every figure is per rank, the largest rank's (planner.estimate.distributed), and the fit adds the
fewest devices of the budget's size; the single-device advice is not offered there.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .accounting import per_config
from .config import ModelConfig
from .estimate.training import TrainEstimate, estimate_training
from .fit import (Option, advice, cuda_context_bytes, fewest_ranks, max_batch_per_rank, max_batch_size, max_seq_len,
                  max_seq_per_rank, tensor_budget, unranked)
from .spec import TrainSpec

CURVE_POINTS = 25
BATCH_LIMIT = 1 << 20  # max_batch_size's search limit


@dataclass
class RankPlan:
    """The per-rank side of a data-parallel plan."""
    estimate: object           # planner.estimate.distributed.DistEstimate (the largest rank's figures on top)
    fewest_ranks: int          # the fewest devices of the budget's size that fit (0: none)
    fewest_reason: str


@dataclass
class Plan:
    estimate: TrainEstimate
    budget_bytes: int          # as given (typed or the default)
    cuda_context_bytes: int    # taken off the budget on cuda, as its own line
    tensor_budget_bytes: int   # what the estimated peak is compared with
    breakdown: list[dict]      # scenario, component, bytes
    max_batch: int
    max_batch_reason: str
    max_seq: int
    max_seq_reason: str
    advice: list[Option]
    batch_curve: list[dict]    # batch, peak_bytes
    seq_curve: list[dict]      # seq, peak_bytes
    rank: RankPlan | None = None  # data parallel: the per-rank figures (then max_batch etc. are per rank)
    unranked: list[dict] = dataclasses.field(default_factory=list)  # a CPU run's offloads (fit.unranked): one RAM
    cfg: ModelConfig | None = None  # the model as the run uses it (planner.spec.prepare)
    spec: TrainSpec | None = None
    parallel: object = None         # the planner.parallel.ParallelSpec, or None for one device
    layout_choice: dict | None = None  # data parallel (plan_training): planner.fit.choose_layout's answer

    @property
    def peak_bytes(self) -> int:
        return self.rank.estimate.peak_bytes if self.rank else self.estimate.peak_bytes

    @property
    def peak_phase(self) -> str:
        return self.rank.estimate.peak_phase if self.rank else self.estimate.peak_phase

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.tensor_budget_bytes

    @property
    def margin_bytes(self) -> int:
        """How far the peak is under (fits) or over the budget for tensors."""
        return abs(self.tensor_budget_bytes - self.peak_bytes)

    @property
    def host_activation_bytes(self) -> int:
        """--offload-activations: the host RAM the offloaded activations hold (not in the device's peak); 0 without."""
        return self.estimate.transients.get("host_activation_offload", 0)

    @property
    def host_optimizer_bytes(self) -> int:
        """--offload-optimizer on one device: the host RAM of the offloaded optimizer (parameter and grad copies,
        AdamW's states; not in the device's peak); 0 without (a data-parallel run says its host bytes per rank)."""
        return 0 if self.rank else self.estimate.transients.get("host_optimizer_offload", 0)

    @property
    def cpu_ram_bytes(self) -> int | None:
        """A cpu run with the optimizer on the host: the device is this machine's RAM too, so both add up; None
        otherwise."""
        if not self.host_optimizer_bytes or self.spec is None or self.spec.device_type != "cpu":
            return None
        return self.peak_bytes + self.host_optimizer_bytes

    @property
    def advice_host(self) -> bool:
        """An option offloads to the host: its host RAM is a column of its own."""
        return any(o.host_bytes for o in self.advice)

    def term_rows(self) -> list[dict]:
        """Every term of the estimate: name, formula, per_layer, bytes and, for a per-layer term, its bytes over
        the model's layers (`bytes (x L if per layer)`); a data-parallel run's per-rank terms as they are."""
        if self.rank:
            return list(self.rank.estimate.terms)
        layers = self.cfg.layers if self.cfg is not None else 1
        return [{"name": t["name"], "formula": t["formula"], "per_layer": t["per_layer"], "bytes": t["bytes"],
                 "bytes (x L if per layer)": t["bytes"] * (layers if t["per_layer"] else 1)}
                for t in self.estimate.terms]

    def phase_rows(self) -> list[dict]:
        """phase, bytes: each phase's peak (per rank with data parallelism), then the one-device estimate's
        transients as `transient: NAME`."""
        if self.rank:
            return [{"phase": k, "bytes": v} for k, v in self.rank.estimate.phase_peak_bytes.items()]
        return ([{"phase": k, "bytes": v} for k, v in self.estimate.phase_peak_bytes.items()]
                + [{"phase": f"transient: {k}", "bytes": v} for k, v in self.estimate.transients.items()])

    def published_context(self, reference) -> list[dict]:
        """The longest context at each budget of a published table (planner.reference.LongestContext) at this
        plan's settings, beside the published columns (longest_context below); asked only when the page shows it."""
        return longest_context(self.cfg, self.spec, reference)

    @property
    def allocator_reserve_bytes(self) -> int:
        """On cuda, what the fit keeps free for the caching allocator's reserve (planner/fit.py ALLOCATOR_RESERVE)."""
        return self.budget_bytes - self.cuda_context_bytes - self.tensor_budget_bytes


def nice_ceil(x: float) -> int:
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above x (an axis end a reader can take in)."""
    step = 1
    while True:
        for m in (1, 2, 2.5, 5):
            if m * step >= x and m * step == int(m * step):
                return int(m * step)
        step *= 10


def curve_end(crossing: int, current: int, limit: int, floor: int = 8) -> int:
    """Where a curve's x axis ends: the limit (the model's context) when everything up to it fits, else
    twice the largest value that fits (rounded up to a nice number), so the budget line stays readable;
    never before the current setting."""
    end = limit if crossing >= limit else nice_ceil(2 * max(crossing, 1))
    return min(max(end, floor, current), limit)


def _points(end: int) -> list[int]:
    return sorted({max(1, round(end * i / (CURVE_POINTS - 1))) for i in range(CURVE_POINTS)})


@per_config
def _sweep(cfg: ModelConfig, spec: TrainSpec, field: str, end: int, pspec=None) -> list[dict]:
    """The estimated peak (per rank with a ParallelSpec) at CURVE_POINTS values of one setting (batch_size
    or seq_len) from 1 to end."""
    key = "batch" if field == "batch_size" else "seq"
    return [{key: v, "peak_bytes": _peak(cfg, dataclasses.replace(spec, **{field: v}), pspec)} for v in _points(end)]


def _peak(cfg: ModelConfig, spec: TrainSpec, pspec) -> int:
    if pspec is None:
        return estimate_training(cfg, spec).peak_bytes
    from .estimate.distributed import estimate_distributed

    return estimate_distributed(cfg, spec, pspec).peak_bytes


def breakdown(est: TrainEstimate, grad_accum: int) -> list[dict]:
    """Two bars: what is alive at the peak (by component), and each component's full size."""
    persistent = {"params": est.params_bytes, "buffers": est.buffers_bytes, "inputs": est.inputs_bytes,
                  "optimizer": est.optimizer_bytes}
    at_peak = dict(persistent)
    rest = est.peak_bytes - sum(persistent.values())
    if est.peak_phase in ("optimizer", "zero_grad") or grad_accum > 1:
        at_peak["grads"] = est.grads_bytes
        rest -= est.grads_bytes
    if est.peak_phase in ("forward", "loss", "backward"):
        at_peak["activations"] = min(est.activations_bytes, max(rest, 0))
        rest -= at_peak["activations"]
    at_peak["transients"] = max(rest, 0)
    totals = {**persistent, "grads": est.grads_bytes, "activations": est.activations_bytes}
    return ([{"scenario": f"at the peak ({est.peak_phase})", "component": k, "bytes": v} for k, v in at_peak.items()]
            + [{"scenario": "each component's full size", "component": k, "bytes": v} for k, v in totals.items()])


def rank_breakdown(est) -> list[dict]:
    """One rank's bar (the largest rank's): what is alive at its peak, by component."""
    persistent = {"params": est.params_bytes, "buffers": est.buffers_bytes, "inputs": est.inputs_bytes,
                  "optimizer": est.optimizer_bytes, "comm buffers": est.comm_buffers_bytes}
    rest = max(est.peak_bytes - sum(persistent.values()), 0)
    acts = min(est.activations_bytes, rest) if est.peak_phase in ("forward", "loss", "backward") else 0
    at_peak = {**persistent, "activations": acts, "transients": rest - acts}
    return [{"scenario": f"rank {est.peak_rank} at its peak ({est.peak_phase})", "component": k, "bytes": v}
            for k, v in at_peak.items() if v or k in ("params", "optimizer")]


def plan(cfg: ModelConfig, spec: TrainSpec, budget: int, pspec=None) -> Plan:
    """cfg: the model as the run uses it (planner.spec.prepare); budget: the memory budget in bytes (of one
    device); pspec: a planner.parallel.ParallelSpec for per-rank figures, or None for one device."""
    est = estimate_training(cfg, spec)
    usable = tensor_budget(budget, spec.device, spec.checkpointing)
    # Each side is memoised without the setting it sweeps, so moving that slider reuses it.
    any_batch, any_seq = dataclasses.replace(spec, batch_size=1), dataclasses.replace(spec, seq_len=1)
    rank = None
    if pspec is None:
        best_batch, batch_reason = max_batch_size(cfg, any_batch, usable)
        best_seq, seq_reason = max_seq_len(cfg, any_seq, usable)
        bars, options = breakdown(est, spec.grad_accum), advice(cfg, spec, usable)
        info = unranked(cfg, spec)
    else:
        from .estimate.distributed import estimate_distributed

        dist = estimate_distributed(cfg, spec, pspec)
        rank = RankPlan(dist, *fewest_ranks(cfg, spec, pspec, usable))
        best_batch, batch_reason = max_batch_per_rank(cfg, any_batch, pspec, usable)
        best_seq, seq_reason = max_seq_per_rank(cfg, any_seq, pspec, usable)
        bars, options, info = rank_breakdown(dist), [], []
    batch_end = curve_end(best_batch, spec.batch_size, BATCH_LIMIT)
    seq_end = curve_end(best_seq, spec.seq_len, cfg.max_seq_len)
    return Plan(estimate=est, budget_bytes=budget, cuda_context_bytes=cuda_context_bytes(spec.device),
                tensor_budget_bytes=usable, breakdown=bars,
                max_batch=best_batch, max_batch_reason=batch_reason, max_seq=best_seq, max_seq_reason=seq_reason,
                advice=options, batch_curve=_sweep(cfg, any_batch, "batch_size", batch_end, pspec),
                seq_curve=_sweep(cfg, any_seq, "seq_len", seq_end, pspec), rank=rank, unranked=info,
                cfg=cfg, spec=spec, parallel=pspec)


def plan_training(cfg: ModelConfig, run: dict, batch: int, seq: int, attention: str | None, budget: int,
                  parallel: dict | None = None) -> Plan:
    """The Planner page's one call: the settings as its widgets give them (run: TrainSpec's other fields;
    parallel: ParallelSpec's fields, or None for one device), checked as the CLI checks them (ConfigError, one
    line), then plan(); with a data-parallel layout, the layout that fits in the fewest devices too."""
    from .config import ConfigError
    from .parallel import ParallelSpec, check_parallel_run, check_wrappable
    from .spec import prepare

    spec = TrainSpec(batch_size=int(batch), seq_len=int(seq), **run)
    run_cfg = prepare(cfg, spec, attention)
    pspec = ParallelSpec(**parallel) if parallel else None
    if pspec:
        check_parallel_run(spec, pspec)
        check_wrappable(run_cfg, pspec)
    if spec.offload_optimizer:  # planner/estimate/offload.py decides what is modelled (adam / adamw, ...)
        from .estimate.offload import check_offload_optimizer

        check_offload_optimizer(spec)
    if spec.offload_activations:  # planner/estimate/offload_act.py decides what is modelled; one line here
        from .estimate.offload_act import check_offload_activations

        if pspec:
            raise ConfigError("--offload-activations with --world-size / --parallel is not modelled yet")
        check_offload_activations(run_cfg, spec)
    p = plan(run_cfg, spec, budget, pspec)
    if pspec:
        from .fit import choose_layout

        p.layout_choice = choose_layout(run_cfg, spec, p.tensor_budget_bytes, pspec)
    return p


# ---------------------------------------------------------------- a user's own module (no formula family)

@dataclass
class ModulePlan:
    """The what-if answers for a --module model (planner.whatif: every op's live bytes fitted in b and s)."""
    peak_bytes: int
    peak_phase: str
    peak_op: str
    phase_peak_bytes: dict[str, int]
    budget_bytes: int
    max_batch: int
    max_batch_reason: str
    max_seq: int
    max_seq_reason: str
    batch_curve: list[dict]
    seq_curve: list[dict]
    # issue #20: how far the fit's answers can be trusted (planner.whatif WhatIf.status / bound_bytes / describe)
    status: str = "unvalidated"      # exact | approximate | unvalidated
    bound_bytes: int | None = None   # 0 when exact; the largest error seen at held-out points when approximate
    description: str = ""            # the basis and the held-out check, one line
    has_seq: bool = True             # False: the step does not depend on s (sliders: batch only)
    simulated_points: int = 0        # how many simulated (b, s) points the fit was made from (a saved fit's)
    validation_rows: list[dict] = dataclasses.field(default_factory=list)  # held-out point: batch, seq, fitted_bytes,
    #                                  simulated_bytes, error_bytes (a saved fit's check, planner.whatif)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget_bytes

    @property
    def margin_bytes(self) -> int:
        """How far the peak is under (fits) or over the budget."""
        return abs(self.budget_bytes - self.peak_bytes)


def module_plan(fit, batch: int, seq: int, budget: int, seq_limit: int) -> ModulePlan:
    """fit: a saved fit (WhatIf.save_dict() from `simulate whatif`, or a DepthWhatIf's), or the fit itself;
    every answer is a polynomial evaluation."""
    from .fitted import load_fit

    w = load_fit(fit) if isinstance(fit, dict) else fit
    saved = fit if isinstance(fit, dict) else {}
    peak, phase, op = w.peak(batch, seq)
    best_batch, batch_reason = w.max_batch(seq, budget, BATCH_LIMIT)
    best_seq, seq_reason = w.max_seq(batch, budget, seq_limit)
    first = 1 if w.covers_batch_one() else 2
    batch_end = curve_end(best_batch, batch, BATCH_LIMIT)
    seq_end = curve_end(best_seq, seq, seq_limit)
    return ModulePlan(peak, phase, op, w.phase_peak_bytes(batch, seq), budget, best_batch, batch_reason, best_seq,
                      seq_reason,
                      [{"batch": b, "peak_bytes": w.peak_bytes(b, seq)} for b in _points(batch_end) if b >= first],
                      [{"seq": s, "peak_bytes": w.peak_bytes(batch, s)} for s in _points(seq_end)] if w.has_seq else [],
                      w.status, w.bound_bytes, w.describe(), w.has_seq,
                      sum(len(f["points"]) for f in saved.get("fits", [])),
                      list((saved.get("validation") or {}).get("rows") or []))


def check_point(fit: dict, record: dict, batch: int, seq: int) -> dict:
    """A simulation or measurement of one point beside what the saved fit answers there: the record with
    fitted_bytes (the fit's peak at batch, seq) and fit_error_pct (the fit against the record, planner.compare)."""
    from .compare import error_pct

    fitted = module_plan(fit, batch, seq, 1, max(seq, 1)).peak_bytes
    return {**record, "fitted_bytes": fitted, "fit_error_pct": error_pct(fitted, record["peak_bytes"])}


@dataclass
class FittedPlan:
    """The Planner page for a model no formula family reads (issue #20): the settings checked, and the kept
    fit's answers (planner/fitted.py), or none yet (plan None: the page offers to make the fit)."""
    cfg: ModelConfig               # the model as the run uses it
    spec: TrainSpec
    budget_bytes: int              # as given
    tensor_budget_bytes: int       # what the fitted peak is compared with (less the CUDA context on cuda)
    plan: ModulePlan | None = None
    info: dict = dataclasses.field(default_factory=dict)  # the fit's own facts (simulations, param_count)

    @property
    def context_taken(self) -> bool:
        """The budget for tensors is less than the budget given (the CUDA context is off it)."""
        return self.tensor_budget_bytes != self.budget_bytes


def plan_fitted(cfg: ModelConfig, run: dict, batch: int, seq: int, attention: str | None, budget: int,
                parallel: dict | None = None) -> FittedPlan:
    """ConfigError (one line) for settings the model cannot take (no data-parallel layouts without a formula
    family); ValueError when the kept fit does not cover batch 1 (planner.whatif)."""
    from .config import ConfigError
    from .fitted import cached_fit
    from .spec import prepare

    if parallel:
        raise ConfigError(f"{cfg.model_type}: data-parallel layouts need a formula family; choose one device")
    spec = TrainSpec(batch_size=int(batch), seq_len=int(seq), **run)
    run_cfg = prepare(cfg, spec, attention)
    usable = tensor_budget(budget, spec.device)
    got = cached_fit(run_cfg, spec)
    if got is None:
        return FittedPlan(run_cfg, spec, budget, usable)
    what, info = got
    return FittedPlan(run_cfg, spec, budget, usable, module_plan(what, int(batch), int(seq), usable, cfg.max_seq_len),
                      info)


# ---------------------------------------------------------------- the longest context, beside published figures

def longest_context(cfg: ModelConfig, spec: TrainSpec, reference) -> list[dict]:
    """For each budget of a published table (planner.reference.LongestContext, GB read as GiB of device
    memory, the CUDA context taken off on cuda): the longest sequence this estimate fits at spec's batch and
    settings (up to the model's context), beside the published columns, which are theirs, not ours."""
    rows = []
    for row in reference.rows():
        # the tensors alone against each published budget (no allocator reserve: a published maximum is a run
        # that did fit, and the reserve depends on the allocator's settings, e.g. expandable_segments)
        usable = tensor_budget(row["budget_gb"] * 2**30, spec.device)
        seq, reason = max_seq_len(cfg, dataclasses.replace(spec, seq_len=1), usable)
        rows.append({**row, "this estimate": seq, "why": reason})
    return rows


# The plan search on the Planner page (issue #35 item 4): the question at the top of the page (model, GPU and
# count, task, sequence, tokens per step) answered by planner/search.py's search priced by the roofline, and how
# the answer differs from the settings beneath it. The search takes seconds cold, so each question is searched
# once per process (SEARCH_MEMO questions kept): a slider move below asks the same question and reuses it.
SEARCH_MEMO = 32
_searches: dict[tuple, object] = {}
TASK_LABELS = {"finetune": "fine-tune", "train": "train from scratch"}
# The settings a plan sets, in the words of the page's controls (TrainSpec's fields, then the attention and layout).
PLAN_FIELDS = {"batch_size": "batch size", "grad_accum": "grad. accumulation", "precision": "precision",
               "optimizer": "optimizer", "optimizer_impl": "optimizer implementation", "device": "device",
               "loss": "loss", "checkpointing": "checkpointing", "checkpoint_policy": "checkpointing policy",
               "offload_optimizer": "optimizer on the host", "offload_activations": "activations on the host",
               "train_layers": "blocks that train", "lora_r": "LoRA rank", "lora_targets": "LoRA targets",
               "quantize_base": "4-bit base", "double_quant": "double quant."}


@dataclass
class SearchView:
    """What the top of the Planner page shows: the plan the search answers for the question, or the refusal."""
    gpu_label: str
    gpus: int
    gpu_bytes: int              # one GPU's memory (the budget)
    tensor_budget_bytes: int    # what the plan's peak was compared with (the context and the allocator's reserve off)
    fits: bool
    peak_bytes: int             # the plan's peak per device; nothing fits: the smallest peak found (0: none modelled)
    lacks_bytes: int            # nothing fits: what the smallest peak is over its budget by (0 when it fits)
    margin_bytes: int           # it fits: what is left of the budget for tensors (0 when nothing fits)
    quality: str                # the plan's quality class (planner.search.QUALITY)
    quality_why: str
    tokens_per_s: float | None  # the roofline's (planner/estimate/compute.py price), None without a time model
    step_time_s: float | None
    flags: list[str]            # `python -m planner estimate|simulate|measure train FLAGS` runs it as is
    changes: list[dict]         # setting, yours, the plan's: what the plan changes from the settings beneath
    apply: dict                 # {"spec": TrainSpec fields, "attention", "parallel": layout and world or None}
    searched: str               # the search's size and time, one line


def _searched(cfg: ModelConfig, gpu_name: str, gpus: int, task: str, allow: tuple, seq_len: int,
              tokens_per_step: int, host_ram: int):
    """planner/search.py search for one question, memoised (the key is the question, the config by its contents)."""
    import json

    from .cli.plan import _half, time_model
    from .config import config_to_dict
    from .gpus import gpu as catalog_gpu
    from .search import search

    key = (json.dumps(config_to_dict(cfg), sort_keys=True, default=str), gpu_name, gpus, task, allow, seq_len,
           tokens_per_step, host_ram)
    if key not in _searches:
        g = catalog_gpu(gpu_name)
        res = search(cfg, seq_len=seq_len, tokens_per_step=tokens_per_step, budget=g.memory_bytes, gpus=gpus,
                     host_ram=host_ram, task=task, allow=allow, half=_half(g), time_of=time_model(g))
        while len(_searches) >= SEARCH_MEMO:
            _searches.pop(next(iter(_searches)))
        _searches[key] = (g, res)
    return _searches[key]


def plan_search_view(cfg: ModelConfig, model_flags: list[str], gpu_name: str, gpus: int, task: str, allow_lora: bool,
                     seq_len: int, tokens_per_step: int, host_ram: int, current: dict, attention: str,
                     parallel: dict | None) -> SearchView:
    """The plan for the page's question (tokens_per_step 0: one sample of seq_len, the CLI's default), and what it
    changes from `current` (TrainSpec's fields but batch and sequence, plus batch_size), `attention` and `parallel`
    (ParallelSpec's fields or None). ConfigError: a question the search refuses (it says why)."""
    from .search import QUALITY

    tokens = tokens_per_step or seq_len
    allow = ("lora", "qlora") if allow_lora and task == "finetune" else ()
    g, res = _searched(cfg, gpu_name, gpus, task, allow, seq_len, tokens, host_ram)
    st = res.stats
    searched = (f"{st.get('fitting', len(res.plans))} of {st['combinations']} combinations fit, "
                f"{st['estimates']} estimated, in {st['seconds']:.1f} s (planner/search.py)")
    p = res.best
    if p is None:
        small = res.smallest
        return SearchView(g.label, gpus, g.memory_bytes, small.budget_bytes if small else 0, False,
                          small.peak_bytes if small else 0,
                          max(0, small.peak_bytes - small.budget_bytes) if small else 0, 0,
                          small.quality if small else "", QUALITY.get(small.quality, "") if small else "",
                          None, None, small.flags(model_flags) if small else [], [], {}, searched)
    plan_spec = dataclasses.asdict(p.spec)
    current = {**{f.name: f.default for f in dataclasses.fields(TrainSpec) if f.default is not dataclasses.MISSING},
               **current}  # a setting the page leaves out is TrainSpec's default, as in the CLI
    changes = [{"setting": label, "yours": current.get(field), "plan": plan_spec[field]}
               for field, label in PLAN_FIELDS.items() if current.get(field) != plan_spec[field]
               and not (field == "checkpoint_policy" and not plan_spec["checkpointing"])
               and not (field == "lora_targets" and not plan_spec["lora_r"])]
    if attention != p.attention:
        changes.append({"setting": "attention", "yours": attention, "plan": p.attention})
    plan_par = ({"parallel": p.pspec.parallel, "world_size": p.pspec.world_size} if p.pspec is not None else None)
    yours_par = ({"parallel": parallel["parallel"], "world_size": parallel["world_size"]} if parallel else None)
    if plan_par != yours_par:
        def said(x):
            return f"{x['parallel']} x{x['world_size']}" if x else "one device"
        changes.append({"setting": "layout", "yours": said(yours_par), "plan": said(plan_par)})
    rows = [{**c, "yours": "off" if c["yours"] is False else "on" if c["yours"] is True else str(c["yours"]),
             "plan": "off" if c["plan"] is False else "on" if c["plan"] is True else str(c["plan"])} for c in changes]
    return SearchView(g.label, gpus, g.memory_bytes, p.budget_bytes, True, p.peak_bytes, 0,
                      p.budget_bytes - p.peak_bytes, p.quality,
                      QUALITY[p.quality], p.tokens_per_s, p.step_time_s, p.flags(model_flags), rows,
                      {"spec": plan_spec, "attention": p.attention, "parallel": plan_par,
                       "budget_gib": g.memory_bytes / 2 ** 30}, searched)
