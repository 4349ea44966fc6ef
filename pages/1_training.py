"""Training step: run the real step for the planner's settings in a child process (measure), or the same step
on fake tensors (simulate: any size, no memory used); either against the estimate. With the Planner's data
parallel settings the run is N ranks (gloo on the CPU, one GPU each on cuda) and every figure is per rank."""
import dataclasses

import pandas as pd
import psutil
import streamlit as st

from pages import frame

from planner.api import category_rows, category_stack_rows, component_rows, phase_rows, step_run
from planner.charts import PHASE_ORDER, alive_tables, category_area, category_bars, grouped_bars, timeline
from planner.config import ConfigError, config_to_dict, model_label
from planner.finetune import describe_tuning
from planner.jobs import Job, JobBusy, running_pid
from planner.spec import TrainSpec
from planner.store import RunStore, export_files, run_files
from planner.units import fmt_bytes

TIMEOUT_S = 600
ENDED = {"failed": "Failed", "timeout": "Timed out"}

cfg = frame("Training step")
st.title("Training step: measured against estimated")
if cfg is None:
    st.stop()
settings = st.session_state.get("run_settings") or {"spec": dataclasses.asdict(TrainSpec(2, min(128, cfg.max_seq_len))),
                                                   "attention": cfg.attention, "budget": None}
try:
    run = step_run(cfg, TrainSpec(**settings["spec"]), settings.get("attention"), settings.get("parallel"),
                   settings.get("budget"), st.session_state.get("machine_gpu"), psutil.virtual_memory().available)
except ConfigError as exc:  # settings made for another model (a longer context)
    st.error(f"{exc}. Change the settings on the Planner page.")
    st.stop()
spec, run_cfg, pspec, est, budget = run.spec, run.cfg, run.parallel, run.estimate, run.budget_bytes
for note in run.notes:
    st.caption(note)
name = st.session_state.get("model_name") or model_label(cfg)  # the frame names presets and pasted configs
st.write(f"**{name}** - batch {spec.batch_size} x seq {spec.seq_len}, {spec.precision}, "
         f"{spec.optimizer}, {'checkpointing, ' if spec.checkpointing else ''}{run_cfg.attention} attention, "
         f"grad. accumulation {spec.grad_accum}, on {spec.device}" + (f", {describe_tuning(spec)}" if spec.finetuning else "")
         + (f", **{pspec.label}** (batch per rank)" if pspec else "") + ". Change these on the Planner page.")
fitted = est.get("basis") == "fitted simulation"  # issue #20: no formula family (planner/fitted.py)
st.metric("Estimated peak" + (" per rank" if pspec else "") + (" (fitted simulation)" if fitted else ""),
          fmt_bytes(est["peak_bytes"]) if est["peak_bytes"] or not fitted else "no fit yet",
          help=f"phase: {est['peak_phase']}")
stack = category_stack_rows(est)
if stack:
    st.altair_chart(category_bars(stack, budget_bytes=budget))
    approx = sorted({r["phase"] for r in stack if r["split"] == "approximate"}, key=PHASE_ORDER.index)
    st.caption("What each byte is at each phase's high point, as torch's MemTracker names it."
               + (f" {', '.join(approx)}: the split between gradient, activation and temporary is approximate "
                  "(the total is not)." if approx else ""))
refused = run.refused
if refused:
    (st.warning if pspec else st.error)(run.refusal)


def start(kind: str = "measure") -> None:
    """Start `python -m planner measure|simulate train` for these settings (the job writes and removes the
    config file)."""
    try:
        st.session_state["job"] = Job(run.child_args(kind, TIMEOUT_S, export_files(kind)), timeout_s=TIMEOUT_S + 30,
                                      config=config_to_dict(run_cfg)).start()
        st.session_state["job_kind"] = kind
        st.session_state.pop("train_result", None)
    except JobBusy as exc:
        st.session_state["job_message"] = str(exc)


running = "job" in st.session_state
autostart = st.session_state.pop("autostart", False)  # True: measure; "simulate": the Planner's plan, simulated
if autostart and not running and (not refused or autostart == "simulate"):
    start("simulate" if autostart == "simulate" else "measure")
    running = "job" in st.session_state
