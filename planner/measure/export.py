"""A tracked step's event log (planner.measure.events) as the files PyTorch users open, and what is alive at the peak.

- `snapshot(log)`: a dict in the format of `torch.cuda.memory._snapshot()` (pickled, it opens at
  pytorch.org/memory_viz and in torch.cuda._memory_viz's trace_plot / segment_plot): one segment on device 0
  whose `active_allocated` blocks are what is alive at the end of the step, and `device_traces[0]` with an
  `alloc` event per storage born in the step and `free_requested` + `free_completed` per storage that died
  (the viewer elides the pair into one "free"). A storage alive before the step and freed in it has a free
  without an alloc: the viewer counts it as allocated from the start (torch/utils/viz/MemoryViz.js,
  process_alloc_data). Each event carries `category` (the viewer colours by it) and `frames`, innermost
  first: the aten op, the module path and its parents, then the phase, e.g.
  `aten::mm` / `model.layers.3.mlp.down_proj` / `model.layers.3.mlp` / ... / `phase forward`.
  Addresses come from a first-fit allocator over one address space (512-byte aligned, as the CUDA caching
  allocator aligns blocks: c10/cuda/CUDACachingAllocator.cpp kMinBlockSize); sizes are the storages' exact
  bytes, so the viewer's active-memory maximum is the tracker's peak.
- `chrome_trace(log)`: the Trace Event Format (chrome://tracing, ui.perfetto.dev): phases and ops as complete
  ("X") spans, the live bytes as a counter ("C") track named "live bytes". Time is the op index in
  microseconds (one op = 1 us; a simulated step has no real time).
- `alive_at_peak(log)`: the storages alive at the peak, grouped by category and by module (sums = the peak)
  and the largest ones with shape, dtype and the op that made them.

On CUDA, `measure`'s peak_bytes is the allocator's max_memory_allocated (rounded blocks, workspaces); these
files, built from live tensor bytes, peak at the record's tracked_peak_bytes instead (equal to peak_bytes on the
CPU and in every simulation). The allocator's own `_record_memory_history` snapshot is not offered yet.

Bounds for big runs (Llama-3-8B b1 s4096 simulated: ~30k ops): frames are interned (one list per distinct
(op, module, phase), which pickle stores once); the snapshot keeps at most `max_events` trace events: past
that, the smallest allocations that are not alive at the peak are left out (their alloc and free), so the
peak and everything alive at it stay exact and the curve elsewhere is understated by at most
`omitted_max_live_bytes` (reported in the snapshot's `planner` entry). The chrome trace has one op span per
op and at most two counter samples per op (after its outputs, after the frees that follow), and past
`max_ops` spans consecutive ops of one module and phase are merged into one span.
"""
from __future__ import annotations

import json
import pickle
from bisect import bisect_left, insort
from pathlib import Path

from .events import CATEGORIES, EventLog, op_label

