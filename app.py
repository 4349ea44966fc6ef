"""Torch Memory Planner - the Planner page (home): will it fit, and what do I change so it fits?

Run: streamlit run app.py
What-if sliders re-estimate instantly (planner.plan, arithmetic only; no torch here); measurements run as
child processes from the Training step and Weight loading pages. Every setting is in the URL
(`/?model=llama-3.2-1b&budget_gib=24&batch=1&seq=2048`), and session state decides what each widget
shows, so the figures always come from exactly the settings on the screen.
"""
import dataclasses

import pandas as pd
import psutil
import streamlit as st

from pages import frame, machine_budget, md_escape
from planner.charts import breakdown_spec, curve_spec, rank_groups_spec
from planner.compare import error_pct
from planner.config import ATTENTION_KINDS, PRESETS, ConfigError, config_to_dict, model_label
from planner.fitted import is_fitted
from planner.finetune import DEFAULT_LORA_R, TUNE_MODES, describe_targets, target_choices, tune_fields, tune_mode
from planner.parallel import sequence_parallel_applies
from planner.gpus import GPUS
from planner.plan import TASK_LABELS, plan_fitted, plan_search_view, plan_training
from planner.infer_spec import INFER_PRECISIONS, InferSpec, infer_args
from planner.jobs import Job, JobBusy
from planner.reference import UNSLOTH_LLAMA31_8B
from planner.serving import (CACHE_HELP, VLLM_GPU_MEMORY_UTILIZATION, WEIGHT_QUANT_HELP, cache_choices, plan_inference,
                             weight_quant_choices)
from planner.spec import LOSSES, OPTIMIZER_IMPLS, OPTIMIZERS, PRECISIONS, TrainSpec
from planner.store import RunStore
from planner.units import bytes_to_gib, fmt_bytes, gib_to_bytes

PHASE_WHY = {
    "forward": "the forward pass, with every saved activation and the logits alive",
    "loss": "the loss, where the logits and the log-softmax output (`b*s*V` each) coexist",
    "backward": "backward: the saved activations plus the gradients being produced "
                "(at the start, the cross-entropy's `b*s*V` gradients; later, a block's working set)",
    "optimizer": "`optimizer.step()`: weights + gradients + optimizer states + the update's temporaries",
    "zero_grad": "just before `zero_grad()`: weights + gradients + optimizer states",
}
# Where the page starts: batch and sequence here; every other setting is TrainSpec's default, as in the CLI,
# and the attention is the model's own (its config's), as the CLI uses without --attention.
START = TrainSpec(batch_size=4, seq_len=512)
SEQ_CAP = 32768  # the slider's top for long-context models (a typed URL may not exceed the model's context)
OPTION_KEYS = {"batch": "batch_size", "seq": "seq_len", "precision": "precision", "optimizer": "optimizer",
               "opt_impl": "optimizer_impl", "accum": "grad_accum", "ckpt": "checkpointing",
               "loss": "loss", "ckpt_policy": "checkpoint_policy", "offload_opt": "offload_optimizer",
               "offload_act": "offload_activations"}
# Checkpointing policies (planner/checkpointing.py): full, torchtitan's selective op policy, every K-th block
CKPT_POLICIES = ["full", "selective", "every:2", "every:3", "every:4", "every:8"]
QUANT_TYPES = ["nf4", "fp4"]  # bitsandbytes' 4-bit types (BitsAndBytesConfig bnb_4bit_quant_type)
GOALS = ["training", "inference"]
# The plan search's question at the top of the page (issue #35): the GPU the page starts with is the 24 GB card of
# the canonical question (Llama-3.1-8B on an RTX 4090, torchtune's published runs, planner/reference.py).
START_GPU = "rtx-4090"
# Where the inference mode starts (every other setting is InferSpec's default, as in `estimate infer`).
START_INFER = InferSpec(batch_size=1, prompt_len=512, new_tokens=128)
INFER_PHASE_WHY = {
    "prefill": "the prefill: the whole prompt's forward, its working set beside the prompt's KV cache",
    "decode": "decoding: the KV cache grown to the last token, one token's forward and its logits",
}

state = st.session_state


LAYOUTS = ["one device", "ddp", "fsdp", "tp", "fsdp+tp"]
MP_CHOICES = {"none": None, "bf16": "bfloat16", "fp16": "float16"}