b1, b2 = st.columns([1, 4])
b1.button("Run measurement", type="primary", disabled=running or refused, on_click=start, key="run")
# Simulation allocates no tensor memory, so it is offered even where a measurement is refused.
b2.button("Simulate", disabled=running, on_click=start, args=("simulate",), key="simulate",
          help="the same step on fake tensors: exact live tensor bytes, no memory used (any model size)")
if msg := st.session_state.pop("job_message", None):
    st.warning(msg)
elif not running and running_pid():
    st.info("A measurement started elsewhere is running on this machine.")


@st.fragment(run_every=1.0 if running else None)
def job_panel() -> None:
    job = st.session_state.get("job")
    if job is None:  # the outcome is drawn in here: a last run_every tick can rerun this fragment after the
        show_result()  # page's rerun, and Streamlit then drops what the page drew after the fragment
        return
    state = job.state()
    if state == "running":
        fraction, stage = job.progress()
        st.progress(min(max(fraction, 0.0), 1.0), text=f"Running: {stage}")
        if st.button("Cancel", key="cancel"):
            job.cancel()
            state = job.state()
    if state != "running":
        record = job.result() or {}
        status = "failed" if state == "done" and "peak_bytes" not in record else state
        kind = st.session_state.pop("job_kind", "measure")
        st.session_state["train_result"] = {"state": status, "record": record, "stderr": job.stderr(),
                                            "estimate": est, "budget": budget, "kind": kind}
        RunStore().save("train", name, {**dataclasses.asdict(spec), "attention": run_cfg.attention,
                                        **({"parallel": pspec.label} if pspec else {})}, spec.device,
                        est["peak_bytes"], record.get("peak_bytes"), {"kind": kind, **record}, status)
        del st.session_state["job"]
        st.rerun()


def show_result() -> None:
    res = st.session_state.get("train_result")
    if not res:
        return
    rec = res["record"]
    simulated = res.get("kind") == "simulate"
    what = "Simulated" if simulated else "Measured"
    if res["state"] == "cancelled":
        st.info("Cancelled before it finished: every process of the run has ended and nothing was measured. "
                "The run is listed on the Runs page as cancelled.")
    elif res["state"] != "done":
        st.error(f"{ENDED.get(res['state'], 'Failed')}: {rec.get('error', 'no result')}"
                 + (f" (phase: {rec['phase']})" if rec.get("phase") else ""))
        if res["stderr"].strip():
            st.code(res["stderr"][-2000:])
    else:
        st.progress(1.0, text="Finished: " + ("simulated on fake tensors" if simulated else "measured") +
                    " in a child process")
        e = res["estimate"]
        if "ranks" in rec:
            show_ranks(rec, e, what)
            return
        m1, m2, m3, m4 = st.columns(4)
        m1.metric(f"{what} peak", fmt_bytes(rec["peak_bytes"]),
                  help="live tensor bytes of the step on fake tensors" if simulated
                  else "live tensor bytes (CPU) / max_memory_allocated (CUDA)")
        m2.metric("Estimated peak", fmt_bytes(e["peak_bytes"]))
        m3.metric("Error", f"{rec['error_pct']:+.2f}%")
        m4.metric(f"Peak phase ({what.lower()})", rec["peak_phase"], help=f"estimated: {e['peak_phase']}")
        if simulated:
            st.caption(f"Simulated {rec.get('ops', 0):,} ops in {rec['sim_time_s']:.1f} s; the simulator's own RSS "
                       f"{fmt_bytes(rec['sim_peak_rss_bytes'])} (fake tensors hold no memory)")
        else:
            st.caption(f"Peak RSS of the child {fmt_bytes(rec['peak_rss_bytes'])}; step time {rec['step_time_s']:.3f} s"
                       + (f"; max_memory_reserved {fmt_bytes(rec['peak_reserved_bytes'])}"
                          if "peak_reserved_bytes" in rec else ""))
        phases = pd.DataFrame(phase_rows(e, rec, what.lower()))
        c1, c2 = st.columns(2)
        c1.altair_chart(grouped_bars(phases, "phase", "Peak of each phase", order=PHASE_ORDER))
        comp = pd.DataFrame(component_rows(e, rec, what.lower()))
        c2.altair_chart(grouped_bars(comp, "component", "Bytes"))
        cats = category_rows(e, rec, what.lower())
        if cats:
            st.subheader("By category, phase by phase")
            st.dataframe(pd.DataFrame(cats), hide_index=True)
        if rec.get("timeline"):
            st.altair_chart(timeline(pd.DataFrame(rec["timeline"]), budget_bytes=res["budget"],
                                     estimate_bytes=e["peak_bytes"]))
            st.caption("Red: the budget. Black: the estimated peak.")
        show_exports(rec, res["budget"])