ALIGN = 512  # the CUDA caching allocator's block granularity (kMinBlockSize)
BASE_ADDR = 0x7F0000000000  # where the address space starts (a CUDA-like address; any value works)
MAX_EVENTS = 200_000
MAX_OPS = 100_000


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _FirstFit:
    """Addresses for storages: first fit in a sorted free list, coalescing on free; grows at the top."""

    def __init__(self):
        self.free: list[tuple[int, int]] = []  # (start, size), sorted by start
        self.top = 0

    def alloc(self, size: int) -> int:
        size = _round(max(size, 1))
        for i, (start, sz) in enumerate(self.free):
            if sz >= size:
                if sz == size:
                    self.free.pop(i)
                else:
                    self.free[i] = (start + size, sz - size)
                return start
        start = self.top
        self.top += size
        return start

    def release(self, start: int, size: int) -> None:
        size = _round(max(size, 1))
        i = bisect_left(self.free, (start, 0))
        if i < len(self.free) and start + size == self.free[i][0]:
            size += self.free.pop(i)[1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == start:
            start, size = self.free[i - 1][0], self.free[i - 1][1] + size
            self.free.pop(i - 1)
            i -= 1
        if start + size == self.top:
            self.top = start
        else:
            insort(self.free, (start, size))


def replay(log: EventLog) -> tuple[list[int], int, int]:
    """(live bytes after each event, peak bytes, index of the first event at the peak; -1: the initial state)."""
    cur = sum(v[0] for v in log.initial.values())
    size = {uid: v[0] for uid, v in log.initial.items()}
    peak, at = cur, -1
    curve = []
    for i, e in enumerate(log.events):
        if e[0] == "a":
            size[e[1]] = e[2]
            cur += e[2]
        elif e[0] == "f":
            cur -= size[e[1]]
        curve.append(cur)
        if cur > peak:
            peak, at = cur, i
    return curve, peak, at


def _alive_at(log: EventLog, index: int) -> dict[int, dict]:
    """uid -> its description, for the storages alive just after event `index` (-1: before any)."""
    alive = {uid: {"bytes": v[0], "category": v[1], "module": v[2], "op": "(before the step)", "phase": "setup",
                   "shape": log.looks.get(uid, (None, None))[0], "dtype": log.looks.get(uid, (None, None))[1]}
             for uid, v in log.initial.items()}
    for e in log.events[:index + 1]:
        if e[0] == "a":
            alive[e[1]] = {"bytes": e[2], "category": log.category_of(e[1]), "module": e[5], "op": op_label(e[4]),
                           "phase": e[6], "shape": list(e[7]), "dtype": e[8]}
        elif e[0] == "f":
            alive.pop(e[1], None)
    for uid, d in alive.items():
        if d["op"] == "(before the step)":
            d["module"] = log.owner.get(uid, d["module"])
    return alive


def alive_at_peak(log: EventLog, top: int = 20, modules: int = 25) -> dict:
    """The storages alive at the peak: by category, by module (the largest `modules`, the rest as "other"),
    and the `top` largest (bytes, category, module, op, phase, shape, dtype). Both groupings sum to the peak."""
    _, peak, at = replay(log)
    alive = _alive_at(log, at)
    by_cat = {c: 0 for c in CATEGORIES}
    by_mod: dict[str, int] = {}
    for d in alive.values():
        by_cat[d["category"]] = by_cat.get(d["category"], 0) + d["bytes"]
        mod = d["module"]
        by_mod[mod] = by_mod.get(mod, 0) + d["bytes"]
    ranked = sorted(by_mod.items(), key=lambda kv: -kv[1])
    mods = [{"module": m, "bytes": b} for m, b in ranked[:modules]]
    rest = ranked[modules:]
    if rest:
        mods.append({"module": f"other ({len(rest)} modules)", "bytes": sum(b for _, b in rest)})
    largest = sorted(alive.values(), key=lambda d: -d["bytes"])[:top]
    phase = "setup"
    for e in log.events[:at + 1]:
        if e[0] == "p":
            phase = e[1]
    return {"peak_bytes": peak, "op": log.events[at][3] if at >= 0 else 0, "phase": phase, "tensors": len(alive),
            "by_category": [{"category": c, "bytes": b} for c, b in by_cat.items() if b],
            "by_module": mods, "largest": largest}


MEMTRACKER_NAMES = {"input": "inputs"}  # torch.distributed._tools.MemTracker's names (planner's "input" = its inputs)


def phase_categories(log: EventLog) -> dict[str, dict[str, int]]:
    """Per phase, the live bytes by category at that phase's highest point in the event replay (the same
    replay as alive_at_peak; each phase's categories sum to its `total`): the record's `categories` block,
    named as MemTracker names its categories (parameter, buffer, gradient, activation, temporary,
    optimizer state, inputs). The phase of an event is the last phase mark before it."""
    size = {uid: v[0] for uid, v in log.initial.items()}
    cat = {uid: v[1] for uid, v in log.initial.items()}
    by = {c: 0 for c in CATEGORIES}
    for uid, n in size.items():
        by[cat[uid]] += n
    phase, best = "setup", {}
    for e in log.events:
        if e[0] == "p":
            phase = e[1]
        elif e[0] == "a":
            size[e[1]], cat[e[1]] = e[2], log.category_of(e[1])
            by[cat[e[1]]] += e[2]
        elif e[0] == "f":
            by[cat[e[1]]] -= size[e[1]]
        total = sum(by.values())
        if phase != "setup" and (phase not in best or total > best[phase]["total"]):
            best[phase] = {**{MEMTRACKER_NAMES.get(c, c): b for c, b in by.items()}, "total": total}
    return best


def category_timeline(log: EventLog, points: int = 300) -> dict:
    """Live bytes by category over the step, at most ~`points` samples (each bucket of events keeps its sample
    with the largest total, so the peak is drawn), and where each phase starts (x: the op index)."""
    size = {uid: v[0] for uid, v in log.initial.items()}
    cat = {uid: v[1] for uid, v in log.initial.items()}
    by = {c: 0 for c in CATEGORIES}
    for uid, n in size.items():
        by[cat[uid]] += n
    samples = [(0, dict(by))]
    phases = []
    for e in log.events:
        if e[0] == "a":
            size[e[1]], cat[e[1]] = e[2], log.category_of(e[1])
            by[cat[e[1]]] += e[2]
            samples.append((e[3], dict(by)))
        elif e[0] == "f":
            by[cat[e[1]]] -= size[e[1]]
            samples.append((e[2], dict(by)))
        else:
            phases.append({"op": e[2], "phase": e[1]})
    per_op: dict[int, dict] = {}  # one sample per op (its largest), so a stacked chart never adds two
    for x, b in samples:
        if x not in per_op or sum(b.values()) >= sum(per_op[x].values()):
            per_op[x] = b
    samples = sorted(per_op.items())
    step = max(1, -(-len(samples) // points))
    out = []
    for i in range(0, len(samples), step):
        x, b = max(samples[i:i + step], key=lambda s: sum(s[1].values()))
        out.append({"op": x, **{c: v for c, v in b.items()}})
    return {"categories": [c for c in CATEGORIES if any(p[c] for p in out)], "points": out, "phases": phases}


class _Frames:
    """Interned frame lists (innermost first), so pickle stores each distinct stack once."""

    def __init__(self):
        self.cache: dict[tuple, list] = {}
        self.ops: dict = {}

    def get(self, func, module: str, phase: str) -> list:
        key = (func, module, phase)
        frames = self.cache.get(key)
        if frames is None:
            name = self.ops.get(func)
            if name is None:
                name = self.ops[func] = op_label(func) if func is not None else "(none)"
            frames = [{"filename": "aten", "line": 0, "name": name}]
            path = module.split(" (")[0]
            node = module[len(path):].strip(" ()")
            if node:
                frames.append({"filename": "autograd", "line": 0, "name": node})
            parts = path.split(".")
            for i in range(len(parts), 0, -1):
                frames.append({"filename": "module", "line": 0, "name": ".".join(parts[:i])})
            frames.append({"filename": "phase", "line": 0, "name": phase})
            self.cache[key] = frames
        return frames


def snapshot(log: EventLog, max_events: int = MAX_EVENTS) -> dict:
    """The torch.cuda.memory._snapshot() dict of the step (module docstring)."""
    curve, peak, at = replay(log)
    omitted: set[int] = set()
    pairs = [(e[2], e[1]) for e in log.events if e[0] == "a"]
    n_events = sum(1 for e in log.events if e[0] == "a") + 2 * sum(1 for e in log.events if e[0] == "f")
    if n_events > max_events:
        alive = set(_alive_at(log, at))
        freed = {e[1] for e in log.events if e[0] == "f"}
        candidates = sorted((size, uid) for size, uid in pairs if uid not in alive and uid in freed)
        for size, uid in candidates:
            if n_events <= max_events:
                break
            omitted.add(uid)
            n_events -= 3
    frames = _Frames()
    space = _FirstFit()
    addr: dict[int, int] = {}
    size: dict[int, int] = {}
    info: dict[int, tuple] = {}
    for uid, (nbytes, cat, owner) in log.initial.items():
        addr[uid], size[uid] = space.alloc(nbytes), nbytes
        info[uid] = (cat, frames.get(None, log.owner.get(uid, owner), "before the step"))
    trace = []
    omitted_live = 0
    omitted_max = 0
    for e in log.events:
        if e[0] == "a":
            uid, nbytes = e[1], e[2]
            if uid in omitted:
                omitted_live += nbytes
                omitted_max = max(omitted_max, omitted_live)
                size[uid] = nbytes
                continue
            a = space.alloc(nbytes)
            addr[uid], size[uid] = a, nbytes
            cat = log.category_of(uid)
            fr = frames.get(e[4], e[5], e[6])
            info[uid] = (cat, fr)
            trace.append({"action": "alloc", "addr": BASE_ADDR + a, "size": nbytes, "stream": 0, "frames": fr,
                          "category": cat})
        elif e[0] == "f":
            uid = e[1]
            if uid in omitted:
                omitted_live -= size[uid]
                continue
            a = addr.pop(uid)
            nbytes = size[uid]
            space.release(a, nbytes)
            cat, fr = info.pop(uid)
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": BASE_ADDR + a, "size": nbytes, "stream": 0, "frames": fr,
                              "category": cat})
    # The live storages at the end as the segment's blocks (addresses in order, gaps inactive).
    total = max(space.top, ALIGN)
    blocks = []
    last = 0
    for uid, a in sorted(addr.items(), key=lambda kv: kv[1]):
        if a > last:
            blocks.append({"size": a - last, "requested_size": 0, "state": "inactive", "frames": []})
        cat, fr = info[uid]
        blocks.append({"size": _round(max(size[uid], 1)), "requested_size": size[uid], "state": "active_allocated",
                       "frames": fr, "category": cat})
        last = a + _round(max(size[uid], 1))
    if last < total:
        blocks.append({"size": total - last, "requested_size": 0, "state": "inactive", "frames": []})
    allocated = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    segment = {"device": 0, "address": BASE_ADDR, "total_size": total, "allocated_size": allocated,
               "active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
    # MemoryViz.js (annotate_snapshot) appends "unknown" to its categories with a typo in some versions
    # (`snapshot.categores`), which throws unless "unknown" is already one: a last no-op event names it.
    trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": [], "category": "unknown"})
    return {"segments": [segment], "device_traces": [trace],
            "allocator_settings": {}, "planner": {
                "peak_bytes": peak, "peak_event": at, "events": len(trace) - 1,
                "omitted_allocations": len(omitted), "omitted_max_live_bytes": omitted_max,
                "note": "made by the Torch Memory Planner from live tensor bytes (not the CUDA caching allocator): "
                        "block sizes are the storages' exact bytes"}}


def viewer_peak(snap: dict, device: int = 0) -> int:
    """The maximum of the viewer's active memory timeline: MemoryViz.js process_alloc_data (plot_segments
    false) replayed: blocks alive at the end that no trace event allocated, and frees without an alloc,
    count from the start; each alloc adds its size and each free removes it."""
    trace = snap["device_traces"][device]
    addr_to_alloc: dict[int, int] = {}
    initially = 0
    for e in trace:
        if e["action"] == "alloc":
            addr_to_alloc[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            if e["addr"] in addr_to_alloc:
                del addr_to_alloc[e["addr"]]
            else:
                initially += e["size"]
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and addr not in addr_to_alloc:
                initially += b["requested_size"]
            addr += b["size"]
    cur = peak = initially
    live: dict[int, int] = {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
        elif e["action"] == "free_completed":
            cur -= live.pop(e["addr"], e["size"])
        peak = max(peak, cur)
    return peak


def chrome_trace(log: EventLog, max_ops: int = MAX_OPS) -> dict:
    """The Trace Event Format dict (module docstring)."""
    size = {uid: v[0] for uid, v in log.initial.items()}
    cur = sum(size.values())
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "training step (planner)"}},
                          {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "phases"}},
                          {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "ops"}},
                          {"name": "live bytes", "ph": "C", "pid": 1, "ts": 0, "args": {"bytes": cur}}]
    # one op span per op index: the op's name, module and phase come from its first alloc (ops that allocate
    # nothing are spans too, named by the next event's op when known)
    op_info: dict[int, tuple] = {}
    phase_marks: list[tuple[int, str]] = [(0, log.events[0][1] if log.events and log.events[0][0] == "p" else "setup")]
    last_counter = None
    for e in log.events:
        if e[0] == "a":
            size[e[1]] = e[2]
            cur += e[2]
            op_info.setdefault(e[3], (e[4], e[5], e[6], 0))
            f, m, p, b = op_info[e[3]]
            op_info[e[3]] = (f, m, p, b + e[2])
            ts = e[3] + 0.5  # after the op's outputs
        elif e[0] == "f":
            cur -= size.pop(e[1])
            ts = e[2] + 0.0  # after the frees that follow op e[2] - 1
        else:
            phase_marks.append((e[2], e[1]))
            continue
        if last_counter is not None and last_counter["ts"] == ts:
            last_counter["args"]["bytes"] = cur if e[0] == "f" else max(cur, last_counter["args"]["bytes"])
        else:
            last_counter = {"name": "live bytes", "ph": "C", "pid": 1, "ts": ts, "args": {"bytes": cur}}
            events.append(last_counter)
    end = log.op_index
    marks = phase_marks
    for i, (start, phase) in enumerate(marks):
        stop = marks[i + 1][0] if i + 1 < len(marks) else end
        if stop > start and phase != "done":
            events.append({"name": phase, "cat": "phase", "ph": "X", "pid": 1, "tid": 1, "ts": start,
                           "dur": stop - start})
    ops = sorted(op_info.items())
    spans = []
    if len(ops) > max_ops:  # merge consecutive ops of one module and phase
        for idx, (f, m, p, b) in ops:
            if spans and spans[-1]["args"]["module"] == m and spans[-1]["args"]["phase"] == p:
                s = spans[-1]
                s["dur"] = idx + 1 - s["ts"]
                s["args"]["bytes"] += b
                s["args"]["ops"] += 1
                s["name"] = f"{s['args']['module']} ({s['args']['ops']} ops)"
            else:
                spans.append({"name": op_label(f), "cat": "op", "ph": "X", "pid": 1, "tid": 2, "ts": idx, "dur": 1,
                              "args": {"module": m, "phase": p, "bytes": b, "ops": 1}})
    else:
        labels: dict = {}
        for idx, (f, m, p, b) in ops:
            name = labels.get(f) or labels.setdefault(f, op_label(f))
            spans.append({"name": name, "cat": "op", "ph": "X", "pid": 1, "tid": 2, "ts": idx, "dur": 1,
                          "args": {"module": m, "phase": p, "bytes": b}})
    events.extend(spans)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"source": "Torch Memory Planner", "time": "op index (1 op = 1 us)"}}


def write_exports(log: EventLog, snapshot_path: str | None = None, trace_path: str | None = None) -> dict:
    """Write the requested files; the record's keys naming them (absolute paths) and their sizes."""
    out: dict = {}
    if snapshot_path:
        p = Path(snapshot_path)
        with p.open("wb") as f:
            pickle.dump(snapshot(log), f, protocol=pickle.HIGHEST_PROTOCOL)
        out["memory_snapshot"] = str(p.resolve())
        out["memory_snapshot_bytes"] = p.stat().st_size
    if trace_path:
        p = Path(trace_path)
        p.write_text(json.dumps(chrome_trace(log), separators=(",", ":")))
        out["trace"] = str(p.resolve())
        out["trace_bytes"] = p.stat().st_size
    return out
