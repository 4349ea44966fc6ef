"""Instant what-ifs for any model: the simulated step's live bytes op by op as polynomials in (b, s).

For a fixed model and settings, the live bytes after each op of the training step are a polynomial in the
batch size b and the sequence length s with terms 1, s, s^2, b*s, b*s^2 (weights and optimizer state are
constant; activations are b*s*width; attention scores b*s^2; position tables and causal masks s or s^2), as
long as the step runs the same ops. So: simulate a few (b, s) points (planner.measure.simulate, trace=True), check
that their op sequences are identical, fit each op's five coefficients by least squares, and the peak at
any (b, s) is the maximum over ops of those polynomials (a matrix-vector product: microseconds).

Batch 1 may take other paths (Hugging Face models do; a b = 1 matmul may fold differently), so points with
b = 1 that do not align with the others get a fit of their own in (1, s, s^2); where no fit covers a query
(b = 1 with no aligned b = 1 points) it is refused rather than guessed. Op sequences that differ between
points of the same class (a kernel chosen by shape) raise MisalignedError: simulate that point instead.
No torch here: the simulations run through a callable (by default a child process per point).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from .config import ModelConfig
from .fit import largest_fitting  # the fitted peak grows with b and s, as the formula's does
from .spec import WHATIF_POINTS as DEFAULT_POINTS  # the fit points (in spec.py: the CLI's default, numpy-free)
from .spec import TrainSpec

TERMS = ("1", "s", "s^2", "b*s", "b*s^2")


class MisalignedError(ValueError):
    """Points whose steps run different op sequences cannot share a fit (one line)."""


def basis(b: int, s: int, batch_one: bool = False) -> np.ndarray:
    return np.array([1.0, s, s * s] if batch_one else [1.0, s, s * s, b * s, b * s * s])


def _scale(batch_one: bool, points) -> np.ndarray:
    """Column scales: each basis column's largest value, so least squares is well conditioned."""
    return np.abs(np.array([basis(b, s, batch_one) for b, s in points])).max(axis=0)


@dataclass
class _Fit:
    batch_one: bool
    points: list[tuple[int, int]]
    ops: list[str]
    phases: list[str]
    coef: np.ndarray          # (n_ops, n_terms), bytes per unscaled basis term
    max_residual_bytes: float  # largest |fitted - simulated| over the fitted points and ops

    def live(self, b: int, s: int) -> np.ndarray:
        return self.coef @ basis(b, s, self.batch_one)


class WhatIf:
    """The fitted step: `peak_bytes(b, s)`, `peak(b, s)` (bytes, phase, op), `phase_peak_bytes(b, s)`."""

    def __init__(self, fits: list[_Fit]):
        self.fits = fits

    @classmethod
    def fit(cls, traces: dict[tuple[int, int], dict]) -> "WhatIf":
        """traces: (b, s) -> simulate_training(..., trace=True)["trace"]."""
        many = {p: t for p, t in traces.items() if p[0] >= 2}
        ones = {p: t for p, t in traces.items() if p[0] == 1}
        if len(many) < len(TERMS):
            raise MisalignedError(f"need at least {len(TERMS)} points with batch >= 2, got {len(many)}")
        ref = next(iter(many.values()))
        if ones and all(_aligned(ref, t) for t in ones.values()):
            many, ones = {**many, **ones}, {}
        fits = [_fit(many, batch_one=False)]
        if ones:
            if len(ones) < 3:
                raise MisalignedError(f"batch 1 runs other ops than batch >= 2 here; its own fit needs 3 points with "
                                      f"batch 1, got {len(ones)}")
            fits.append(_fit(ones, batch_one=True))
        return cls(fits)

    def _fit_for(self, b: int) -> _Fit:
        if b >= 2:
            return self.fits[0]
        if len(self.fits) > 1:
            return self.fits[1]
        if any(p[0] == 1 for p in self.fits[0].points):  # batch 1 aligned with the others: one fit
            return self.fits[0]
        raise MisalignedError("batch 1 is not covered by this fit: simulate batch-1 points with the others")

    def peak(self, b: int, s: int) -> tuple[int, str, str]:
        f = self._fit_for(b)
        live = f.live(b, s)
        i = int(np.argmax(live))
        return int(round(live[i])), f.phases[i], f.ops[i]

    def peak_bytes(self, b: int, s: int) -> int:
        return self.peak(b, s)[0]

    def phase_peak_bytes(self, b: int, s: int) -> dict[str, int]:
        f = self._fit_for(b)
        live = f.live(b, s)
        out: dict[str, int] = {}
        for phase in dict.fromkeys(f.phases):
            mask = np.array([p == phase for p in f.phases])
            out[phase] = int(round(live[mask].max()))
        return out

    def to_dict(self) -> dict:
        return {"terms": list(TERMS), "fits": [{"batch_one": f.batch_one, "points": f.points, "ops": len(f.ops),
                                                "max_residual_bytes": f.max_residual_bytes} for f in self.fits]}

    def save_dict(self) -> dict:
        """Everything a later process needs to answer queries (WhatIf.from_dict): JSON-able."""
        return {"terms": list(TERMS), "fits": [
            {"batch_one": f.batch_one, "points": [list(p) for p in f.points], "ops": f.ops, "phases": f.phases,
             "coef": f.coef.tolist(), "max_residual_bytes": f.max_residual_bytes} for f in self.fits]}

    @classmethod
    def from_dict(cls, d: dict) -> "WhatIf":
        if d.get("terms") != list(TERMS):
            raise ValueError(f"a what-if fit with terms {d.get('terms')}, not {list(TERMS)}")
        return cls([_Fit(f["batch_one"], [tuple(p) for p in f["points"]], list(f["ops"]), list(f["phases"]),
                         np.array(f["coef"], dtype=float), float(f["max_residual_bytes"])) for f in d["fits"]])

    def covers_batch_one(self) -> bool:
        return len(self.fits) > 1 or any(p[0] == 1 for p in self.fits[0].points)

    def max_batch(self, s: int, budget: int, limit: int = 1 << 20) -> tuple[int, str]:
        """The largest batch whose fitted peak at sequence s fits `budget` (0 with the reason)."""
        first = 1 if self.covers_batch_one() else 2
        if self.peak_bytes(first, s) > budget:
            return 0, f"batch {first} needs {self.peak_bytes(first, s):,} B > {budget:,} B"
        best = largest_fitting(lambda b: self.peak_bytes(b, s) <= budget, first, limit)
        return best, (f"batch {best + 1} would not fit" if best < limit else f"the limit ({limit:,}) fits")

    def max_seq(self, b: int, budget: int, limit: int) -> tuple[int, str]:
        """The longest sequence (up to `limit`) whose fitted peak at batch b fits `budget` (0 with the reason)."""
        if self.peak_bytes(b, 1) > budget:
            return 0, f"even a sequence of 1 needs {self.peak_bytes(b, 1):,} B > {budget:,} B"
        best = largest_fitting(lambda s: self.peak_bytes(b, s) <= budget, 1, limit)
        return best, (f"seq_len {best + 1} would not fit" if best < limit else f"the limit ({limit:,}) fits")



