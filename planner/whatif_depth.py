"""What-ifs across depth: a full-width model simulated with a few layers, extrapolated to all of them (no torch).

A 7B-class step at full depth simulates in seconds per point, and a what-if fit needs a dozen points: too slow for
a first answer. The step of a decoder whose blocks are alike is periodic in its layers: at depth L its op
sequence is a fixed part plus three runs of one block's ops repeated L times (the forward, the backward, the
optimizer's per-parameter loop). So (planner.whatif's idea, one axis more):

1. Simulate at full width with base + 2u, base + 3u and base + 4u layers (u: the layer-type period, 1 for alike
   blocks, 2 for alternating sliding/global layers, ...; base: L mod u, so the target depth is base + M*u). Two
   units at least (M0): with one, the only block is both the first and the last one and behaves as neither.
2. Structure: the op sequences at M0 and M0 + 1 units differ only by inserted runs (difflib's opcodes, nothing
   replaced or deleted); inserting each run twice must give the M0 + 2 sequence exactly, else the step is not
   periodic in its layers and no depth fit is made (Structure.find raises MisalignedError).
3. Bytes: after a fixed op, live bytes are alpha + beta*m (weights, grads and states grow with the depth); after
   the j-th repetition (j = 1 .. m - M0) of a run's op, alpha + beta*m + gamma*j (a block's saved activations pile
   up with j in the forward and go with it in the backward). The three depths give each fixed op three readings
   for two unknowns (a check) and each run op three for three. Each of alpha, beta, gamma is then a polynomial in
   (b, s) fitted over the points with the basis the data call for (planner.whatif.choose_basis).
4. The peak at (b, s, M): the largest of alpha + beta*M over fixed ops and alpha + beta*M + gamma*j over run ops,
   j at 1 or M - M0 (an affine function of j is largest at an end): a few vector operations.

Validation: held-out points simulated at the full depth (never fitted), op by op against the extrapolation,
as planner.whatif does: "exact" only where every op agrees to half a byte; otherwise "approximate" with the
largest error seen as its bound.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

import numpy as np

from .whatif import CANDIDATES, EXACT_BYTES, MIN_POINTS, MisalignedError, Validation, _BATCH_ONE, choose_basis, term_value


def _names(trace: dict) -> list[tuple[str, str]]:
    return list(zip(trace["ops"], trace["phases"]))


def _tokens(trace: dict) -> list[tuple[str, str, int]]:
    """What identifies an op across depths: its name, its phase and what it changed in the live bytes (the optimizer
    updates every parameter with the same ops: only their sizes tell a block's weights from the head's)."""
    b = trace["bytes"]
    return [(o, p, int(y - (b[i - 1] if i else y))) for i, (o, p, y) in enumerate(zip(trace["ops"], trace["phases"], b))]


M0 = 2  # the fewest units simulated: with one, the only block is both the first and the last (it frees what the
# blocks share, RoPE's cos and sin, at once: measured, a 1-layer OLMo 2 step holds 3,072 B less in its backward than
# the trend of 2 and 3 layers); from two on, the first and last blocks are fixed ops and the runs middle blocks.
UNITS = (M0, M0 + 1, M0 + 2)


@dataclass
class Structure:
    """A depth-periodic op sequence: the fixed ops (the M0-unit sequence, `base`) and runs inserted at positions of
    it, each repeated m - M0 times at m units."""
    base: list[tuple[str, str]]
    runs: list[tuple[int, list[tuple[str, str]]]]  # (position in base, the run's ops)

    @classmethod
    def find(cls, one: dict, two: dict, three: dict) -> "Structure":
        """From the traces of one (b, s) point at M0, M0 + 1 and M0 + 2 units. The ops are matched by name, phase
        and change in live bytes (_tokens), so that a run is a block's own ops (the optimizer's updates of the
        head and of a block's weights have the same names); an op whose change alone differs (it frees something
        that grows with the depth) stays a fixed op."""
        ta, tb = _tokens(one), _tokens(two)
        a, b, c = (_names(t) for t in (one, two, three))
        if len(b) - len(a) != len(c) - len(b) or len(b) <= len(a):
            raise MisalignedError(f"the step does not grow by the same ops per unit of depth ({len(a)}, {len(b)}, "
                                  f"{len(c)} ops at {UNITS} units)")
        runs = []
        ids: dict = {}  # each distinct token as a small int: difflib hashes and compares ints faster than tuples
        ia, ib = [ids.setdefault(t, len(ids)) for t in ta], [ids.setdefault(t, len(ids)) for t in tb]
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ia, ib, autojunk=False).get_opcodes():
            if tag == "insert":
                runs.append((i1, b[j1:j2]))
            elif tag == "replace" and a[i1:i2] == b[j1:j2]:
                continue  # the same ops, another change in bytes: fixed ops
            elif tag != "equal":
                raise MisalignedError(f"one more unit of depth changes ops of the step ({tag} at op {i1}), not only "
                                      "adds some: its blocks are not alike")
        s = cls(a, runs)
        if s.names(M0 + 2) != c:
            raise MisalignedError("the step at 3 units of depth is not the one at 2 with one more run of each block's "
                                  "ops: its blocks are not alike (a layer-type period this fit does not know?)")
        return s

    def names(self, m: int) -> list[tuple[str, str]]:
        out, prev = [], 0
        for pos, run in self.runs:
            out += self.base[prev:pos] + run * (m - M0)
            prev = pos
        return out + self.base[prev:]

    def layout(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """(virtual op index, repetition j) of every op of the m-unit sequence; virtual ops are the base ops, then
        each run's ops in order; j = 0 for base ops, 1 .. m - M0 for the runs' repetitions."""
        idx, rep, prev = [], [], 0
        offset = len(self.base)
        for pos, run in self.runs:
            idx += list(range(prev, pos))
            rep += [0] * (pos - prev)
            for j in range(1, m - M0 + 1):
                idx += list(range(offset, offset + len(run)))
                rep += [j] * len(run)
            offset += len(run)
            prev = pos
        idx += list(range(prev, len(self.base)))
        rep += [0] * (len(self.base) - prev)
        return np.array(idx), np.array(rep)

    @property
    def virtual(self) -> list[tuple[str, str]]:
        return self.base + [t for _, run in self.runs for t in run]

    @property
    def n_fixed(self) -> int:
        return len(self.base)


def _abg(structure: Structure, ys: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """alpha, beta, gamma of every virtual op from the live bytes at UNITS (M0, M0 + 1, M0 + 2 units), and the
    largest residual of the fixed ops' three readings (their check)."""
    n, nf = len(structure.virtual), structure.n_fixed
    m0, m1, m2 = UNITS
    obs: dict[int, dict] = {}
    for m in UNITS:
        idx, rep = structure.layout(m)
        for v, j, y in zip(idx, rep, ys[m]):
            obs.setdefault(int(v), {})[(m, int(j))] = float(y)
    alpha, beta, gamma = np.zeros(n), np.zeros(n), np.zeros(n)
    worst = 0.0
    for v in range(nf):  # y = alpha + beta * m at the three depths
        y0, y1, y2 = obs[v][(m0, 0)], obs[v][(m1, 0)], obs[v][(m2, 0)]
        beta[v] = (y2 - y0) / 2
        alpha[v] = (y0 + y1 + y2) / 3 - m1 * beta[v]
        worst = max(worst, abs(alpha[v] + beta[v] * m1 - y1))
    for v in range(nf, n):  # y = alpha + beta * m + gamma * j at (M0 + 1, 1), (M0 + 2, 1), (M0 + 2, 2)
        a, b_, c = obs[v][(m1, 1)], obs[v][(m2, 1)], obs[v][(m2, 2)]
        gamma[v] = c - b_
        beta[v] = b_ - a
        alpha[v] = a - m1 * beta[v] - gamma[v]
    return alpha, beta, gamma, worst


