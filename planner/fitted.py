"""The estimate of a model no formula family covers (issue #20): a fit of simulations, made once, kept on disk.

A config whose family's `basis` is "fitted simulation" (planner/arch/auto.py: any causal LM transformers builds)
has no terms to add up. Its estimate is answered from a what-if fit of the real step simulated on fake tensors in
a child process (planner.whatif, planner.whatif_depth), made once per model and settings and kept in the data
folder (planner.store.data_dir()/fitted/, keyed by the config's hash, the settings other than batch and sequence,
and FIT_VERSION); every later query is a few vector operations. No torch here.

Which fit: a deep model (layers >= base + 5 units) is simulated at full width with base + 2u, base + 3u and base + 4u
layers (u: the layer-type period read from the config, base = layers mod u) and extrapolated to its depth
(planner.whatif_depth), with held-out points simulated at the full depth as the check; a shallow one is fitted at
its own depth (planner.whatif). Both say whether they are exact at the held-out points, or by how much they miss.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from .module_ref import FIT_VERSION

ESTIMATE_BLOCK = ("peak_bytes", "peak_phase", "phase_peak_bytes", "basis", "status", "bound_bytes")  # the
# fields of a fitted estimate that measure / simulate records carry as their `estimate` block
PERIOD_KEY_ENDINGS = ("_pattern", "_interval", "_period")  # ints that set a layer-type period (Gemma 3's
# sliding_window_pattern, SmolLM3's no_rope_layer_interval, Jamba's attn_layer_period): read as periods


def is_fitted(cfg) -> bool:
    from .arch import family_of

    return family_of(cfg).basis != "formula"


def _minimal_period(seq: list) -> int:
    n = len(seq)
    return next(p for p in range(1, n + 1) if all(seq[i] == seq[i % p] for i in range(n)))


def layer_period(cfg) -> int:
    """The smallest number of layers after which the config's per-layer settings repeat: the period of every list
    as long as the model's depth (layer_types, no_rope_layers, ...) and every *_pattern / *_interval / *_period
    integer, combined (their least common multiple); 1 for alike blocks."""
    data = cfg.data if hasattr(cfg, "data") else {}
    layers = cfg.layers
    unit = 1
    for key, value in data.items():
        if isinstance(value, list) and len(value) == layers and layers > 0:
            unit = math.lcm(unit, _minimal_period([json.dumps(v, sort_keys=True) for v in value]))
        elif (isinstance(value, int) and not isinstance(value, bool) and key.endswith(PERIOD_KEY_ENDINGS)
              and 1 < value <= layers):
            unit = math.lcm(unit, value)
    return unit


def depth_plan(cfg) -> tuple[int, int] | None:
    """(base, unit) for a depth fit, or None to fit at the model's own depth (too shallow to gain: simulating three
    depths would not be cheaper than the full one)."""
    from .whatif_depth import UNITS

    unit = layer_period(cfg)
    base = cfg.layers % unit
    if cfg.layers < base + (UNITS[-1] + 1) * unit:
        return None
    return base, unit


def run_fields(spec) -> dict:
    """The settings a fit answers for: the spec without batch and sequence."""
    d = asdict(spec)
    d.pop("batch_size")
    d.pop("seq_len")
    return d


def fit_file(cfg, spec) -> Path:
    from .config import config_to_dict
    from .store import data_dir

    key = json.dumps([config_to_dict(cfg), run_fields(spec), FIT_VERSION], sort_keys=True)
    return data_dir() / "fitted" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def load_fit(d: dict):
    """A saved fit (WhatIf.save_dict or DepthWhatIf.save_dict) as the object that answers queries."""
    if d.get("kind") == "depth":
        from .whatif_depth import DepthWhatIf

        return DepthWhatIf.from_dict(d)
    from .whatif import WhatIf

    return WhatIf.from_dict(d)


def cached_fit(cfg, spec):
    """(fit, info) kept for this model and settings, or None."""
    path = fit_file(cfg, spec)
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
        what = load_fit(d["fit"])
    except (ValueError, KeyError, TypeError):
        return None
    return what, d.get("info", {})


def points_plan(cfg) -> tuple[list[tuple], list[tuple], tuple[int, int] | None]:
    """(points to fit, held-out points, depth plan): with a depth plan the fit points are (b, s, layers) at three
    depths and the held-out points (b, s) at the full depth."""
    from .module_ref import fit_points

    points, holdout = fit_points(True)
    plan = depth_plan(cfg)
    if plan is None:
        return list(points), [p for p in holdout if p not in points], None
    from .whatif_depth import UNITS

    base, unit = plan
    depths = [base + m * unit for m in UNITS]
    return [(b, s, d) for d in depths for b, s in points], list(holdout), plan


def _in_process(cfg, spec, every, on_point, counts) -> dict:
    """The points simulated in this process (tests): what the child does (planner.measure.simulate _points_main)."""
    from .arch import family_of
    from .measure.simulate import simulate_training

    traces = {}
    for p in every:
        point_cfg = family_of(cfg).with_layers(cfg, p[2]) if len(p) > 2 else cfg
        rec = simulate_training(point_cfg, replace(spec, batch_size=p[0], seq_len=p[1]), trace=True)
        traces[p], counts[p] = rec["trace"], rec["param_count"]
        on_point(p)
    return traces


FIT_CHILDREN = 2  # simulating children run at once (each one process, torch imported once): the 2-core
# machine; the fake step is single-threaded Python, so two children on 2 cores take about half the time of one


def _children(cfg, spec, every: list[tuple], timeout_s: float, point, counts: dict) -> dict:
    """Every point simulated in up to FIT_CHILDREN children at once (as many as this machine has cores), the points
    shared out by their cost (a point's layers: a full-depth held-out point costs as much as several shallow ones)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from .whatif import child_traces

    n = max(1, min(FIT_CHILDREN, os.cpu_count() or 1, len(every)))
    groups: list[list[tuple]] = [[] for _ in range(n)]
    load = [0] * n
    for p in sorted(every, key=lambda p: -(p[2] if len(p) > 2 else cfg.layers)):
        i = load.index(min(load))
        groups[i].append(p)
        load[i] += p[2] if len(p) > 2 else cfg.layers
    with ThreadPoolExecutor(n) as pool:
        parts = list(pool.map(lambda g: child_traces(cfg, spec, g, None, timeout_s, point, counts), groups))
    return {p: t for part in parts for p, t in part.items()}


def make_fit(cfg, spec, on_point: Callable[[tuple, int, int], None] = lambda p, i, n: None,
             timeout_s: float = 600, simulate_in_process: bool = False) -> tuple:
    """Simulate every point (FIT_CHILDREN children at once; in this process with simulate_in_process, which imports
    torch: tests) and fit: (fit, info)."""
    from .whatif import WhatIf
    from .whatif_depth import DepthWhatIf

    points, holdout, plan = points_plan(cfg)
    every = points + holdout
    done: list = []
    counts: dict = {}

    def point(p):
        done.append(p)
        on_point(p, len(done), len(every))

    t0 = time.perf_counter()
    if simulate_in_process:
        traces = _in_process(cfg, spec, every, point, counts)
    else:
        traces = _children(cfg, replace(spec, batch_size=2, seq_len=16), every, timeout_s, point, counts)
    seconds = time.perf_counter() - t0
    held = {p: traces[p] for p in holdout}
    if plan is None:
        what = WhatIf.fit({p: traces[p] for p in points}, held)
    else:
        from .whatif_depth import UNITS

        base, unit = plan
        by_depth = {m: {(b, s): traces[(b, s, d)] for b, s, d in points if d == base + m * unit} for m in UNITS}
        what = DepthWhatIf.fit(by_depth, cfg.layers, base, unit, held)
    info = {"simulations": len(every), "simulate_s": seconds, "fit_s": time.perf_counter() - t0 - seconds,
            "points": [list(p) for p in points], "holdout": [list(p) for p in holdout],
            "depth": None if plan is None else {"base": plan[0], "unit": plan[1]},
            "param_count": next((n for p, n in counts.items() if len(p) == 2 and n), None)}  # at the full depth
    return what, info


def fitted_model(cfg, spec, on_point: Callable[[tuple, int, int], None] = lambda p, i, n: None,
                 timeout_s: float = 600, refit: bool = False) -> tuple:
    """(fit, fit file, cached, info): the kept fit of this model and settings, else a new one, then kept."""
    path = fit_file(cfg, spec)
    if not refit:
        got = cached_fit(cfg, spec)
        if got is not None and got[0].status != "unvalidated":
            return got[0], path, True, got[1]
    what, info = make_fit(cfg, spec, on_point, timeout_s)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fit": what.save_dict(), "info": info}))
    return what, path, False, info


def fitted_record(cfg, spec, what, path: Path | None = None, cached: bool = True, info: dict | None = None) -> dict:
    """The estimate's record for a fitted model: the fields an estimate has where a fit knows them, with its basis,
    its status and bound, and the fit's summary."""
    from .config import config_to_dict

    ans = what.answer(spec.batch_size, spec.seq_len)
    return {"model": config_to_dict(cfg), "run": asdict(spec), "basis": "fitted simulation", **ans,
            "phase_peak_bytes": what.phase_peak_bytes(spec.batch_size, spec.seq_len), "fit": what.to_dict(),
            "fit_file": str(path) if path else None, "fit_cached": cached, "fit_info": info or {}}


def estimate_block(cfg, spec) -> dict | None:
    """The kept fit's answer for measure / simulate records, or None (no fit kept yet: no figure is made up)."""
    got = cached_fit(cfg, spec)
    if got is None:
        return None
    try:
        rec = fitted_record(cfg, spec, got[0])
    except ValueError:  # batch 1 not covered
        return None
    return {k: rec[k] for k in ESTIMATE_BLOCK}
