"""Instant what-ifs for any model: the simulated step's live bytes op by op as polynomials in (b, s).

For a fixed model and settings, the live bytes after each op of the training step are a polynomial in the
batch size b and the sequence length s, as long as the step runs the same ops: weights and optimizer state
are constant; activations are b*s*width (a text model) or b*width (an image or tabular model, whose input
shape is fixed); attention scores b*s^2; position tables and causal masks s or s^2; a contrastive loss's
logits b^2. So: simulate a few (b, s) points (planner.measure.simulate, trace=True), check that their op
sequences are identical, and fit each op's coefficients; the peak at any (b, s) is the maximum over ops of
those polynomials (a matrix-vector product: microseconds).

Which terms. The candidates are CANDIDATES (1, b, s, b*s, s^2, b*s^2, b^2). The basis is chosen from the
data: the smallest set of candidates (always with the constant) that reproduces every op at every fitted point
exactly (to half a byte: live bytes are integers), among the sets the points determine with at least one
point to spare (so "exact" is a check, not a tautology). A CNN whose batch ignores s gets {1, b}; a text
model {1, s, s^2, b*s, b*s^2} or fewer.

Validation, every time. Every fit is checked on held-out points (simulated, never fitted): each op's fitted
live bytes against the simulated ones. Where they agree to half a byte the fit is "exact" (at those points);
otherwise it is "approximate" and says by how much: `bound_bytes` is the largest difference seen (over the
held-out points' ops and peaks, and the fitted points' residuals), and every answer carries it. A fit with
no held-out point is "unvalidated" (bound unknown) and says so. Nothing is answered silently.

Batch 1 may take other paths (Hugging Face models do; a b = 1 matmul may fold differently), so points with
b = 1 that do not align with the others get a fit of their own in (1, s, s^2); where no fit covers a query
(b = 1 with no aligned b = 1 points) it is refused rather than guessed. Op sequences that differ between
points of the same class (a kernel chosen by shape) raise MisalignedError: simulate that point instead.
No torch here: the simulations run through a callable (by default one child process for all points).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np

from .config import ModelConfig
from .fit import largest_fitting  # the fitted peak grows with b and s, as the formula's does
from .spec import WHATIF_POINTS as DEFAULT_POINTS  # the fit points (in spec.py: the CLI's default, numpy-free)
from .spec import WHATIF_HOLDOUT as DEFAULT_HOLDOUT
from .spec import TrainSpec

TERMS = ("1", "s", "s^2", "b*s", "b*s^2")  # the basis of fits saved before the basis was chosen from the data
CANDIDATES = ("1", "b", "s", "b*s", "s^2", "b*s^2", "b^2")
_BATCH_ONE = ("1", "s", "s^2")  # b = 1: the b terms fold into these
EXACT_BYTES = 0.5  # live bytes are integers: a polynomial that is right is right to within rounding
MIN_POINTS = 5     # points with batch >= 2 a fit needs (the CLI refuses fewer before any child runs)


class MisalignedError(ValueError):
    """Points whose steps run different op sequences cannot share a fit (one line)."""


def term_value(term: str, b: float, s: float) -> float:
    return {"1": 1.0, "b": b, "s": s, "b*s": b * s, "s^2": s * s, "b*s^2": b * s * s, "b^2": b * b}[term]


def basis(b: int, s: int, batch_one: bool = False, terms=None) -> np.ndarray:
    terms = terms if terms is not None else (_BATCH_ONE if batch_one else TERMS)
    return np.array([term_value(t, b, s) for t in terms])


def _matrix(points, terms) -> np.ndarray:
    return np.array([[term_value(t, b, s) for t in terms] for b, s in points], dtype=float)


@dataclass
class _Fit:
    batch_one: bool
    points: list[tuple[int, int]]
    ops: list[str]
    phases: list[str]
    coef: np.ndarray          # (n_ops, n_terms), bytes per unscaled basis term
    max_residual_bytes: float  # largest |fitted - simulated| over the fitted points and ops
    terms: tuple[str, ...] = TERMS
    exact: bool = True         # the chosen basis reproduces the fitted points to EXACT_BYTES

    def live(self, b: int, s: int) -> np.ndarray:
        return self.coef @ basis(b, s, terms=self.terms)


@dataclass
class Validation:
    """The held-out check of a fit: simulated points never fitted, compared op by op."""
    points: list[tuple[int, int]] = field(default_factory=list)
    max_op_error_bytes: float = 0.0    # largest |fitted - simulated| live bytes over their ops
    max_peak_error_bytes: float = 0.0  # largest |fitted peak - simulated peak|
    misaligned: list[str] = field(default_factory=list)  # points whose steps ran other ops (their peak compared)
    rows: list[dict] = field(default_factory=list)       # per point: b, s, fitted, simulated, error

    @property
    def exact(self) -> bool:
        return bool(self.points) and not self.misaligned and self.max_op_error_bytes <= EXACT_BYTES

    def to_dict(self) -> dict:
        return {"points": [list(p) for p in self.points], "max_op_error_bytes": self.max_op_error_bytes,
                "max_peak_error_bytes": self.max_peak_error_bytes, "misaligned": self.misaligned,
                "rows": self.rows, "exact": self.exact}

    @classmethod
    def from_dict(cls, d: dict) -> "Validation":
        return cls([tuple(p) for p in d["points"]], float(d["max_op_error_bytes"]), float(d["max_peak_error_bytes"]),
                   list(d.get("misaligned", [])), list(d.get("rows", [])))


class WhatIf:
    """The fitted step: `peak_bytes(b, s)`, `peak(b, s)` (bytes, phase, op), `phase_peak_bytes(b, s)`, and how far
    its answers can be trusted: `exact`, `bound_bytes`, `status`, `validation`."""

    def __init__(self, fits: list[_Fit], validation: Validation | None = None):
        self.fits = fits
        self.validation = validation

    @classmethod
    def fit(cls, traces: dict[tuple[int, int], dict], held_out: dict[tuple[int, int], dict] | None = None,
            sequence: bool = True) -> "WhatIf":
        """traces: (b, s) -> simulate_training(..., trace=True)["trace"]; held_out: the same for points that
        are only checked. sequence=False: the model has no sequence axis (only b varies; s terms are left out)."""
        many = {p: t for p, t in traces.items() if p[0] >= 2}
        ones = {p: t for p, t in traces.items() if p[0] == 1}
        if len(many) < MIN_POINTS:
            raise MisalignedError(f"need at least {MIN_POINTS} points with batch >= 2, got {len(many)}")
        ref = next(iter(many.values()))
        if ones and all(_aligned(ref, t) for t in ones.values()):
            many, ones = {**many, **ones}, {}
        candidates = CANDIDATES if sequence else tuple(t for t in CANDIDATES if "s" not in t)
        fits = [_fit(many, batch_one=False, candidates=candidates)]
        if ones:
            need = 1 if not sequence else 3
            if len(ones) < need:
                raise MisalignedError(f"batch 1 runs other ops than batch >= 2 here; its own fit needs {need} points "
                                      f"with batch 1, got {len(ones)}")
            fits.append(_fit(ones, batch_one=True, candidates=_BATCH_ONE if sequence else ("1",)))
        what = cls(fits)
        if held_out is not None:
            what.validation = what.check(held_out)
        return what

    def check(self, held_out: dict[tuple[int, int], dict]) -> Validation:
        """Compare the fit with simulated points it was not fitted on (op by op where their ops align)."""
        v = Validation(points=sorted(held_out))
        for p in v.points:
            trace = held_out[p]
            simulated = max(trace["bytes"]) if trace["bytes"] else 0
            try:
                f = self._fit_for(p[0])
            except MisalignedError:
                v.misaligned.append(f"b={p[0]} s={p[1]}: batch 1 is not covered by the fit")
                continue
            live = f.live(*p)
            fitted = float(live.max())
            if trace["ops"] == f.ops and trace["phases"] == f.phases:
                op_err = float(np.abs(live - np.asarray(trace["bytes"], dtype=float)).max())
            else:
                v.misaligned.append(f"b={p[0]} s={p[1]}: the step runs other ops ({len(trace['ops'])} against "
                                    f"{len(f.ops)}); its peak is compared")
                op_err = abs(fitted - simulated)
            v.max_op_error_bytes = max(v.max_op_error_bytes, op_err)
            v.max_peak_error_bytes = max(v.max_peak_error_bytes, abs(fitted - simulated))
            v.rows.append({"batch": p[0], "seq": p[1], "fitted_bytes": int(round(fitted)), "simulated_bytes": simulated,
                           "error_bytes": int(round(fitted)) - simulated})
        return v

    # ---- how far the answers can be trusted ----------------------------------------------------------
    @property
    def exact(self) -> bool:
        """True when every fit reproduces its points and the held-out points to half a byte."""
        return self.validation is not None and self.validation.exact and all(f.exact for f in self.fits)

    @property
    def status(self) -> str:
        """exact | approximate | unvalidated (no held-out point was simulated: fits saved before validation)."""
        if self.validation is None or not self.validation.points:
            return "unvalidated"
        return "exact" if self.exact else "approximate"

    @property
    def bound_bytes(self) -> int | None:
        """The largest error seen (held-out points' ops and peaks, fitted points' residuals), rounded up; 0 when
        exact; None when unvalidated."""
        if self.status == "unvalidated":
            return None
        if self.exact:
            return 0
        v = self.validation
        worst = max([v.max_op_error_bytes, v.max_peak_error_bytes] + [f.max_residual_bytes for f in self.fits])
        return int(math.ceil(worst))

    def describe(self) -> str:
        """One line: the basis and the held-out check (what the page and the CLI print)."""
        terms = "; ".join(("batch 1: " if f.batch_one else "") + ", ".join(f.terms) for f in self.fits)
        v = self.validation
        if self.status == "unvalidated":
            return f"basis {terms}; not validated on held-out points (fit again): its error is unknown"
        where = ", ".join(f"b={b} s={s}" for b, s in v.points)
        if self.exact:
            return f"basis {terms}; exact at the held-out points {where} (every op to the byte)"
        return (f"basis {terms}; APPROXIMATE: off by up to {self.bound_bytes:,} B at the held-out points {where}"
                + (f" ({'; '.join(v.misaligned)})" if v.misaligned else ""))

    @property
    def has_seq(self) -> bool:
        """Whether the fitted step depends on s at all (an image model's does not: its sliders show batch only)."""
        return any("s" in t for f in self.fits for t in f.terms)

    # ---- answers ---------------------------------------------------------------------------------------
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

    def answer(self, b: int, s: int) -> dict:
        """The fitted peak with how far it can be trusted: peak_bytes, peak_phase, peak_op, status, bound_bytes."""
        peak, phase, op = self.peak(b, s)
        return {"peak_bytes": peak, "peak_phase": phase, "peak_op": op, "status": self.status,
                "exact": self.exact, "bound_bytes": self.bound_bytes}

    def phase_peak_bytes(self, b: int, s: int) -> dict[str, int]:
        f = self._fit_for(b)
        live = f.live(b, s)
        out: dict[str, int] = {}
        for phase in dict.fromkeys(f.phases):
            mask = np.array([p == phase for p in f.phases])
            out[phase] = int(round(live[mask].max()))
        return out

    def to_dict(self) -> dict:
        """The summary a record carries: the basis per fit, the held-out check, the status and bound."""
        return {"terms": list(self.fits[0].terms), "candidates": list(CANDIDATES), "status": self.status,
                "exact": self.exact, "bound_bytes": self.bound_bytes, "sequence": self.has_seq,
                "description": self.describe(),
                "validation": self.validation.to_dict() if self.validation else None,
                "fits": [{"batch_one": f.batch_one, "points": [list(p) for p in f.points], "ops": len(f.ops),
                          "terms": list(f.terms), "exact": f.exact, "max_residual_bytes": f.max_residual_bytes}
                         for f in self.fits]}

    def save_dict(self) -> dict:
        """Everything a later process needs to answer queries (WhatIf.from_dict): JSON-able."""
        return {"version": 2, "terms": list(self.fits[0].terms), "candidates": list(CANDIDATES),
                "validation": self.validation.to_dict() if self.validation else None, "fits": [
                    {"batch_one": f.batch_one, "points": [list(p) for p in f.points], "ops": f.ops, "phases": f.phases,
                     "terms": list(f.terms), "exact": f.exact, "coef": f.coef.tolist(),
                     "max_residual_bytes": f.max_residual_bytes} for f in self.fits]}

    @classmethod
    def from_dict(cls, d: dict) -> "WhatIf":
        if d.get("version") is None:  # a fit saved before the basis was chosen: the old five terms, unvalidated
            if d.get("terms") != list(TERMS):
                raise ValueError(f"a what-if fit with terms {d.get('terms')}, not {list(TERMS)}")
            return cls([_Fit(f["batch_one"], [tuple(p) for p in f["points"]], list(f["ops"]), list(f["phases"]),
                             np.array(f["coef"], dtype=float), float(f["max_residual_bytes"]),
                             _BATCH_ONE if f["batch_one"] else TERMS, True) for f in d["fits"]])
        fits = [_Fit(f["batch_one"], [tuple(p) for p in f["points"]], list(f["ops"]), list(f["phases"]),
                     np.array(f["coef"], dtype=float).reshape(len(f["ops"]), len(f["terms"])),
                     float(f["max_residual_bytes"]), tuple(f["terms"]), bool(f["exact"])) for f in d["fits"]]
        return cls(fits, Validation.from_dict(d["validation"]) if d.get("validation") else None)

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


def _lstsq(points, terms, Y: np.ndarray) -> tuple[np.ndarray, float] | None:
    """Least squares of Y (n_points, n_ops) on `terms`: (coef (n_ops, n_terms), largest residual), or None when
    the points do not determine the terms. Columns are scaled to their largest value (well conditioned)."""
    A = _matrix(points, terms)
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    As = A / scale
    if np.linalg.matrix_rank(As) < len(terms):
        return None
    # The least-squares solution as pinv(As) @ Y: As has full column rank (checked above), so this is lstsq's
    # solution; it is the same SVD of the small (points x terms) matrix, then one product, where np.linalg.lstsq
    # factors with every right-hand side (one per op: thousands) and, with a multi-threaded BLAS on a loaded
    # machine, took 28 s for the 25 solves of a 7B depth fit (pinv: 1 s; measured, 13 x 7 by 20,000).
    sol = np.linalg.pinv(As) @ Y
    residual = float(np.abs(As @ sol - Y).max()) if Y.size else 0.0
    return (sol / scale[:, None]).T, residual


def choose_basis(points, Y: np.ndarray, candidates=CANDIDATES) -> tuple[tuple[str, ...], np.ndarray, float, bool]:
    """The smallest set of candidates (with the constant) that reproduces Y at every point to EXACT_BYTES, among
    the sets the points determine with a point to spare: (terms, coef, residual, exact). Where none does, the
    largest set the points determine (least squares: exact False, residual says by how much)."""
    rest = [t for t in candidates if t != "1"]
    for k in range(0, len(rest) + 1):
        if k + 1 >= len(points):  # no point to spare: exactness would prove nothing
            break
        for combo in itertools.combinations(rest, k):
            terms = ("1",) + combo
            got = _lstsq(points, terms, Y)
            if got is not None and got[1] <= EXACT_BYTES:
                return terms, got[0], got[1], True
    terms: tuple[str, ...] = ("1",)
    for t in rest:  # greedily, every candidate the points still determine
        if len(terms) + 1 <= len(points) and _lstsq(points, terms + (t,), Y[:, :0]) is not None:
            terms += (t,)
    coef, residual = _lstsq(points, terms, Y)
    return terms, coef, residual, residual <= EXACT_BYTES and len(terms) < len(points)


def _fit(traces: dict[tuple[int, int], dict], batch_one: bool, candidates=CANDIDATES) -> _Fit:
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
    Y = np.array([traces[p]["bytes"] for p in points], dtype=float)  # (n_points, n_ops)
    if len(points) == 1:  # one point: the constant (batch 1 of a model without a sequence: the only input)
        return _Fit(batch_one, points, list(ref["ops"]), list(ref["phases"]), Y.T.copy(), 0.0, ("1",), True)
    terms, coef, residual, exact = choose_basis(points, Y, candidates)
    return _Fit(batch_one, points, list(ref["ops"]), list(ref["phases"]), coef, float(residual), terms, bool(exact))


def child_trace(cfg: ModelConfig | None, spec: TrainSpec, module: tuple | None = None,
                timeout_s: float = 600) -> dict:
    """One simulated trace, in a child process (planner.runner)."""
    return child_traces(cfg, spec, [(spec.batch_size, spec.seq_len)], module, timeout_s)[(spec.batch_size, spec.seq_len)]


def child_traces(cfg: ModelConfig | None, spec: TrainSpec, points, module: tuple | None = None,
                 timeout_s: float = 600, on_point: Callable[[tuple[int, int]], None] = lambda p: None,
                 param_counts: dict | None = None) -> dict:
    """Simulated traces at every (b, s) of `points` (or (b, s, layers): the model cut to that depth), all in ONE
    child process (torch is imported once: planner.measure.simulate worker_main's "points"); on_point(p) after
    each; `param_counts`, if given, gets each point's parameter count. RuntimeError (one line) if one fails,
    naming the point."""
    from .config import config_to_dict
    from .runner import run_worker

    payload = {"kind": "simulate", "spec": asdict(spec), "trace": True, "points": [list(p) for p in points]}
    if module:
        payload["module"] = list(module)
    else:
        payload["config"] = config_to_dict(cfg)

    def on_event(e: dict) -> None:
        if e.get("event") == "point":
            on_point(tuple(e["point"]))

    out = run_worker(payload, timeout_s=timeout_s * max(1, len(points)), on_event=on_event)
    if out.exit_code:
        where = out.record.get("point")
        at = f"b={where[0]} s={where[1]}" if where else "a point"
        err = RuntimeError(f"simulating {at} failed: {out.record.get('error', 'the child died')}")
        err.exit_code = out.exit_code  # 2: the model cannot be simulated (invalid input); 3: a timeout or a crash
        raise err
    if param_counts is not None:
        param_counts.update({tuple(p): n for p, n in out.record.get("param_counts", [])})
    return {tuple(p): t for p, t in out.record["traces"]}


def fit_whatif(cfg: ModelConfig | None, spec: TrainSpec, points=DEFAULT_POINTS, module: tuple | None = None,
               simulate: Callable[..., dict] | None = None, holdout=DEFAULT_HOLDOUT, sequence: bool = True,
               on_point: Callable[[tuple[int, int]], None] = lambda p: None, timeout_s: float = 600) -> WhatIf:
    """Simulate `spec` (everything but b and s kept) at `points` and at the held-out `holdout` points, fit the
    what-if polynomials on the first and check them on the second (WhatIf.validation).
    `simulate(cfg, spec, module)` returns one trace (tests run it in-process); the default simulates every point
    in one child process. sequence=False: a model without a sequence axis (points' s is ignored)."""
    points = [tuple(p) for p in points]
    holdout = [tuple(p) for p in holdout if tuple(p) not in points]
    every = points + holdout
    if simulate is None:
        traces = child_traces(cfg, spec, every, module, timeout_s, on_point)
    else:
        traces = {}
        for b, s in every:
            traces[(b, s)] = simulate(cfg, replace(spec, batch_size=b, seq_len=s), module)
            on_point((b, s))
    return WhatIf.fit({p: traces[p] for p in points}, {p: traces[p] for p in holdout}, sequence=sequence)