@st.fragment
def planner(cfg, model: str, run: dict, attention: str, par: dict | None, seq: int | None = None) -> None:
    """The batch, sequence and budget, and every figure: moving one of these reruns only this fragment.
    run (TrainSpec's other fields), attention and par (ParallelSpec's fields, or None for one device): the
    settings above it, which change only in a full rerun. seq: the sequence of the question at the top (its
    slider is there), else the slider is drawn here."""
    default_bytes, default_source = machine_budget(run["device"])
    default_gib = bytes_to_gib(default_bytes)
    if state.get("budget_gib") == state.get("budget_default") != default_gib:
        state["budget_gib"] = default_gib  # an untyped budget follows the device's default
    state["budget_default"] = default_gib
    c1, c2, c3 = st.columns(3)
    batch = c1.slider("Batch size", 1, 256, START.batch_size, key="batch", bind="query-params")
    if seq is None:
        seq = seq_slider(c2, cfg)
    budget_gib = c3.number_input("Memory budget (GiB)", 0.1, 4096.0, default_gib, step=0.5, key="budget_gib",
                                 bind="query-params")
    c3.caption(("Default: " if budget_gib == default_gib else "Typed here; the default is ")
               + f"{default_gib} GiB, {default_source}.")

    budget = gib_to_bytes(budget_gib)
    try:  # the settings checked as the CLI checks them, and every figure below (planner/plan.py)
        p = plan_training(cfg, run, batch, seq, attention, budget, par)
    except ConfigError as exc:
        st.error(str(exc))
        return
    est, spec, pspec = p.estimate, p.spec, p.parallel
    state["run_settings"] = {"spec": dataclasses.asdict(spec), "attention": attention, "budget": budget,
                             "parallel": dataclasses.asdict(pspec) if pspec else None}

    per = " per rank" if pspec else ""
    m1, m2, m3 = st.columns(3)
    m1.metric(f"Estimated peak{per}", fmt_bytes(p.peak_bytes),
              delta=f"{'fits' if p.fits else 'over'} by {fmt_bytes(p.margin_bytes)}",
              delta_color="normal" if p.fits else "inverse")
    m2.metric(("Budget for tensors" if p.cuda_context_bytes else "Budget") + (" (one device)" if pspec else ""),
              fmt_bytes(p.tensor_budget_bytes))
    m3.metric("Peak phase", p.peak_phase)
    lines = [f"The peak falls in {PHASE_WHY[p.peak_phase]}."]
    if pspec:
        d = p.rank.estimate
        lines += [f"{pspec.label}: the largest rank's figures (rank {d.peak_rank}), batch {spec.batch_size} per rank; "
                  f"the same run on one device: {fmt_bytes(est.peak_bytes)}."]
        if d.host_bytes:
            lines.append(f"Host RAM per rank for the offloaded shards and optimizer: {fmt_bytes(d.host_bytes)}.")
        lines += [md_escape(note) for note in d.notes]
    else:
        lines += [md_escape(note) for note in est.notes]
    if p.host_activation_bytes:  # --offload-activations: the host is a budget of its own
        lines.append(f"Host RAM for the offloaded activations: {fmt_bytes(p.host_activation_bytes)} "
                     "(not in the peak above, which is the device figure: for the CUDA check).")
    if p.host_optimizer_bytes:  # --offload-optimizer: its host line
        lines.append(f"Host RAM for the offloaded optimizer (parameter and grad copies, AdamW's states): "
                     f"{fmt_bytes(p.host_optimizer_bytes)} (not in the peak above, which is the device's)"
                     + (f"; on a cpu device both are this machine's RAM: {fmt_bytes(p.cpu_ram_bytes)} with the "
                        "peak above (the plain-torch equivalent of torchao measured here, unpinned copies)."
                        if p.cpu_ram_bytes is not None else "."))
    if p.cuda_context_bytes:
        reserve = (f" − the allocator's reserve {fmt_bytes(p.allocator_reserve_bytes)} (blocks it caches beyond the "
                   "tensors: the worst share of a training peak measured on an H200, docs/gpu.md)"
                   if p.allocator_reserve_bytes else "")
        lines.insert(0, f"Budget {fmt_bytes(budget)} − CUDA context {fmt_bytes(p.cuda_context_bytes)} (driver and "
                        f"kernels, outside PyTorch's allocator, so not in the estimate){reserve} = "
                        f"{fmt_bytes(p.tensor_budget_bytes)} for tensors.")
    st.caption("  \n".join(lines))
    st.vega_lite_chart(breakdown_spec(p.breakdown))
    if pspec:
        groups = p.rank.estimate.rank_groups
        st.vega_lite_chart({**rank_groups_spec(groups, p.tensor_budget_bytes), "height": 40 + 32 * len(groups)})
        st.caption("Ranks whose shards are the same size share one bar. Red dashed line: the budget of one device.")

    st.subheader("Fit the budget")
    if pspec:
        f1, f2, f3 = st.columns(3)
        f3.metric(f"Fewest devices of {fmt_bytes(p.tensor_budget_bytes)}", p.rank.fewest_ranks or "none",
                  help=md_escape(p.rank.fewest_reason))
    else:
        f1, f2 = st.columns(2)
    f1.metric(f"Largest batch{per} that fits", p.max_batch, help=md_escape(p.max_batch_reason))
    f2.metric(f"Longest sequence at batch {spec.batch_size}{per}", p.max_seq, help=md_escape(p.max_seq_reason))
    options = {o.label: {"spec": o.spec, "attention": o.attention} for o in p.advice}
    if pspec:
        st.caption(f"{md_escape(p.rank.fewest_reason)}. The single-device options are not offered for a data-parallel "
                   "run: change the world size or the layout above, or choose one device.")
        choice = p.layout_choice
        best = choice["best"]
        st.metric("Layout with the fewest devices", f"{best['layout']} x{best['devices']}" if best else "none",
                  help=md_escape(choice["reason"]))
        st.dataframe(pd.DataFrame([{"layout": c["layout"], "fewest devices": c["devices"] or "none",
                                    "why": c["reason"]} for c in choice["candidates"]]), hide_index=True, width="stretch")
    elif options:
        hosted = p.advice_host  # an offload: its host RAM is a budget of its own, beside
        st.dataframe(pd.DataFrame([{"option": o.label, "peak": fmt_bytes(o.peak_bytes),
                                    **({"host RAM": fmt_bytes(o.host_bytes) if o.host_bytes else ""} if hosted else {}),
                                    "fits": "yes" if o.fits else "no", "cost": o.cost} for o in p.advice]),
                     hide_index=True, width="stretch")
        if hosted:
            st.caption(f"Peak: the device's. Host RAM: what the offloads hold on the host, a budget of its own; this "
                       f"machine has {fmt_bytes(psutil.virtual_memory().total)} of RAM (psutil), the training "
                       "machine's host is what counts.")
        choice = st.selectbox("Option", list(options), key="advice_choice")
        b1, b2 = st.columns(2)
        if b1.button("Apply to the settings", key="apply"):
            state["apply_option"] = options[choice]
            st.rerun()  # the whole page: the settings above this fragment change too
        if b2.button("Measure this option", key="measure_option"):
            state["run_settings"] = {**options[choice], "budget": budget, "parallel": None}
            state["autostart"] = True
            st.switch_page("pages/1_training.py", query_params={"model": model})  # the bound settings stay here
    else:
        st.caption("No single change or combination lowers this estimated peak.")
    for u in p.unranked:  # a CPU run: the offloads move nothing out of the one RAM (planner.fit.unranked)
        st.caption(f"{md_escape(u['label'])}: {md_escape(u['why'])}.")

    published = UNSLOTH_LLAMA31_8B
    if model == published.model and spec.lora_r:
        box = st.expander(f"Longest context at each GPU size, beside {published.source}", key="published_open",
                          on_change="rerun")
        if box.open:
            rows = p.published_context(published)
            box.dataframe(pd.DataFrame([{"GPU (GiB)": r["budget_gb"],
                                         f"this estimate (your settings, batch {spec.batch_size})": f"{r['this estimate']:,}",
                                         **{f"{k} (theirs)": ("OOM" if r[k] is None else f"{r[k]:,}")
                                            for k in published.columns}, "why": r["why"]} for r in rows]),
                          hide_index=True, width="stretch")
            box.caption(f"Their columns are their published figures, not measurements of ours: {published.setting} "
                        f"([source]({published.url})); Unsloth's own column uses its offloaded checkpointing and "
                        "fused loss. Ours is this estimate of transformers + peft + bitsandbytes at the settings above, "
                        "on the budget less the CUDA context, up to the model's context.")

    st.subheader("Peak against batch size and sequence length")
    k1, k2 = st.columns(2)
    k1.vega_lite_chart(curve_spec(p.batch_curve, "batch", p.tensor_budget_bytes, f"Batch size{per}"))
    k2.vega_lite_chart(curve_spec(p.seq_curve, "seq", p.tensor_budget_bytes,
                                  f"Sequence length (batch {spec.batch_size}{per})"))
    st.caption(f"Red dashed line: the budget{' for tensors' if p.cuda_context_bytes else ''} (left out where the "
               "curve stays below a third of it).")

    # Drawn only while open (a slider move then redraws two tables fewer).
    terms_box = st.expander("Every term and its formula, and each phase's peak", key="terms_open", on_change="rerun")
    if terms_box.open:
        terms_box.dataframe(pd.DataFrame(p.term_rows()), hide_index=True, width="stretch")
        terms_box.dataframe(pd.DataFrame([{"phase": r["phase"], "peak": fmt_bytes(r["bytes"]), "bytes": r["bytes"]}
                                          for r in p.phase_rows()]), hide_index=True, width="stretch")


