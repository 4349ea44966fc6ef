"""Everything the Weight loading page shows for one model, device and checkpoint dtype, in one call (no torch,
no streamlit): the question "which way of loading these weights fits this machine, and at what peak?".

The page reads its widgets, calls plan_loading() once and renders; after a Measure-all job, measured_results()
splits the job's records into the methods measured and the ones that failed. The figures are
planner/estimate/loading.py's (the formulas); this module only gathers them for the page.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import ModelConfig, with_dtype
from .estimate.loading import METHODS, LoadEstimate, cache_plan, estimate_loading, measure_refusal, recommend


@dataclass
class LoadingPlan:
    cfg: ModelConfig                 # the model with the checkpoint dtype applied (what a measurement loads)
    device: str
    dtype: str
    formula: bool                    # False: no formula family reads this model_type (no parameter inventory)
    estimates: dict[str, LoadEstimate] = field(default_factory=dict)  # method -> its estimate, in METHODS order
    free_device_bytes: int | None = None  # what the recommendation compares device peaks with (None: no figure)
    recommended: str = ""            # the method recommended here ("none" when none fits)
    why: str = ""
    cache: dict = field(default_factory=dict)  # planner.estimate.loading.cache_plan: what measuring writes first
    refusal: str | None = None       # why Measure all cannot start here (None when it can)

    @property
    def checkpoint_bytes(self) -> int:
        return self.estimates["mmap"].checkpoint_bytes  # W: the same file size for every method

    def table(self) -> list[dict]:
        """One row per method: its device and CPU peaks (bytes) and their formulas."""
        return [{"method": m, "device": e.peak_device_bytes, "cpu": e.peak_cpu_bytes, "cpu_file": e.peak_cpu_file_bytes,
                 "cpu_anon": e.peak_cpu_anon_bytes, "formula_device": e.formula_device, "formula_cpu": e.formula_cpu}
                for m, e in self.estimates.items()]


def plan_loading(cfg: ModelConfig, device: str, dtype: str, gpu: dict | None, free_ram_bytes: int,
                 cache_dir) -> LoadingPlan:
    """cfg: the model picked; gpu: planner.fit.gpu_info()'s answer (None without a GPU); free_ram_bytes: the RAM
    available now; cache_dir: where measuring keeps the checkpoints (planner.routines_paths.default_cache_dir)."""
    from .arch import family_of

    cfg = with_dtype(cfg, dtype)
    if family_of(cfg).basis != "formula":  # issue #20: no parameter inventory without building the model
        return LoadingPlan(cfg, device, dtype, formula=False)
    ests = {m: estimate_loading(cfg, m, device) for m in METHODS}
    # the device's memory: the GPU's total on cuda, the free RAM when the device is the CPU
    free_dev = gpu["total_bytes"] if (gpu and device == "cuda") else (free_ram_bytes if device == "cpu" else None)
    best, why = recommend(cfg, device, free_dev, free_ram_bytes)
    cache = cache_plan(cfg, cache_dir)
    return LoadingPlan(cfg, device, dtype, True, ests, free_dev, best, why, cache,
                       measure_refusal(cfg, device, gpu is not None, free_ram_bytes, cache))


def measured_results(results: list[dict]) -> tuple[list[dict], list[str]]:
    """A Measure-all job's records: (the methods measured, "method: error" for each that failed)."""
    return ([r for r in results if "peak_device_bytes" in r],
            [f"{r['method']}: {r['error']}" for r in results if "error" in r])