@dataclass
class _DepthFit:
    batch_one: bool
    points: list[tuple[int, int]]
    structure: Structure
    terms: tuple[str, ...]
    coef: np.ndarray           # (3 * n_virtual, n_terms): alpha, beta, gamma stacked
    max_residual_bytes: float
    exact: bool

    def abg(self, b: int, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        y = self.coef @ np.array([term_value(t, b, s) for t in self.terms])
        n = len(self.structure.virtual)
        return y[:n], y[n:2 * n], y[2 * n:]

    def candidates(self, b: int, s: int, m: int) -> tuple[np.ndarray, list[str]]:
        """Live bytes at the step's possible high points at m units: every fixed op, every run op at j = 1 and
        j = m - M0; and their phases."""
        alpha, beta, gamma = self.abg(b, s)
        nf = self.structure.n_fixed
        phases = [p for _, p in self.structure.virtual]
        fixed = alpha[:nf] + beta[:nf] * m
        if m <= M0:
            return fixed, phases[:nf]
        base = alpha[nf:] + beta[nf:] * m
        live = np.concatenate([fixed, base + gamma[nf:], base + gamma[nf:] * (m - M0)])
        return live, phases[:nf] + phases[nf:] * 2

    def candidate_rows(self, m: int) -> tuple[np.ndarray, list[str], list[str]]:
        """(C, phases, ops) with live bytes at the high points at m units = C @ term values (what candidates()
        computes, its alpha + beta*m + gamma*j folded into one matrix once): a query is then one small
        matrix-vector product and an argmax, no Python lists of the ops (kept per m: ~0.05 ms a query on a 7B
        fit, against ~1 ms rebuilding the phase and op lists every time)."""
        cache = self.__dict__.setdefault("_rows", {})
        if m not in cache:
            n, nf = len(self.structure.virtual), self.structure.n_fixed
            a, be, g = self.coef[:n], self.coef[n:2 * n], self.coef[2 * n:]
            rows = [a[:nf] + be[:nf] * m]
            if m > M0:
                run = a[nf:] + be[nf:] * m
                rows += [run + g[nf:], run + g[nf:] * (m - M0)]
            phases = [p for _, p in self.structure.virtual]
            cache[m] = (np.vstack(rows), phases[:nf] + (phases[nf:] * 2 if m > M0 else []), self.ops(m))
        return cache[m]

    def ops(self, m: int) -> list[str]:
        v = self.structure.virtual
        nf = self.structure.n_fixed
        return [o for o, _ in v[:nf]] + ([o for o, _ in v[nf:]] * 2 if m > M0 else [])

    def trace(self, b: int, s: int, m: int) -> np.ndarray:
        """The whole m-unit step's live bytes op by op (for the held-out check)."""
        alpha, beta, gamma = self.abg(b, s)
        idx, rep = self.structure.layout(m)
        return alpha[idx] + beta[idx] * m + gamma[idx] * rep


def _fit_class(by_depth: dict[int, dict[tuple[int, int], dict]], batch_one: bool, candidates) -> _DepthFit:
    points = sorted(by_depth[M0])
    first = points[0]
    structure = Structure.find(*(by_depth[m][first] for m in UNITS))
    rows, worst = [], 0.0
    for p in points:
        ys = {}
        for m in UNITS:
            t = by_depth[m][p]
            if _names(t) != structure.names(m):
                raise MisalignedError(f"the step at b={p[0]} s={p[1]} ({m} units of depth) runs other ops than at "
                                      f"b={first[0]} s={first[1]}: a kernel is chosen by shape here")
            ys[m] = np.asarray(t["bytes"], dtype=float)
        alpha, beta, gamma, res = _abg(structure, ys)
        worst = max(worst, res)
        rows.append(np.concatenate([alpha, beta, gamma]))
    Y = np.array(rows)
    if len(points) == 1:
        return _DepthFit(batch_one, points, structure, ("1",), Y.T.copy(), float(worst), bool(worst <= EXACT_BYTES))
    terms, coef, residual, exact = choose_basis(points, Y, candidates)
    return _DepthFit(batch_one, points, structure, terms, coef, float(max(worst, residual)),
                     bool(exact and worst <= EXACT_BYTES))


class DepthWhatIf:
    """The peak at any (b, s) of the model at its full depth `layers`, from simulations at base + u, 2u, 3u layers
    (see the module docstring). Answers as planner.whatif.WhatIf does, with the same status and bound."""

    def __init__(self, fits: list[_DepthFit], layers: int, base: int, unit: int, validation: Validation | None = None):
        self.fits, self.layers, self.base, self.unit = fits, layers, base, unit
        self.validation = validation

    @property
    def units(self) -> int:
        return (self.layers - self.base) // self.unit

    @classmethod
    def fit(cls, traces: dict[int, dict[tuple[int, int], dict]], layers: int, base: int, unit: int,
            held_out: dict[tuple[int, int], dict] | None = None, sequence: bool = True) -> "DepthWhatIf":
        """traces: m (UNITS: M0, M0 + 1, M0 + 2 units) -> (b, s) -> trace; held_out: (b, s) -> trace at the full
        depth `layers`."""
        if (layers - base) % unit or (layers - base) // unit < M0:
            raise MisalignedError(f"{layers} layers are not {base} + at least {M0} whole units of {unit}")
        many = {m: {p: t for p, t in tr.items() if p[0] >= 2} for m, tr in traces.items()}
        ones = {m: {p: t for p, t in tr.items() if p[0] == 1} for m, tr in traces.items()}
        if len(many[M0]) < MIN_POINTS:
            raise MisalignedError(f"need at least {MIN_POINTS} points with batch >= 2, got {len(many[M0])}")
        candidates = CANDIDATES if sequence else tuple(t for t in CANDIDATES if "s" not in t)
        ref = next(iter(many[M0].values()))
        if ones[M0] and all(_names(t) == _names(ref) for t in ones[M0].values()):
            many = {m: {**many[m], **ones[m]} for m in many}
            ones = {m: {} for m in ones}
        fits = [_fit_class(many, False, candidates)]
        if ones[M0]:
            fits.append(_fit_class(ones, True, _BATCH_ONE if sequence else ("1",)))
        what = cls(fits, layers, base, unit)
        if held_out is not None:
            what.validation = what.check(held_out)
        return what

    def _fit_for(self, b: int) -> _DepthFit:
        if b >= 2:
            return self.fits[0]
        if len(self.fits) > 1:
            return self.fits[1]
        if any(p[0] == 1 for p in self.fits[0].points):
            return self.fits[0]
        raise MisalignedError("batch 1 is not covered by this fit: simulate batch-1 points with the others")

    def check(self, held_out: dict[tuple[int, int], dict]) -> Validation:
        v = Validation(points=sorted(held_out))
        m = self.units
        for p in v.points:
            trace = held_out[p]
            simulated = max(trace["bytes"])
            try:
                f = self._fit_for(p[0])
            except MisalignedError:
                v.misaligned.append(f"b={p[0]} s={p[1]}: batch 1 is not covered by the fit")
                continue
            fitted = float(self.candidates_live(p[0], p[1])[0].max())
            if _names(trace) == f.structure.names(m):
                op_err = float(np.abs(f.trace(p[0], p[1], m) - np.asarray(trace["bytes"], dtype=float)).max())
            else:
                v.misaligned.append(f"b={p[0]} s={p[1]}: the full-depth step runs other ops than the extrapolation "
                                    f"({len(trace['ops'])} against {len(f.structure.names(m))}); its peak is compared")
                op_err = abs(fitted - simulated)
            v.max_op_error_bytes = max(v.max_op_error_bytes, op_err)
            v.max_peak_error_bytes = max(v.max_peak_error_bytes, abs(fitted - simulated))
            v.rows.append({"batch": p[0], "seq": p[1], "fitted_bytes": int(round(fitted)), "simulated_bytes": simulated,
                           "error_bytes": int(round(fitted)) - simulated})
        return v

    def candidates_live(self, b: int, s: int) -> tuple[np.ndarray, list[str], list[str]]:
        f = self._fit_for(b)
        live, phases = f.candidates(b, s, self.units)
        return live, phases, f.ops(self.units)

    # ---- the WhatIf interface ---------------------------------------------------------------------------
    @property
    def exact(self) -> bool:
        return self.validation is not None and self.validation.exact and all(f.exact for f in self.fits)

    @property
    def status(self) -> str:
        if self.validation is None or not self.validation.points:
            return "unvalidated"
        return "exact" if self.exact else "approximate"

    @property
    def bound_bytes(self) -> int | None:
        if self.status == "unvalidated":
            return None
        if self.exact:
            return 0
        v = self.validation
        return int(math.ceil(max([v.max_op_error_bytes, v.max_peak_error_bytes]
                                 + [f.max_residual_bytes for f in self.fits])))

    @property
    def has_seq(self) -> bool:
        return any("s" in t for f in self.fits for t in f.terms)

    def describe(self) -> str:
        terms = "; ".join(("batch 1: " if f.batch_one else "") + ", ".join(f.terms) for f in self.fits)
        depth = (f"{self.layers} layers extrapolated from "
                 + ", ".join(str(self.base + m * self.unit) for m in UNITS))
        v = self.validation
        if self.status == "unvalidated":
            return f"{depth}; basis {terms}; not validated on held-out points: its error is unknown"
        where = ", ".join(f"b={b} s={s}" for b, s in v.points)
        if self.exact:
            return f"{depth}; basis {terms}; exact at the held-out full-depth points {where} (every op to the byte)"
        return (f"{depth}; basis {terms}; APPROXIMATE: off by up to {self.bound_bytes:,} B at the held-out full-depth "
                f"points {where}" + (f" ({'; '.join(v.misaligned)})" if v.misaligned else ""))

    def peak(self, b: int, s: int) -> tuple[int, str, str]:
        f = self._fit_for(b)
        rows, phases, ops = f.candidate_rows(self.units)
        live = rows @ np.array([term_value(t, b, s) for t in f.terms])
        i = int(np.argmax(live))
        return int(round(live[i])), phases[i], ops[i]

    def peak_bytes(self, b: int, s: int) -> int:
        return self.peak(b, s)[0]

    def answer(self, b: int, s: int) -> dict:
        peak, phase, op = self.peak(b, s)
        return {"peak_bytes": peak, "peak_phase": phase, "peak_op": op, "status": self.status, "exact": self.exact,
                "bound_bytes": self.bound_bytes}

    def phase_peak_bytes(self, b: int, s: int) -> dict[str, int]:
        live, phases, _ = self.candidates_live(b, s)
        out: dict[str, int] = {}
        for phase in dict.fromkeys(phases):
            mask = np.array([p == phase for p in phases])
            out[phase] = int(round(live[mask].max()))
        return out

    def covers_batch_one(self) -> bool:
        return len(self.fits) > 1 or any(p[0] == 1 for p in self.fits[0].points)

    def to_dict(self) -> dict:
        return {"terms": list(self.fits[0].terms), "candidates": list(CANDIDATES), "status": self.status,
                "exact": self.exact, "bound_bytes": self.bound_bytes, "sequence": self.has_seq,
                "description": self.describe(), "depth": {"layers": self.layers, "base": self.base, "unit": self.unit,
                                                          "simulated": [self.base + m * self.unit for m in UNITS]},
                "validation": self.validation.to_dict() if self.validation else None,
                "fits": [{"batch_one": f.batch_one, "points": [list(p) for p in f.points],
                          "ops": len(f.structure.virtual), "terms": list(f.terms), "exact": f.exact,
                          "max_residual_bytes": f.max_residual_bytes} for f in self.fits]}

    def save_dict(self) -> dict:
        return {"version": 2, "kind": "depth", "layers": self.layers, "base": self.base, "unit": self.unit,
                "validation": self.validation.to_dict() if self.validation else None, "fits": [
                    {"batch_one": f.batch_one, "points": [list(p) for p in f.points],
                     "structure": {"base": [list(t) for t in f.structure.base],
                                   "runs": [[pos, [list(t) for t in run]] for pos, run in f.structure.runs]},
                     "terms": list(f.terms), "coef": f.coef.tolist(), "max_residual_bytes": f.max_residual_bytes,
                     "exact": f.exact} for f in self.fits]}

    @classmethod
    def from_dict(cls, d: dict) -> "DepthWhatIf":
        fits = []
        for f in d["fits"]:
            st = Structure([tuple(t) for t in f["structure"]["base"]],
                           [(int(pos), [tuple(t) for t in run]) for pos, run in f["structure"]["runs"]])
            fits.append(_DepthFit(f["batch_one"], [tuple(p) for p in f["points"]], st, tuple(f["terms"]),
                                  np.array(f["coef"], dtype=float).reshape(-1, len(f["terms"])),
                                  float(f["max_residual_bytes"]), bool(f["exact"])))
        return cls(fits, int(d["layers"]), int(d["base"]), int(d["unit"]),
                   Validation.from_dict(d["validation"]) if d.get("validation") else None)

    def max_batch(self, s: int, budget: int, limit: int = 1 << 20) -> tuple[int, str]:
        from .fit import largest_fitting

        first = 1 if self.covers_batch_one() else 2
        if self.peak_bytes(first, s) > budget:
            return 0, f"batch {first} needs {self.peak_bytes(first, s):,} B > {budget:,} B"
        best = largest_fitting(lambda b: self.peak_bytes(b, s) <= budget, first, limit)
        return best, (f"batch {best + 1} would not fit" if best < limit else f"the limit ({limit:,}) fits")

    def max_seq(self, b: int, budget: int, limit: int) -> tuple[int, str]:
        from .fit import largest_fitting

        if self.peak_bytes(b, 1) > budget:
            return 0, f"even a sequence of 1 needs {self.peak_bytes(b, 1):,} B > {budget:,} B"
        best = largest_fitting(lambda s: self.peak_bytes(b, s) <= budget, 1, limit)
        return best, (f"seq_len {best + 1} would not fit" if best < limit else f"the limit ({limit:,}) fits")