def seq_slider(where, cfg) -> int:
    seq_max = min(cfg.max_seq_len, SEQ_CAP)
    return where.slider("Sequence length", 1, seq_max, min(START.seq_len, seq_max), key="seq", bind="query-params",
                        help=f"Up to the model's context ({cfg.max_seq_len:,})"
                             + (f", shown up to {SEQ_CAP:,}" if cfg.max_seq_len > SEQ_CAP else ""))


def plan_answer(cfg, model: str, question: dict, current: dict, attention: str, par: dict | None) -> None:
    """The plan search's answer to the question at the top (planner/plan.py plan_search_view, memoised there), and
    what it changes from the settings beneath; Apply sets them to the plan's, Simulate runs it on fake tensors."""
    model_flags = ["--model", model] if model in PRESETS else ["--config", "CONFIG.json"]
    try:
        v = plan_search_view(cfg, model_flags, current=current, attention=attention, parallel=par,
                             host_ram=psutil.virtual_memory().total, **question)
    except ConfigError as exc:  # a question the search refuses: said here, the settings beneath still answer
        st.warning(str(exc))
        return
    on = f"{v.gpus} x {v.gpu_label}" if v.gpus > 1 else v.gpu_label
    if not v.fits:
        st.warning(f"Nothing in the searched space fits the {on}: the smallest peak found is {fmt_bytes(v.peak_bytes)} "
                 f"against {fmt_bytes(v.tensor_budget_bytes)} for tensors, {fmt_bytes(v.lacks_bytes)} short"
                 + (f" ({v.quality}: {md_escape(v.quality_why)})." if v.quality else "."))
        if v.flags:
            st.code("python -m planner estimate train " + " ".join(v.flags), language="bash", wrap_lines=True)
        st.caption(v.searched)
        return
    per = " per GPU" if v.gpus > 1 else ""
    m1, m2, m3 = st.columns([1.2, 1.4, 1.2])
    m1.metric("The plan: fits", v.quality, help=md_escape(v.quality_why))
    m2.metric(f"Peak{per} against the {v.gpu_label}", fmt_bytes(v.peak_bytes),
              delta=f"fits by {fmt_bytes(v.margin_bytes)} of {fmt_bytes(v.tensor_budget_bytes)} for tensors",
              delta_arrow="off", help=f"{fmt_bytes(v.gpu_bytes)} less the CUDA context and the allocator's reserve")
    m3.metric("Tokens/s (roofline)", f"{v.tokens_per_s:,.0f}" if v.tokens_per_s else "not modelled",
              help=(f"{v.step_time_s:.2f} s per step: " if v.step_time_s else "")
              + "a roofline over the GPU's published peak rates (planner/estimate/compute.py), not a measurement")
    st.markdown("**What it changes from your settings:** " + " · ".join(
        f"{c['setting']} {md_escape(c['yours'] or 'none')} → **{md_escape(c['plan'])}**" for c in v.changes)
        if v.changes else "The plan is your settings.")
    b1, b2, _ = st.columns([1, 1, 3])
    b1.button("Apply the plan", key="apply_plan", type="primary", disabled=not v.changes,
              on_click=state.update, kwargs={"apply_option": v.apply}, help="sets the settings below to the plan's")
    if b2.button("Simulate the plan", key="simulate_plan",
                 help="the Training step page runs the plan on fake tensors at full size (no memory used)"):
        state["run_settings"] = {"spec": v.apply["spec"], "attention": v.apply["attention"],
                                 "budget": v.gpu_bytes, "parallel": v.apply["parallel"]}
        state["autostart"] = "simulate"
        st.switch_page("pages/1_training.py", query_params={"model": model})
    st.caption(f"{v.searched}. The plan as a command: `python -m planner estimate train {' '.join(v.flags)}`")


