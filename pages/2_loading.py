"""Weight loading: every method's estimated device and CPU peak; measure them all for real; the recommendation."""
import pandas as pd
import psutil
import streamlit as st

from pages import frame

from planner.charts import grouped_bars
from planner.config import CHECKPOINT_DTYPES, checkpoint_dtype, config_to_dict, model_label
from planner.estimate.loading import METHODS
from planner.jobs import Job, JobBusy
from planner.loading import measured_results, plan_loading
from planner.reference import NOTEBOOK_GPT2_XL
from planner.routines_paths import default_cache_dir
from planner.store import RunStore
from planner.units import fmt_bytes

TIMEOUT_S = 900

cfg = frame("Weight loading")
st.title("Weight loading")
st.caption("Loading a saved state_dict (the LLMs-from-scratch notebook's methods, plus safetensors). On a CPU-only "
           "machine the device is the CPU itself. File-backed pages (mmap, safetensors) are page cache: the kernel "
           "can reclaim them under memory pressure, unlike anonymous memory.")
if cfg is None:
    st.stop()
name = st.session_state.get("model_name") or model_label(cfg)  # the frame names presets and pasted configs
gpu = st.session_state.get("machine_gpu")
if st.session_state.get("load_dtype_for") != cfg or "load_dtype" not in st.session_state:
    st.session_state["load_dtype"] = checkpoint_dtype(cfg)  # a new model starts from its own torch_dtype
    st.session_state["load_dtype_for"] = cfg
c1, c2 = st.columns(2)
device = c1.selectbox("Load to", ["cuda", "cpu"] if gpu else ["cpu", "cuda"], key="load_device")
dtype = c2.selectbox("Checkpoint dtype", CHECKPOINT_DTYPES, key="load_dtype",
                     help=f"The dtype the weights are saved and loaded in. Default: the config's torch_dtype "
                          f"({cfg.torch_dtype or 'none given, so float32'}).")
plan = plan_loading(cfg, device, dtype, gpu, psutil.virtual_memory().available, default_cache_dir())
cfg = plan.cfg  # with the checkpoint dtype: what Measure all loads
if not plan.formula:  # issue #20: no parameter inventory without building the model
    st.info("Weight loading is estimated from a formula family's parameter inventory; no family file reads this "
            "model_type (its training estimate is a fitted simulation, on the Planner page).")
    st.stop()
st.caption(f"Checkpoint: W = {fmt_bytes(plan.checkpoint_bytes)} of {dtype} tensors.")
rows = plan.table()
table = pd.DataFrame([{"method": r["method"], "device peak": fmt_bytes(r["device"]), "CPU peak": fmt_bytes(r["cpu"]),
                       "of which file-backed": fmt_bytes(r["cpu_file"]), "device formula": r["formula_device"],
                       "CPU formula": r["formula_cpu"]} for r in rows])
st.dataframe(table, hide_index=True, width="stretch")
bars = pd.DataFrame([{"method": r["method"], "source": f"estimate, {kind}", "bytes": r[col]} for r in rows
                     for kind, col in (("device", "device"), ("CPU anon", "cpu_anon"))])
st.altair_chart(grouped_bars(bars, "method", "Estimated peak", order=list(METHODS)))
st.success(f"Recommended here: **{plan.recommended}** - {plan.why}")


def start() -> None:
    try:
        st.session_state["load_job"] = Job(["measure", "load", "--method", "all", "--device", device, "--dtype", dtype,
                                            "--json", "--progress", "--timeout", "600"], TIMEOUT_S,
                                           config=config_to_dict(cfg)).start()
        st.session_state["load_job_for"] = {"model": name, "device": device, "dtype": dtype}
        st.session_state.pop("load_result", None)
    except JobBusy as exc:
        st.session_state["load_message"] = str(exc)


running = "load_job" in st.session_state
refusal = plan.refusal
st.caption(plan.cache["text"])
if refusal and not running:
    st.warning(f"Measure all is not offered: {refusal}")
st.button("Measure all", type="primary", on_click=start, disabled=running or bool(refusal), key="measure_all",
          help="Writes the model's checkpoints once (cached), then loads them with each method in a fresh process")
if msg := st.session_state.pop("load_message", None):
    st.warning(msg)


@st.fragment(run_every=1.0 if running else None)
def load_panel() -> None:
    job = st.session_state.get("load_job")
    if job is None:
        return
    state = job.state()
    if state == "running":
        fraction, stage = job.progress()
        st.progress(min(max(fraction, 0.0), 1.0), text=f"Running: {stage}")
        if st.button("Cancel", key="cancel_load"):
            job.cancel()
            state = job.state()
    if state != "running":
        record = job.result() or {}
        results = record.get("results", [record] if "method" in record else [])
        st.session_state["load_result"] = {"state": state, "results": results, "stderr": job.stderr()}
        RunStore().save_load_job(**st.session_state.get("load_job_for", {"model": name, "device": device, "dtype": dtype}),
                                 state=state, results=results, stderr=job.stderr())
        del st.session_state["load_job"]
        st.rerun()


load_panel()
res = st.session_state.get("load_result")
if res:
    ok, failed = measured_results(res["results"])
    if res["state"] == "cancelled":
        st.info("Cancelled before every method was measured: every process of the run has ended. The run is listed on the Runs "
                "page as cancelled.")
    elif failed or not ok:
        st.error(f"{'Timed out' if res['state'] == 'timeout' else 'Failed'}: "
                 f"{'; '.join(failed) or res['stderr'][-1500:] or 'no result'}")
    if ok:
        measured = pd.DataFrame([{"method": r["method"], "source": src, "bytes": v} for r in ok
                                 for src, v in (("device estimate", r["estimate"]["peak_device_bytes"]),
                                                ("device measured", r["peak_device_bytes"]),
                                                ("CPU estimate", r["estimate"]["peak_cpu_bytes"]),
                                                ("CPU measured", r["peak_cpu_bytes"]))])
        st.altair_chart(grouped_bars(measured, "method", "Peak", order=list(METHODS)))
        st.dataframe(pd.DataFrame([{"method": r["method"], "device measured": fmt_bytes(r["peak_device_bytes"]),
                                    "CPU measured": fmt_bytes(r["peak_cpu_bytes"]),
                                    "anon / file after": f"{fmt_bytes(r['cpu_anon_delta_bytes'])} / {fmt_bytes(r['cpu_file_delta_bytes'])}",
                                    "load s": round(r["load_time_s"], 3), "GB/s": round(r["throughput_gb_s"], 2),
                                    "weights equal": r["weights_match"]} for r in ok]), hide_index=True, width="stretch")

st.subheader("For reference: the notebook's GPT-2 XL (fp32, Colab L4)")
st.dataframe(pd.DataFrame([{"method": m, "peak GPU (GB)": g, "peak CPU (GB, 0.1 s sampler)": c}
                           for m, (g, c) in NOTEBOOK_GPT2_XL.items()]), hide_index=True)
