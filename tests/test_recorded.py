"""Every recorded measurement of every accuracy grid, re-estimated with the code as it is now.

tests/data/measured/<grid>.jsonl holds the real steps `python -m planner bench record` measured
(bench/recorded.py); here the estimate of each row is held to its grid's bar (GRID_BAR_PCT, this file's own),
which takes seconds for all of them, so a change to any estimator meets ~1,700 real measurements on every test
run. The measurements are checked too: one row of each grid is measured again in a fresh child and must equal
its record to the byte (a file recorded on other library versions is refused: renew it with `bench record --grid NAME`).
"""
from __future__ import annotations

from dataclasses import asdict

import pytest

from bench.recorded import RECORD_DIR, load, re_estimate, versions

FILES = sorted(RECORD_DIR.glob("*.jsonl"))
# Each grid's bar, |estimate - measured| / measured in percent, from the issue that set it:
GRID_BAR_PCT = {
    "accuracy": 2.0,       # issue #3: the training-step grid, worst |error| on the CPU
    "families": 1.0,       # issue #10: every family within 1% of transformers' measured model
    "finetune": 1.0,       # issue #12: trainable subsets and LoRA within 1% of the measured step
    "finetune-book": 1.0,  # issue #12: the book's GPT-2 fine-tuning rows, the same 1%
    "qlora": 2.0,          # issue #12: a bitsandbytes-quantized base (QLoRA) within 2%
    "8bit": 2.0,           # issue #12: bitsandbytes' 8-bit optimizers within 2% (aim: 1%)
    "finetune-amp": 1.0,   # issue #19: frozen layers and LoRA under fp16-AMP and bf16-AMP within 1%
}
# A documented gap (planner/estimate/finetune.py known_gap) is held to this looser bar, as `bench finetune` and
# `bench finetune-amp` mark it (none is named now: the recompute transients that were the gap are modelled).
GAP_BAR_PCT = 6.0


def test_every_grid_is_recorded():
    from bench.recorded import grids

    assert {p.stem for p in FILES} == set(grids()) == set(GRID_BAR_PCT)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_recorded_row_within_its_grid_bar(path):
    header, rows = load(path)
    release = lambda vs: {k: v.split("+")[0] for k, v in vs.items()}  # 2.13.0+cpu is torch 2.13.0's CPU wheel
    assert release(header["versions"]) == release(versions()), \
        f"{path.name} was measured on other versions: bench record --grid {path.stem}"
    assert len(rows) == header["rows"] > 0
    from bench.recorded import is_gap

    bar = GRID_BAR_PCT[path.stem]
    misses = []
    for row in rows:
        est, err = re_estimate(row)
        if abs(err) > (GAP_BAR_PCT if is_gap(path.stem, row) else bar):  # a documented gap: its looser bar
            misses.append(f"{row['label']}: estimate {est:,} vs measured {row['peak_bytes']:,} ({err:+.3f}%)")
    assert not misses, f"{len(misses)} of {len(rows)} rows beyond {bar}%:\n" + "\n".join(misses[:20])


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_a_recorded_row_is_what_a_fresh_child_measures(path):
    """The record is a real measurement: the middle row of each grid, measured again in a child
    (`measure train`'s own process), equals it to the byte, phase by phase."""
    from planner.runner import run_worker
    from planner.spec import TrainSpec

    _, rows = load(path)
    row = rows[len(rows) // 2]
    spec = TrainSpec(**row["spec"])
    out = run_worker({"config": row["config"], "spec": asdict(spec)}, timeout_s=300)
    assert out.exit_code == 0, out.stderr[-2000:]
    assert out.record["peak_bytes"] == row["peak_bytes"], row["label"]
    assert out.record["phase_peak_bytes"] == row["phase_peak_bytes"], row["label"]