@st.fragment
def inference_planner(cfg, ispec_fields: dict, attention: str) -> None:
    """The batch, prompt, new tokens and budget of one generate() call, and every figure (planner.serving)."""
    top = cfg.max_seq_len
    default_bytes, default_source = machine_budget(ispec_fields["device"])
    default_gib = bytes_to_gib(default_bytes)
    c1, c2, c3, c4 = st.columns(4)
    batch = c1.number_input("Batch (sequences)", 1, 65536, START_INFER.batch_size, key="infer_batch", bind="query-params")
    prompt = c2.number_input("Prompt tokens", 1, max(1, top - 1), min(START_INFER.prompt_len, top - 1), key="prompt",
                             bind="query-params", help=f"prompt + new tokens up to the model's context ({top:,})")
    new = c3.number_input("New tokens", 1, max(1, top - 1), min(START_INFER.new_tokens, top - 1), key="new_tokens",
                          bind="query-params")
    budget_gib = c4.number_input("Memory budget (GiB)", 0.1, 4096.0, default_gib, step=0.5, key="infer_budget_gib",
                                 bind="query-params")
    c4.caption(f"Default: {default_gib} GiB, {default_source}.")
    try:
        ispec = InferSpec(batch_size=int(batch), prompt_len=int(prompt), new_tokens=int(new), **ispec_fields)
        p = plan_inference(cfg, ispec, gib_to_bytes(budget_gib), attention, psutil.virtual_memory().available)
    except ConfigError as exc:
        st.error(str(exc))
        return
    est = p.estimate
    m1, m2, m3 = st.columns(3)
    m1.metric("Estimated peak of generate()", fmt_bytes(p.peak_bytes),
              delta=f"{'fits' if p.fits else 'over'} by {fmt_bytes(p.margin_bytes)}",
              delta_color="normal" if p.fits else "inverse")
    m2.metric("Budget for tensors" if p.cuda_context_bytes else "Budget", fmt_bytes(p.tensor_budget_bytes))
    m3.metric("Peak phase", est["peak_phase"])
    lines = [f"The peak falls in {INFER_PHASE_WHY[est['peak_phase']]}."] + [md_escape(n) for n in est.get("notes", [])]
    if p.quantized_weights:  # the weights term names what bitsandbytes holds
        held, weights = p.quantized_weights
        lines.append(md_escape(f"Weights {fmt_bytes(weights)}: {held} (bitsandbytes via "
                               f"BitsAndBytesConfig, computing in {ispec.precision})."))
    if p.cuda_context_bytes:
        lines.insert(0, f"Budget {fmt_bytes(p.budget_bytes)} − CUDA context {fmt_bytes(p.cuda_context_bytes)} = "
                        f"{fmt_bytes(p.tensor_budget_bytes)} for tensors.")
    st.caption("  \n".join(lines))
    st.vega_lite_chart(breakdown_spec(p.breakdown))
    st.subheader("Serving capacity")
    f1, f2, f3 = st.columns(3)
    f1.metric(f"Largest batch at {ispec.total_len:,} tokens", p.max_batch, help=md_escape(p.max_batch_reason))
    f2.metric(f"Longest context at batch {ispec.batch_size}", f"{p.max_context:,}", help=md_escape(p.max_context_reason))
    if not est["kv_cache_bytes_per_token"]:  # the book's generate_text_simple keeps no cache
        f3.metric("KV cache tokens that fit", "no cache", help="this generation recomputes the whole context per token")
    else:
        f3.metric("KV cache tokens that fit", f"{p.kv_tokens:,}",
                  help=f"beside the weights and this run's working set; vLLM's rule ({VLLM_GPU_MEMORY_UTILIZATION:.0%} "
                       f"of the budget, gpu_memory_utilization): {p.kv_tokens_vllm:,} tokens")
        st.caption(f"KV cache: {fmt_bytes(est['kv_cache_bytes_per_token'])} per token and sequence. vLLM's own figure "
                   f"for this budget would be about {p.kv_tokens_vllm:,} tokens (its rule, not a measurement of ours: "
                   f"it plans the cache in {VLLM_GPU_MEMORY_UTILIZATION:.0%} of the device).")
    if p.advice:
        st.dataframe(pd.DataFrame([{"change": c.label, "peak": fmt_bytes(c.peak_bytes), "fits": "yes" if c.fits else "no",
                                    "cost": c.cost} for c in p.advice]), hide_index=True, width="stretch")
    else:
        st.caption("No single change lowers this estimated peak.")
    k1, k2 = st.columns(2)
    k1.vega_lite_chart(curve_spec(p.batch_curve, "batch", p.tensor_budget_bytes, f"Batch ({ispec.total_len:,} tokens)"))
    k2.vega_lite_chart(curve_spec(p.context_curve, "context", p.tensor_budget_bytes,
                                  f"Context: prompt + {ispec.new_tokens} new (batch {ispec.batch_size})"))
    state["infer_run"] = {"ispec": dataclasses.asdict(ispec), "attention": attention, "config": config_to_dict(p.cfg),
                          "estimate": est}
    b1, b2 = st.columns([1, 4])
    busy = "infer_job" in state
    here = p.measurable_here  # the CLI's guard for a CPU measurement
    b1.button("Measure this generation", disabled=busy or not here, on_click=start_generation, args=("measure",),
              key="infer_measure", help="runs generate() for real in a child process on this machine"
              + ("" if here else f" (not offered: it needs a CPU run within {fmt_bytes(p.measure_limit_bytes)} of "
                                 "this machine's RAM)"))
    no_sim = p.simulate_refusal  # int8 weights: bitsandbytes cannot wrap a fake tensor
    b2.button("Simulate", disabled=busy or bool(no_sim), on_click=start_generation, args=("simulate",),
              key="infer_simulate", help="the same generate() on fake tensors: exact live bytes at any size, no memory "
                                         "used" + (f" (not offered: {no_sim})" if no_sim else ""))
    terms_box = st.expander("Every term and its formula, and each phase's peak", key="infer_terms_open", on_change="rerun")
    if terms_box.open:
        terms_box.dataframe(pd.DataFrame(est["terms"])[["name", "formula", "bytes"]], hide_index=True, width="stretch")
        terms_box.dataframe(pd.DataFrame([{"phase": k, "peak": fmt_bytes(v), "bytes": v}
                                          for k, v in est["phase_peak_bytes"].items()]), hide_index=True, width="stretch")