def show_exports(rec: dict, budget) -> None:
    """What is alive at the peak, the step stacked by category, and the snapshot and trace to download."""
    if rec.get("category_timeline"):
        st.subheader("Memory by category over the step")
        st.altair_chart(category_area(rec["category_timeline"], budget_bytes=budget))
        st.caption("Live tensor bytes stacked by category; dashed lines: where each phase starts.")
    if rec.get("alive_at_peak"):
        alive = rec["alive_at_peak"]
        tables = alive_tables(alive)
        st.subheader(f"Alive at the peak ({fmt_bytes(alive['peak_bytes'])}, op {alive['op']}, {alive['phase']})")
        c1, c2 = st.columns(2)
        c1.dataframe(tables["category"], hide_index=True, key="alive_category")
        c2.dataframe(tables["module"], hide_index=True, key="alive_module")
        st.dataframe(tables["largest"], hide_index=True, key="alive_largest")
    files = dict(run_files({"record": rec}))
    if files:
        d1, d2, _ = st.columns([1, 1, 2])
        if "memory_snapshot" in files:
            d1.download_button("Download memory snapshot", files["memory_snapshot"].read_bytes(), "memory_snapshot.pickle",
                               "application/octet-stream", key="dl_snapshot", on_click="ignore",
                               help="open it at pytorch.org/memory_viz (torch.cuda.memory._snapshot() format)")
        if "trace" in files:
            d2.download_button("Download trace", files["trace"].read_bytes(), "trace.json", "application/json",
                               key="dl_trace", on_click="ignore", help="open it in ui.perfetto.dev or chrome://tracing")


def show_ranks(rec: dict, e: dict, what: str) -> None:
    """A data-parallel run: the largest rank against its estimate, then every rank beside its group's estimate."""
    m1, m2, m3, m4 = st.columns(4)
    m1.metric(f"{what} peak (largest rank)", fmt_bytes(rec["peak_bytes"]), help=f"rank {rec['peak_rank']}")
    m2.metric("Estimated peak per rank", fmt_bytes(e["peak_bytes"]), help=f"rank {e['peak_rank']}")
    m3.metric("Error", f"{rec['error_pct']:+.2f}%")
    m4.metric(f"Peak phase ({what.lower()})", rec["peak_phase"], help=f"estimated: {e['peak_phase']}")
    if "step_time_s" in rec:
        st.caption(f"{rec['world_size']} ranks; slowest step {rec['step_time_s']:.3f} s; largest RSS of a rank "
                   f"{fmt_bytes(rec.get('peak_rss_bytes', 0))}")
    per_rank = pd.DataFrame([{"rank": f"rank {r['rank']}", "source": src, "bytes": val}
                             for r in rec["ranks"]
                             for src, val in (("estimate", r["estimate_bytes"]), (what.lower(), r["peak_bytes"]))])
    phases = pd.DataFrame(phase_rows(e, rec, what.lower()))
    c1, c2 = st.columns(2)
    c1.altair_chart(grouped_bars(per_rank, "rank", "Peak of each rank"))
    c2.altair_chart(grouped_bars(phases, "phase", "Peak of each phase (largest rank)", order=PHASE_ORDER))
    top = next(r for r in rec["ranks"] if r["rank"] == rec["peak_rank"])
    if top.get("timeline"):
        st.altair_chart(timeline(pd.DataFrame(top["timeline"]), estimate_bytes=e["peak_bytes"]))
        st.caption(f"Rank {rec['peak_rank']}'s step. Black: the estimated peak per rank.")


job_panel()
