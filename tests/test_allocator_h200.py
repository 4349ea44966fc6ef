"""The caching-allocator replay (planner/allocator.py) against every H200 row with max_memory_reserved
(tests/data/cuda/2026-11-27-h200: the realistic rows, and the largest-batch runs of fit-largest-batch.json), no GPU
needed: each row's step as the simulate sees it (recorded by tests/record_alloc_events.py into alloc-events.jsonl.gz)
is replayed as planner/measure/training.py runs it (build, warm-up step, reset_peak_memory_stats, measured step).

The bar (2% of max_memory_reserved) is this test's; the replayed max_memory_allocated is held too (0.5%), as the
check that the event list is the step CUDA ran. docs/gpu.md has the table (`python tests/test_allocator_h200.py`
prints it)."""
from __future__ import annotations

import gzip
import json

import pytest

from planner.allocator import events_from_run, figures, replay
from planner.estimate.training import CUBLAS_WORKSPACE_BYTES_PER_HANDLE, CUDA_CONTEXT_BYTES
from tests.record_alloc_events import DATA, OUT, decode, largest_label

GiB = 2**30
# The H200's total as torch's OOM message printed it (fit-largest-batch.json, b21: "GPU 0 has a total capacity of
# 139.80 GiB"; format_size prints two decimals, so +-0.005 GiB); cudaMalloc can hand out that less the CUDA context.
H200_TOTAL = int(139.80 * GiB)
H200_CAPACITY = H200_TOTAL - CUDA_CONTEXT_BYTES
RESERVED_BAR = 0.02
ALLOCATED_BAR = 0.005


def _events() -> dict[str, dict]:
    with gzip.open(OUT, "rt") as fh:
        return {r["label"]: r for r in map(json.loads, fh)}


def _measured() -> dict[str, dict]:
    with gzip.open(DATA / "realistic.jsonl.gz", "rt") as fh:
        out = {r["label"]: r["measured"] for r in map(json.loads, fh) if "peak_reserved_bytes" in r.get("measured", {})}
    for run in json.loads((DATA / "fit-largest-batch.json").read_text()):
        if isinstance(run["batch"], int):
            out[largest_label(run["batch"])] = run["measured"]
    return out


EVENTS = _events()
MEASURED = _measured()
FITTING = [k for k, m in MEASURED.items() if "peak_reserved_bytes" in m]


def replayed(label: str, capacity: int | None = None, conf: str | None = None) -> dict:
    return figures(events_from_run(decode(EVENTS[label]), CUBLAS_WORKSPACE_BYTES_PER_HANDLE), capacity, conf)


def test_every_row_has_its_event_list():
    assert set(FITTING) <= set(EVENTS)
    assert len(FITTING) == 15   # 14 realistic rows and the b20 run


# The rows the replay misses (docs/gpu.md, "Reserved memory: the caching allocator replayed"): both are the book's
# GPT-2 with full checkpointing, whose reserve turns on single-segment decisions (256 MiB attention scores,
# 786 MiB logits) that one allocation's place flips; held as expected failures (strict: a fix must say so).
KNOWN_MISSES = {
    "gpt2-medium eager b4 s1024 fp32 ckpt adamw": "+2.5%: one 256 MiB segment more than the H200 made; the backward "
    "thread's cuBLAS workspace one allocation earlier gives +0.02%",
    "gpt2-xl eager b4 s1024 bf16 ckpt adamw": "-4.3%: the H200 held 0.74 GiB more cached segments than the replay; "
    "not explained without a GPU trace",
}


@pytest.mark.parametrize("label", [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[k]))
                                   if k in KNOWN_MISSES else k for k in FITTING])
def test_reserved_within_2pct(label):
    m = MEASURED[label]
    fig = replayed(label)
    reserved = fig["reserved_peak_bytes"]
    allocated = reserved - fig["fragmentation_bytes"]
    err = (reserved - m["peak_reserved_bytes"]) / m["peak_reserved_bytes"]
    assert abs(err) <= RESERVED_BAR, f"reserved {reserved:,} vs {m['peak_reserved_bytes']:,} ({100 * err:+.2f}%)"
    aerr = (allocated - m["peak_allocated_bytes"]) / m["peak_allocated_bytes"]
    assert abs(aerr) <= ALLOCATED_BAR, f"allocated {allocated:,} vs {m['peak_allocated_bytes']:,} ({100 * aerr:+.2f}%)"