def start_generation(kind: str) -> None:
    """`python -m planner measure|simulate infer ...` for the settings on the screen (a background job)."""
    run = state["infer_run"]
    args = [kind, "infer", *infer_args(InferSpec(**run["ispec"])), "--attention", run["attention"], "--json",
            "--progress", "--timeout", "600"]
    try:
        state["infer_job"] = Job(args, timeout_s=630, config=run["config"]).start()
        state["infer_job_run"] = {**run, "kind": kind}
        state.pop("infer_result", None)
    except JobBusy as exc:
        state["infer_job_message"] = str(exc)


def generation_panel() -> None:
    """A running measure / simulate of the generation (progress, cancel), then its record beside the estimate;
    every finished run is kept on the Runs page with its kind."""
    if msg := state.pop("infer_job_message", None):
        st.warning(msg)
    job = state.get("infer_job")
    if job is not None:
        status = job.state()
        if status == "running":
            fraction, stage = job.progress()
            st.progress(min(max(fraction, 0.0), 1.0), text=f"Running: {stage}")
            if st.button("Cancel", key="infer_cancel"):
                job.cancel()
                status = job.state()
        if status == "running":
            return
        # finished: kept on the Runs page, then the page is redrawn (the panel stops polling)
        run, record = state.pop("infer_job_run"), job.result() or {}
        status = "failed" if status == "done" and "peak_bytes" not in record else status
        est = run["estimate"]
        RunStore().save("infer", model_label(state["model_cfg"], state["model_id"]),
                        {**run["ispec"], "attention": run["attention"]}, run["ispec"]["device"], est["peak_bytes"],
                        record.get("peak_bytes"), {"kind": run["kind"], **record}, status)
        state["infer_result"] = {"status": status, "record": record, "estimate": est, "kind": run["kind"],
                                 "stderr": job.stderr()}
        del state["infer_job"]
        st.rerun()
    res = state.get("infer_result")
    if not res:
        return
    rec, est, what = res["record"], res["estimate"], ("Simulated" if res["kind"] == "simulate" else "Measured")
    if res["status"] == "cancelled":
        st.info("Cancelled: every process of the run has ended; it is listed on the Runs page as cancelled.")
    elif res["status"] != "done":
        st.error(f"{res['status'].capitalize()}: {rec.get('error', 'no result')}")
    else:
        r1, r2, r3 = st.columns(3)
        r1.metric(f"{what} peak", fmt_bytes(rec["peak_bytes"]), help=f"phase: {rec.get('peak_phase')}")
        r2.metric("Estimated peak", fmt_bytes(est["peak_bytes"]), help=f"phase: {est['peak_phase']}")
        r3.metric("Error", f"{error_pct(est['peak_bytes'], rec['peak_bytes']):+.2f}%")


def inference_mode(cfg, gpu) -> None:
    """The settings of a generate() call that change only in a full rerun, then the fragment."""
    caches, top = cache_choices(cfg), cfg.max_seq_len
    if state.get("cache") not in caches:  # another model's cache choice (the book's GPT-2 keeps none)
        state["cache"] = caches[0]
    for key, start in (("prompt", START_INFER.prompt_len), ("new_tokens", START_INFER.new_tokens)):
        if state.get(key, 0) > top - 1:  # a longer context than this model's
            state[key] = min(start, top - 1)
    i1, i2, i3, i4 = st.columns([2, 1.2, 1.2, 1.2])
    precision = i1.segmented_control("Weights", INFER_PRECISIONS, default=START_INFER.precision, required=True,
                                     key="infer_precision", bind="query-params", width="stretch")
    cache = i2.selectbox("KV cache", caches, key="cache", bind="query-params",  # the family's list (planner)
                         help="; ".join(f"{c}: {CACHE_HELP.get(c, 'transformers cache class')}" for c in caches))
    device = i3.selectbox("Device", ["cuda", "cpu"] if gpu else ["cpu", "cuda"], key="infer_device", bind="query-params")
    attention = i4.selectbox("Attention", ATTENTION_KINDS, ATTENTION_KINDS.index(cfg.attention), key="infer_attention",
                             bind="query-params", help=f"This model's own: {cfg.attention}")
    quants = weight_quant_choices(cfg, device)  # what this model on this device can take (planner.serving)
    if state.get("infer_quant") not in quants:  # another model's or device's choice
        state["infer_quant"] = quants[0]
    w1, w2, _ = st.columns([2, 1.2, 2.4])
    quant = w1.segmented_control("Weight quantization", quants, default=quants[0], required=True, key="infer_quant",
                                 bind="query-params", width="stretch",
                                 help="bitsandbytes, as transformers' BitsAndBytesConfig loads the model (every linear "
                                      "but the head; compute in the precision above). "
                                      + "; ".join(f"{q}: {WEIGHT_QUANT_HELP[q]}" for q in quants)
                                      + ("" if len(quants) > 1 else ". Not offered for this model: "
                                         "it is not a transformers model, or its linears miss the device's 4-bit kernel"))
    four_bit = quant in ("nf4", "fp4")
    double_quant = w2.toggle("Double quant.", False, key="infer_double_quant", bind="query-params", disabled=not four_bit,
                             help="bnb_4bit_use_double_quant: the 4-bit weights' absmax itself in 8 bits")
    inference_planner(cfg, {"precision": precision, "cache": cache, "device": device, "quantize_weights": quant,
                            "double_quant": bool(double_quant) and four_bit}, attention)
    if "infer_job" in state or "infer_result" in state:  # polled every second while a job runs
        st.fragment(run_every=1.0 if "infer_job" in state else None)(generation_panel)()


def start_fit(spec: TrainSpec, attention: str, run_cfg) -> None:
    """`python -m planner estimate train --json --progress ...` for a fitted model: its child simulates every point
    and keeps the fit in the data folder (planner/fitted.py), where the page then reads it."""
    from planner.spec import run_args

    args = ["estimate", "train", *run_args(spec), "--attention", attention, "--json", "--progress", "--timeout", "600"]
    try:
        state["fit_job"] = Job(args, timeout_s=1800, config=config_to_dict(run_cfg)).start()
    except JobBusy as exc:
        state["fit_job_message"] = str(exc)


