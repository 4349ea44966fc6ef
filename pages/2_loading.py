"""Weight loading: every method's estimated device and CPU peak; measure them all for real; the recommendation."""
import pandas as pd
import psutil
import streamlit as st

from pages import frame

from planner.bench import NOTEBOOK_GPT2_XL
from planner.charts import grouped_bars
from planner.config import config_to_dict
from planner.estimate.loading import METHODS, estimate_loading, recommend
from planner.jobs import Job, JobBusy
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
gpu = st.session_state.get("gpu")
device = st.selectbox("Load to", ["cuda", "cpu"] if gpu else ["cpu", "cuda"], key="load_device")
ests = {m: estimate_loading(cfg, m, device) for m in METHODS}
table = pd.DataFrame([{"method": m, "device peak": fmt_bytes(e.peak_device_bytes), "CPU peak": fmt_bytes(e.peak_cpu_bytes),
                       "of which file-backed": fmt_bytes(e.peak_cpu_file_bytes), "device formula": e.formula_device,
                       "CPU formula": e.formula_cpu} for m, e in ests.items()])
st.dataframe(table, hide_index=True, width="stretch")
bars = pd.DataFrame([{"method": m, "source": f"estimate, {kind}", "bytes": b} for m, e in ests.items()
                     for kind, b in (("device", e.peak_device_bytes), ("CPU anon", e.peak_cpu_anon_bytes))])
st.altair_chart(grouped_bars(bars, "method", "Estimated peak", order=list(METHODS)))

free_ram = psutil.virtual_memory().available
free_dev = gpu["total_bytes"] if (gpu and device == "cuda") else (free_ram if device == "cpu" else None)
best, why = recommend(cfg, device, free_dev, free_ram)
st.success(f"Recommended here: **{best}** - {why}")


def start() -> None:
    try:
        st.session_state["load_job"] = Job(["measure", "load", "--method", "all", "--device", device, "--json",
                                            "--timeout", "600"], TIMEOUT_S, config=config_to_dict(cfg)).start()
        st.session_state.pop("load_result", None)
    except JobBusy as exc:
        st.session_state["load_message"] = str(exc)


running = "load_job" in st.session_state
need = max(e.peak_cpu_bytes for e in ests.values())
too_big = device == "cpu" and need > 0.8 * free_ram
if too_big:
    st.warning(f"Measuring every method needs up to {fmt_bytes(need)} of RAM; {fmt_bytes(free_ram)} is free. "
               "Pick a smaller model to measure here; the estimates above still hold.")
st.button("Measure all", type="primary", on_click=start, disabled=running or too_big, key="measure_all",
          help="Writes the model's checkpoints once (cached), then loads them with each method in a fresh process")
if msg := st.session_state.pop("load_message", None):
    st.warning(msg)


@st.fragment(run_every=1.0 if running else None)
def load_panel() -> None:
    job = st.session_state.get("load_job")
    if job is None:
        return
    state = job.state()
    st.progress(0.5 if state == "running" else 1.0, text=f"{state}: writing checkpoints, then one child per method")
    if state == "running" and st.button("Cancel", key="cancel_load"):
        job.cancel()
        state = job.state()
    if state != "running":
        record = job.result() or {}
        results = record.get("results", [record] if "method" in record else [])
        st.session_state["load_result"] = {"state": state, "results": results, "stderr": job.stderr()}
        for r in results:
            if "peak_device_bytes" in r:
                RunStore().save("load", st.session_state.get("model_name") or "model", {"method": r["method"]},
                                device, r["estimate"]["peak_device_bytes"], r["peak_device_bytes"], r)
        del st.session_state["load_job"]
        st.rerun()


load_panel()
res = st.session_state.get("load_result")
if res:
    ok = [r for r in res["results"] if "peak_device_bytes" in r]
    if res["state"] == "cancelled":
        st.info("Measurement cancelled: every process of the run has ended.")
    elif not ok:
        st.error(f"Measurement {res['state']}: {res['stderr'][-1500:] or 'no result'}")
    else:
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