def _aligned(a: dict, b: dict) -> bool:
    return a["ops"] == b["ops"] and a["phases"] == b["phases"]


def _fit(traces: dict[tuple[int, int], dict], batch_one: bool) -> _Fit:
    points = sorted(traces)
    ref = traces[points[0]]
    for p in points[1:]:
        if not _aligned(ref, traces[p]):
            t = traces[p]
            where = next((i for i, (x, y) in enumerate(zip(ref["ops"], t["ops"])) if x != y),
                         min(len(ref["ops"]), len(t["ops"])))
            raise MisalignedError(f"the step at b={p[0]} s={p[1]} runs other ops than at b={points[0][0]} "
                                  f"s={points[0][1]} (from op {where}: {len(t['ops'])} ops against {len(ref['ops'])}); "
                                  "a kernel is chosen by shape here: simulate that point instead")
    scale = _scale(batch_one, points)
    A = np.array([basis(b, s, batch_one) for b, s in points]) / scale
    if np.linalg.matrix_rank(A) < A.shape[1]:
        raise MisalignedError(f"the points {points} do not determine the terms {TERMS[:A.shape[1]]}: vary b and s")
    Y = np.array([traces[p]["bytes"] for p in points], dtype=float)  # (n_points, n_ops)
    sol, *_ = np.linalg.lstsq(A, Y, rcond=None)                         # (n_terms, n_ops)
    coef = (sol / scale[:, None]).T
    residual = float(np.abs(A @ sol - Y).max()) if len(points) > A.shape[1] else 0.0
    return _Fit(batch_one, points, list(ref["ops"]), list(ref["phases"]), coef, residual)


def child_trace(cfg: ModelConfig | None, spec: TrainSpec, module: tuple[str, str] | None = None,
                timeout_s: float = 600) -> dict:
    """One simulated trace, in a child process (planner.runner)."""
    from .config import config_to_dict
    from .runner import run_worker

    payload = {"kind": "simulate", "spec": asdict(spec), "trace": True}
    if module:
        payload["module"] = list(module)
    else:
        payload["config"] = config_to_dict(cfg)
    out = run_worker(payload, timeout_s=timeout_s)
    if out.exit_code:
        raise RuntimeError(f"simulating b={spec.batch_size} s={spec.seq_len} failed: {out.record.get('error')}")
    return out.record["trace"]


def fit_whatif(cfg: ModelConfig | None, spec: TrainSpec, points=DEFAULT_POINTS, module: tuple[str, str] | None = None,
               simulate: Callable[..., dict] = child_trace) -> WhatIf:
    """Simulate `spec` (everything but b and s kept) at `points` and fit the what-if polynomials.
    `simulate(cfg, spec, module)` returns a trace; the default runs each point in a child process."""
    traces = {(b, s): simulate(cfg, replace(spec, batch_size=b, seq_len=s), module) for b, s in points}
    return WhatIf.fit(traces)