@st.fragment(run_every=1.0)
def fit_job_panel() -> None:
    job = state.get("fit_job")
    if job is None:
        return
    status = job.state()
    if status == "running":
        fraction, stage = job.progress()
        st.progress(min(max(fraction, 0.0), 1.0), text=f"Fitting: {stage}")
        if st.button("Cancel", key="fit_cancel"):
            job.cancel()
            status = job.state()
    if status != "running":
        record = job.result() or {}
        if status != "done" or "peak_bytes" not in record:
            state["fit_job_message"] = ("Cancelled: every process of the fit has ended." if status == "cancelled" else
                                        f"The fit {status}: {record.get('error', job.stderr()[-300:] or 'no result')}")
        del state["fit_job"]
        st.rerun()


@st.fragment
def fitted_planner(cfg, run: dict, attention: str, par: dict | None) -> None:
    """The Planner for a model no formula family reads (planner/arch/auto.py): every figure from a fit of
    simulations of transformers' own model (planner/fitted.py), labelled as such, with the fit's own check."""
    seq_max = min(cfg.max_seq_len, SEQ_CAP)
    default_bytes, default_source = machine_budget(run["device"])
    default_gib = bytes_to_gib(default_bytes)
    c1, c2, c3 = st.columns(3)
    batch = c1.slider("Batch size", 1, 256, START.batch_size, key="batch", bind="query-params")
    seq = c2.slider("Sequence length", 1, seq_max, min(START.seq_len, seq_max), key="seq", bind="query-params")
    budget_gib = c3.number_input("Memory budget (GiB)", 0.1, 4096.0, default_gib, step=0.5, key="budget_gib",
                                 bind="query-params")
    c3.caption(f"Default: {default_gib} GiB, {default_source}.")
    budget = gib_to_bytes(budget_gib)
    try:  # the settings checked, and the kept fit's answers (planner/plan.py plan_fitted)
        fp = plan_fitted(cfg, run, batch, seq, attention, budget, par)
    except ConfigError as exc:
        st.error(str(exc))
        return
    except ValueError as exc:  # batch 1 not covered by the fit
        fp, fit_error = None, str(exc)
    if msg := state.pop("fit_job_message", None):
        st.warning(msg)
    if fp is None:
        st.error(fit_error)
        return
    spec, run_cfg = fp.spec, fp.cfg
    if fp.plan is None:
        st.info(f"No formula family reads `{cfg.model_type}`: its estimate is a **fitted simulation**, a fit of "
                "transformers' own model simulated on fake tensors at a few small points in a child process (a deep "
                "model at 2, 3 and 4 layers, extrapolated to its depth and checked at full depth), made once for "
                "these settings and kept. About half a minute for a 7B-class model.")
        st.button("Fit by simulation", type="primary", disabled="fit_job" in state, key="fit_start",
                  on_click=start_fit, args=(spec, attention, run_cfg))
        if "fit_job" in state:
            fit_job_panel()
        return
    p, info, usable = fp.plan, fp.info, fp.tensor_budget_bytes
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("Estimated peak (fitted simulation)", fmt_bytes(p.peak_bytes),
              delta=f"{'fits' if p.fits else 'over'} by {fmt_bytes(p.margin_bytes)}",
              delta_color="normal" if p.fits else "inverse",
              help="basis: fitted simulation (no formula family reads this model_type)")
    m2.metric("Budget for tensors" if fp.context_taken else "Budget", fmt_bytes(usable))
    m3.metric("Peak phase", p.peak_phase, help=f"at op {p.peak_op}")
    m4.metric("Fit check", {"exact": "exact", "approximate": f"± {fmt_bytes(p.bound_bytes or 0)}",
                            "unvalidated": "unvalidated"}[p.status],
              help="the fit against held-out points simulated at the model's full depth, never fitted")
    if p.status != "exact":
        st.warning(md_escape(f"Approximate: {p.description}. This peak is {p.peak_bytes:,} B ± "
                             f"{p.bound_bytes or 0:,} B; simulate the point (Training step page) for the exact figure."))
    n = info.get("param_count")
    st.caption(md_escape(f"Basis: fitted simulation, not formulas: {p.description}. "
                         f"{info.get('simulations', '?')} simulations"
                         + (f"; {n:,} parameters" if n else "") + "."))
    f1, f2 = st.columns(2)
    f1.metric("Largest batch that fits", p.max_batch, help=md_escape(p.max_batch_reason))
    f2.metric(f"Longest sequence at batch {spec.batch_size}", p.max_seq, help=md_escape(p.max_seq_reason))
    k1, k2 = st.columns(2)
    k1.vega_lite_chart(curve_spec(p.batch_curve, "batch", usable, "Batch size (fitted simulation)"))
    k2.vega_lite_chart(curve_spec(p.seq_curve, "seq", usable, f"Sequence length (batch {spec.batch_size}, fitted)"))
    st.dataframe(pd.DataFrame([{"phase": k, "peak (fitted)": fmt_bytes(v), "bytes": v}
                               for k, v in p.phase_peak_bytes.items()]), hide_index=True, width="stretch")


cfg = frame("Planner")
st.title("Planner: will it fit?")
model, gpu = state["model_id"], state["machine_gpu"]
goal = st.segmented_control("Plan for", GOALS, default=GOALS[0], required=True, key="goal", bind="query-params",
                            help="training: one training or fine-tuning step; inference: one generate() call")
if goal == "inference":
    inference_mode(cfg, gpu)
    st.stop()
# The widgets start at START (a link's values win over it); session state then decides what each shows, and
# is set here by an applied option and when the model changes (its own attention, a sequence within its
# context), and by the fragment when the device changes an untyped budget's default.
if option := state.pop("apply_option", None):
    state.update({key: option["spec"][field] for key, field in OPTION_KEYS.items()}, attention=option["attention"])
    tuned = option["spec"]
    state["tune"] = tune_mode(TrainSpec(**tuned))
    if tuned["lora_r"]:
        picked = [k for k, v in target_choices(cfg).items() if v == tuned["lora_targets"]]
        state.update(lora_r=tuned["lora_r"], **({"lora_targets": picked[0]} if picked else {}))
    if tuned.get("quantize_base", "none") != "none":
        state.update(quant=tuned["quantize_base"], double_quant=tuned["double_quant"])
    state["device"] = tuned["device"]
    if "parallel" in option:  # the plan search's plan: its layout and its GPU's memory
        laid = option["parallel"]
        state["parallel"] = laid["parallel"] if laid else LAYOUTS[0]
        if laid:
            state["world"] = laid["world_size"]
        state["budget_gib"] = option["budget_gib"]