def test_largest_batch_boundary():
    """b20 fits the H200 and b21 runs out of memory, with and without expandable segments; b21's failing request is
    the one torch named ("Tried to allocate 20.55 GiB")."""
    fits = replayed(largest_label(20), H200_CAPACITY)
    assert fits["allocator_replay"]["oom"] is None and fits["reserved_peak_bytes"] <= H200_CAPACITY
    for conf in (None, "expandable_segments:True"):
        oom = replayed(largest_label(21), H200_CAPACITY, conf)["allocator_replay"]["oom"]
        assert oom is not None, conf
        assert round(oom["alloc_size_bytes"] / GiB, 2) == 20.55, (conf, oom)
    assert replayed(largest_label(20), H200_CAPACITY, "expandable_segments:True")["allocator_replay"]["oom"] is None


def test_replay_is_fast():
    """The largest event list (build + two steps) replays in well under a second (a benchmark's figure, not a bar:
    this only guards against a quadratic slip)."""
    import time

    label = max(EVENTS, key=lambda k: len(EVENTS[k]["run"]))
    ev = events_from_run(decode(EVENTS[label]), CUBLAS_WORKSPACE_BYTES_PER_HANDLE)
    t0 = time.perf_counter()
    replay(ev)
    assert time.perf_counter() - t0 < 5.0


def table() -> list[str]:
    import time

    lines = ["| row | replayed reserved | measured reserved | error | replayed allocated | measured allocated | error |"
             " reserved - allocated: replay / measured | events | replay time |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label in FITTING:
        m = MEASURED[label]
        ev = events_from_run(decode(EVENTS[label]), CUBLAS_WORKSPACE_BYTES_PER_HANDLE)
        t0 = time.perf_counter()
        fig = figures(ev)
        dt = time.perf_counter() - t0
        r, f = fig["reserved_peak_bytes"], fig["fragmentation_bytes"]
        a = r - f
        mr, ma = m["peak_reserved_bytes"], m["peak_allocated_bytes"]
        lines.append(f"| {label} | {r:,} | {mr:,} | {100 * (r - mr) / mr:+.3f}% | {a:,} | {ma:,} | "
                     f"{100 * (a - ma) / ma:+.3f}% | {f / GiB:.2f} / {(mr - ma) / GiB:.2f} GiB | {len(ev):,} | "
                     f"{1000 * dt:.0f} ms |")
    return lines


def boundary_table() -> list[str]:
    lines = ["| run | replayed on the H200's capacity | measured |", "|---|---|---|"]
    # fit-largest-batch.json's messages: reserved = allocated + "reserved by PyTorch but unallocated"
    measured = {20: "ran", 21: "out of memory: tried to allocate 20.55 GiB, 118.38 GiB allocated, 134.67 GiB reserved"}
    measured_es = "out of memory: tried to allocate 20.55 GiB, 118.37 GiB allocated, 118.60 GiB reserved"
    for batch in (20, 21):
        for conf in (None, "expandable_segments:True"):
            rep = replayed(largest_label(batch), H200_CAPACITY, conf)["allocator_replay"]
            oom = rep["oom"]
            what = ("runs" if oom is None else
                    f"out of memory: tried to allocate {oom['alloc_size_bytes'] / GiB:.2f} GiB with "
                    f"{oom['allocated_bytes'] / GiB:.2f} GiB allocated, {oom['reserved_bytes'] / GiB:.2f} GiB reserved")
            meas = measured_es if conf and batch == 21 else measured[batch] if not conf else "not run"
            lines.append(f"| llama-3.2-1b b{batch} s2048 bf16{' ' + conf if conf else ''} | {what} | {meas} |")
    return lines


if __name__ == "__main__":
    print("\n".join(table()))
    print()
    print("\n".join(boundary_table()))
