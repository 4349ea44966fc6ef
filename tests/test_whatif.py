"""The honest what-if (issue #20): a basis chosen from the data, checked on held-out points every time, and an
answer that says "approximate, +/- X B" when the check fails (never a silent figure)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.spec import TrainSpec
from planner.whatif import CANDIDATES, MisalignedError, WhatIf, choose_basis, fit_whatif, term_value

ROOT = Path(__file__).resolve().parent.parent
POINTS = [(2, 16), (2, 32), (2, 48), (3, 16), (3, 40), (4, 24), (4, 48), (5, 32), (6, 16)]
HELD = [(7, 64), (9, 20)]

# The issue's CNN: make_batch(batch_size, seq_len) that ignores seq_len (images of a fixed size), BatchNorm.
CNN = '''
import torch
from torch import nn

def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

def make_batch(batch_size, seq_len):
    return torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))
'''


def synthetic(fn, points, ops=("a", "b", "c")):
    """Traces whose op i holds fn(i, b, s) live bytes (integers, as the tracker counts them)."""
    return {p: {"ops": list(ops), "phases": ["forward"] * len(ops), "bytes": [int(fn(i, *p)) for i in range(len(ops))]}
            for p in points}


def test_the_smallest_exact_basis_is_chosen_from_the_data():
    # op 0 constant, op 1 a b^2 (contrastive logits) term, op 2 a text model's b*s and b*s^2
    fn = lambda i, b, s: [1000, 1000 + 24 * b * b, 1000 + 8 * b * s + 2 * b * s * s][i]
    what = WhatIf.fit(synthetic(fn, POINTS), synthetic(fn, HELD))
    assert what.fits[0].terms == ("1", "b*s", "b*s^2", "b^2")
    assert what.status == "exact" and what.exact and what.bound_bytes == 0 and what.has_seq
    assert what.peak_bytes(100, 300) == fn(2, 100, 300)
    assert "exact at the held-out points b=7 s=64, b=9 s=20" in what.describe()
    # A batch-only model: no s term is taken, and the page then shows batch only.
    flat = WhatIf.fit(synthetic(lambda i, b, s: 512 + 96 * b, POINTS), synthetic(lambda i, b, s: 512 + 96 * b, HELD))
    assert flat.fits[0].terms == ("1", "b") and not flat.has_seq and flat.exact


def test_a_fit_that_misses_the_held_out_points_says_by_how_much():
    """Live bytes that are not a polynomial (a chunk count ceil(s/40)): the fit reproduces no held-out point exactly,
    so it is approximate, and its bound covers the real error at those points."""
    fn = lambda i, b, s: 4096 + 64 * b * s + 1000 * b * -(-s // 40) * (i == 2)
    what = WhatIf.fit(synthetic(fn, POINTS), synthetic(fn, HELD))
    assert what.status == "approximate" and not what.exact
    errors = [abs(what.peak_bytes(*p) - max(fn(i, *p) for i in range(3))) for p in HELD]
    assert max(errors) > 0 and what.bound_bytes >= max(errors)
    ans = what.answer(7, 64)
    assert ans["status"] == "approximate" and ans["bound_bytes"] == what.bound_bytes
    assert f"APPROXIMATE: off by up to {what.bound_bytes:,} B" in what.describe()
    # saved and read back, the bound and the check come along
    again = WhatIf.from_dict(json.loads(json.dumps(what.save_dict())))
    assert again.status == "approximate" and again.bound_bytes == what.bound_bytes
    assert again.peak_bytes(7, 64) == what.peak_bytes(7, 64)


def test_held_out_points_that_run_other_ops_are_compared_by_their_peak():
    fn = lambda i, b, s: 100 + b * s * (i + 1)
    held = synthetic(fn, HELD)
    held[(7, 64)] = {**held[(7, 64)], "ops": ["a", "x", "c"]}  # a kernel chosen by shape at the larger point
    what = WhatIf.fit(synthetic(fn, POINTS), held)
    assert what.status == "approximate" and what.validation.misaligned
    assert "b=7 s=64: the step runs other ops" in what.describe()


def test_unvalidated_fits_say_so_and_old_fits_still_read():
    fn = lambda i, b, s: 100 + b * s * (i + 1)
    what = WhatIf.fit(synthetic(fn, POINTS))
    assert what.status == "unvalidated" and what.bound_bytes is None and "not validated" in what.describe()
    old = {"terms": ["1", "s", "s^2", "b*s", "b*s^2"], "fits": [
        {"batch_one": False, "points": [[2, 16]], "ops": ["a"], "phases": ["forward"], "coef": [[1.0, 0, 0, 2.0, 0]],
         "max_residual_bytes": 0.0}]}
    legacy = WhatIf.from_dict(old)
    assert legacy.peak_bytes(3, 10) == 61 and legacy.status == "unvalidated"


def test_basis_choice_needs_a_point_to_spare():
    """Five points determine five terms exactly whatever the data: that proves nothing, so a 5-term truth from 5
    points is fitted by least squares and flagged, not called exact."""
    pts = POINTS[:5]
    Y = np.array([[1 + b * s + b * s * s + s * s + b * b] for b, s in pts], dtype=float)
    terms, coef, residual, exact = choose_basis(pts, Y, CANDIDATES)
    assert len(terms) <= 5 and (not exact or len(terms) < len(pts))
    with pytest.raises(MisalignedError, match="need at least 5 points"):
        WhatIf.fit(synthetic(lambda i, b, s: 1, POINTS[:4]))


def test_term_values():
    assert [term_value(t, 3, 5) for t in CANDIDATES] == [1, 3, 5, 15, 25, 75, 9]


def test_cnn_with_batch_norm_is_exact_at_the_issues_point(tmp_path):
    """The issue's case: a CNN at batch 16 was predicted 8.5% high with exit 0. Now the basis is {1, b}, the held-out
    check passes, and the answer at batch 16 equals the simulation there."""
    from planner.measure.simulate import simulate_training

    path = tmp_path / "cnn.py"
    path.write_text(CNN)
    module = (str(path), "make_model")
    spec = TrainSpec(2, 16, "bf16-amp", "adamw")
    what = fit_whatif(None, spec, module=module, simulate=lambda c, sp, m: simulate_training(None, sp, module=m,
                                                                                              trace=True)["trace"])
    assert what.fits[0].terms == ("1", "b") and not what.has_seq and what.exact
    sim = simulate_training(None, TrainSpec(16, 16, "bf16-amp", "adamw"), module=module)
    assert what.peak_bytes(16, 16) == sim["peak_bytes"]


def test_simulate_whatif_json_shows_the_basis_and_the_held_out_check(tmp_path):
    path = tmp_path / "cnn.py"
    path.write_text(CNN)
    r = subprocess.run([sys.executable, "-m", "planner", "simulate", "whatif", "--module", f"{path}:make_model",
                        "--batch-size", "16", "--seq-len", "16", "--json"], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["basis"] == "fitted simulation" and rec["terms"] == ["1", "b"] and rec["status"] == "exact"
    assert rec["exact"] is True and rec["bound_bytes"] == 0
    assert rec["held_out"]["exact"] and [r["error_bytes"] for r in rec["held_out"]["rows"]] == [0, 0]
    assert {tuple(p) for p in rec["holdout"]} == {(7, 64), (1, 64)}