targets = target_choices(cfg)
if state.get("planner_model", model) != model:
    state["attention"] = cfg.attention
    state["seq"] = min(state.get("seq", START.seq_len), min(cfg.max_seq_len, SEQ_CAP))
    if state.get("lora_targets") not in targets:
        state["lora_targets"] = next(iter(targets))
    state["train_last"] = min(state.get("train_last", 1), cfg.layers)
state["planner_model"] = model

fitted = is_fitted(cfg)  # issue #20: no formula family reads it, so no plan search either
if not fitted:  # the question, and the plan search's answer at once beneath it (filled once the settings are read)
    st.markdown(f"**Will {md_escape(state.get('model_name') or model)} train on this GPU?** (the model: in the "
                "sidebar)")
    a1, a2, a3, a4 = st.columns([2.4, 0.8, 1.8, 1.4])
    # The catalog's names, as `plan --gpu` takes them (a bound widget's URL value is the option as shown)
    gpu_name = a1.selectbox("GPU", list(GPUS), list(GPUS).index(START_GPU), key="gpu", bind="query-params",
                            help="the GPU catalog (planner/gpus.py): "
                                 + "; ".join(f"{n}: {g.label}" for n, g in GPUS.items()))
    gpus = a2.number_input("N of them", 1, 1024, 1, key="gpus", bind="query-params",
                           help="data-parallel layouts (DDP, FSDP2) up to this many ranks")
    task = a3.segmented_control("Task", list(TASK_LABELS), default="finetune", required=True, key="task",
                                bind="query-params", width="stretch", help="as `plan --task` takes it: "
                                + "; ".join(f"{k}: {v}" for k, v in TASK_LABELS.items()))
    allow = a4.toggle("Allow LoRA / QLoRA", False, key="allow", bind="query-params", disabled=task != "finetune",
                      help="a different fine-tune the search may answer when the full one does not fit or is slower")
    s1, s2 = st.columns([3, 1.2])
    seq = seq_slider(s1, cfg)
    tokens = s2.number_input("Tokens per step (0: one sample)", 0, 1 << 30, 0, step=seq, key="tokens_per_step", bind="query-params",
                             help="tokens per optimizer step, held by every plan (micro-batch x accumulation x ranks "
                                  "x sequence); 0: one sample of the sequence length")
    question = {"gpu_name": gpu_name, "gpus": int(gpus), "task": task, "allow_lora": bool(allow), "seq_len": int(seq),
                "tokens_per_step": int(tokens)}
    answer = st.container(border=True)
    st.subheader("Adjust the settings")

r1, r2, r3 = st.columns([3, 1.2, 1.2])
qlora = state.get("tune", st.query_params.get("tune")) == "qlora"
if qlora:  # bitsandbytes computes in bf16 (planner/finetune.py check_quantize_settings): the control shows it
    state["precision"] = "bf16"
precision = r1.segmented_control("Precision", PRECISIONS, default=START.precision, required=True,
                                 key="precision", bind="query-params", width="stretch", disabled=qlora,
                                 help="QLoRA computes in bf16" if qlora else None)
device = r2.selectbox("Device", ["cuda", "cpu"] if gpu else ["cpu", "cuda"], key="device", bind="query-params")
ckpt = r3.toggle("Checkpointing", START.checkpointing, key="ckpt", bind="query-params",
                 help="per-block activation checkpointing")
r4, r5, r6, r7 = st.columns(4)
optimizer = r4.selectbox("Optimizer", OPTIMIZERS, OPTIMIZERS.index(START.optimizer), key="optimizer",
                         bind="query-params")
impl = r5.selectbox("Optimizer implementation", OPTIMIZER_IMPLS, OPTIMIZER_IMPLS.index(START.optimizer_impl),
                    key="opt_impl", bind="query-params",
                    help="default: PyTorch's pick (foreach on cuda, for-loop on the CPU); "
                         "fused: one kernel per parameter group")
attention = r6.selectbox("Attention", ATTENTION_KINDS, ATTENTION_KINDS.index(cfg.attention), key="attention",
                         bind="query-params", help=f"This model's own: {cfg.attention}")
accum = r7.number_input("Grad. accumulation", 1, 1024, START.grad_accum, key="accum", bind="query-params")
q1, q2, q3, q4, q5 = st.columns(5)
layout = q1.selectbox("Data parallel", LAYOUTS, key="parallel", bind="query-params",
                      help="ddp: DistributedDataParallel (a replica per rank); fsdp: FSDP2 fully_shard on every block "
                           "and the root (weights, grads and optimizer state sharded); tp: tensor parallel over every "
                           "rank (torchtitan's plan, Llama-style models); fsdp+tp: FSDP2 over ranks / TP groups of TP "
                           "ranks (a 2-D mesh). Figures are then per rank.")
world = q2.number_input("Ranks (devices)", 1, 65536, 8, key="world", bind="query-params", disabled=layout == LAYOUTS[0],
                        help="the world size; the batch above is per rank")
reshard = q3.toggle("Reshard", True, key="reshard", bind="query-params", disabled=layout != "fsdp",
                    help="FSDP2 reshard_after_forward: free each block's gathered weights after its forward (on ~ ZeRO-3, off ~ ZeRO-2)")
mp = q4.selectbox("FSDP mixed precision", list(MP_CHOICES), key="mp", bind="query-params", disabled=layout != "fsdp",
                  help="MixedPrecisionPolicy(param_dtype=...): FSDP casts the fp32 weights it gathers (needs precision fp32)")
offload = q5.toggle("CPU offload", False, key="offload", bind="query-params", disabled=layout != "fsdp",
                    help="FSDP2 CPUOffloadPolicy: sharded weights, grads and optimizer state in host RAM")
p1, p2, p3, _ = st.columns([1, 1, 1, 2])
tp_size = p1.number_input("TP size", 2, 64, 2, key="tp", bind="query-params", disabled=layout != "fsdp+tp",
                          help="fsdp+tp: ranks per tensor-parallel group (the 2-D mesh's inner size; divides the ranks)")
loss_par = p2.toggle("Loss parallel", False, key="loss_parallel", bind="query-params",
                     disabled=layout not in ("tp", "fsdp+tp"),
                     help="torch's loss_parallel(): the head's output stays sharded on the vocabulary")
seq_par = p3.toggle("Sequence parallel", False, key="sequence_parallel", bind="query-params",
                    disabled=not sequence_parallel_applies(layout),
                    help="torchtitan's SequenceParallel on the norms (it applies it by default): the residual stream "
                         "and the norms' saved tensors sharded on the sequence; tp only")
t1, t2, t3, t4, t5 = st.columns([2.2, 1, 2, 1, 1])
tune = t1.selectbox("Fine-tuning", list(TUNE_MODES), key="tune", bind="query-params",
                    help="What trains: " + "; ".join(f"{k}: {v}" for k, v in TUNE_MODES.items()) + ". Frozen weights "
                         "need no grads and no optimizer state, and autograd saves only what the trainable part's "
                         "gradients need.")
last_n = t2.number_input("Blocks that train", 0, cfg.layers, 1, key="train_last", bind="query-params",
                         disabled=tune != "freeze",
                         help="the last N blocks, the final norm and an untied output head; 0: only the head")
lora_r = t2.number_input("LoRA rank r", 1, 4096, DEFAULT_LORA_R, key="lora_r", bind="query-params",
                         disabled=tune not in ("lora", "qlora"), help="trainable r*(in + out) per adapted linear layer")
target = t3.selectbox("LoRA targets", list(targets), key="lora_targets", bind="query-params",
                      disabled=tune not in ("lora", "qlora"),
                      help=f"the linear layers peft wraps (LoraConfig target_modules). {describe_targets(cfg, targets)}")
quant = t4.selectbox("4-bit type", QUANT_TYPES, key="quant", bind="query-params", disabled=tune != "qlora",
                     help="bitsandbytes' 4-bit data type for the frozen base (nf4: QLoRA's NormalFloat)")
double_quant = t5.toggle("Double quant.", True, key="double_quant", bind="query-params", disabled=tune != "qlora",
                         help="bnb_4bit_use_double_quant: the per-64-weight scales themselves in 8 bits (QLoRA's recipe)")
loss = st.selectbox("Loss", LOSSES, LOSSES.index(START.loss), key="loss", bind="query-params",
                    help="default: as the model's users train it; chunked-ce: cross-entropy over chunks of tokens, "
                         "the b*s*V logits never whole (Liger's chunking, each chunk recomputed in backward); "
                         "cce: Cut Cross-Entropy's algorithm (planner/losses.py); both with fine-tuning (a frozen "
                         "head) and with Gemma 2's soft cap")
ckpt_policy = st.selectbox("Checkpointing policy", CKPT_POLICIES, key="ckpt_policy", bind="query-params",
                           disabled=not ckpt,
                           help="full: every block keeps only its input; selective: torchtitan's op policy (every "
                                "second matmul's output and the fused attention's kept (on cuda not cuDNN's: recomputed), the "
                                "rest recomputed); every:K: "
                                "transformers' every_n_layers, only every K-th block checkpointed")
offload_opt = st.toggle("Optimizer on the host", False, key="offload_opt", bind="query-params",
                        help="--offload-optimizer: torchao's CPUOffloadOptimizer keeps AdamW's states on the host (the "
                             "host's bytes are their own line). On cuda: estimated as torchao runs it (measure runs the plain-torch "
                             "equivalent with pinned host copies; not yet recorded on a GPU); on cpu: the equivalent, "
                             "the mechanism measured here (planner/routines/offload_optim.py; docs/accuracy.md, "
                             "Optimizer offloading)")
offload_act = st.toggle("Activations on the host", False, key="offload_act", bind="query-params",
                        help="--offload-activations: torch.autograd.graph.save_on_cpu(pin_memory=True) copies every "
                             "saved tensor to the host in forward (weights the matmuls save included) and back in "
                             "backward; the host's bytes are their own line. On cpu: the mechanism measured here "
                             "(docs/accuracy.md, Activation offloading); on cuda: the same device figure, for the "
                             "CUDA check")
tuning = tune_fields(tune, last_n=int(last_n), lora_r=int(lora_r), lora_targets=targets[target], quantize=quant,
                     double_quant=bool(double_quant))
par = None if layout == LAYOUTS[0] else {
    "world_size": int(world), "parallel": layout, **({"reshard_after_forward": bool(reshard),
                                                       "mp_param_dtype": MP_CHOICES[mp], "cpu_offload": bool(offload)}
                                                      if layout == "fsdp" else {}),
    **({"tp": int(tp_size)} if layout == "fsdp+tp" else {}),
    **({"loss_parallel": bool(loss_par)} if layout in ("tp", "fsdp+tp") else {}),
    **({"sequence_parallel": bool(seq_par)} if sequence_parallel_applies(layout) else {})}
run_fields = {"precision": precision, "optimizer": optimizer, "checkpointing": bool(ckpt), "grad_accum": int(accum),
              "optimizer_impl": impl, "device": device, "loss": loss,
              "checkpoint_policy": ckpt_policy if ckpt else "full",
              "offload_optimizer": bool(offload_opt),  # cuda (torchao) and cpu (its equivalent): offload.py
              "offload_activations": bool(offload_act), **tuning}  # cpu (measured) and cuda: offload_act.py
if fitted:  # issue #20: no formula family reads this model_type: a fit of simulations answers
    fitted_planner(cfg, run_fields, attention, par)
else:
    with answer:
        plan_answer(cfg, model, question, {**run_fields, "batch_size": state.get("batch", START.batch_size)},
                    attention, par)
    planner(cfg, model, run_fields, attention, par, seq)
