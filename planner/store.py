"""Run history in SQLite (no torch): every measurement the app makes is kept, one committed row per run,
completed or not (its status says which).

WAL journaling and a commit per insert mean a crash or a kill loses at most the run being written.
Databases written before the status column existed are migrated when opened (their runs had completed).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sqlite3
import time
from pathlib import Path

from .compare import error_pct

SCHEMA = """CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    kind TEXT NOT NULL,            -- train | load
    model TEXT NOT NULL,
    settings TEXT NOT NULL,        -- JSON
    device TEXT NOT NULL,
    estimate_bytes INTEGER,
    measured_bytes INTEGER,
    error_pct REAL,
    record TEXT NOT NULL,          -- the full JSON record the CLI printed
    status TEXT NOT NULL DEFAULT 'done'  -- done | failed | timeout | cancelled
)"""
STATUSES = ("done", "failed", "timeout", "cancelled")


def data_dir() -> Path:
    """User data folder (PLANNER_DATA overrides): survives restarts of the app."""
    return Path(os.environ.get("PLANNER_DATA", Path.home() / ".local" / "share" / "torch-memory-planner"))


def whatif_fit_path(module_file: Path, function: str, run: dict) -> Path:
    """Where the app keeps a module's what-if fit (planner.whatif): keyed by the file's contents, the function
    and the run settings other than batch and sequence (what the fit answers for)."""
    key = hashlib.sha256(Path(module_file).read_bytes() + json.dumps([function, run], sort_keys=True).encode())
    return data_dir() / "whatif" / f"{key.hexdigest()[:16]}.json"


def export_files(kind: str) -> dict:
    """Where a run started from the app writes its memory_viz snapshot and chrome trace (kept with the run):
    {"memory_snapshot": ..., "trace": ...} in the data folder's exports/, named by the time and the kind."""
    folder = data_dir() / "exports"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}-{kind}"
    return {"memory_snapshot": str(folder / f"{stem}.pickle"), "trace": str(folder / f"{stem}.json")}


def run_files(run: dict) -> list[tuple[str, Path]]:
    """A kept run's exported files that still exist: [(what, path)] with what "memory_snapshot" / "trace"."""
    rec = run.get("record") if isinstance(run.get("record"), dict) else {}
    return [(k, Path(rec[k])) for k in ("memory_snapshot", "trace")
            if isinstance(rec.get(k), str) and Path(rec[k]).is_file()]


class RunStore:
    def __init__(self, path: Path | None = None):
        self.path = Path(path or data_dir() / "runs.sqlite")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(SCHEMA)
            if "status" not in {row[1] for row in db.execute("PRAGMA table_info(runs)")}:
                db.execute("ALTER TABLE runs ADD COLUMN status TEXT NOT NULL DEFAULT 'done'")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    def save(self, kind: str, model: str, settings: dict, device: str, estimate_bytes: int | None,
             measured_bytes: int | None, record: dict, status: str = "done") -> int:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        error = error_pct(estimate_bytes, measured_bytes)
        with self._connect() as db:  # the context manager commits
            cur = db.execute("INSERT INTO runs (created, kind, model, settings, device, estimate_bytes, measured_bytes,"
                             " error_pct, record, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (time.time(), kind, model, json.dumps(settings), device, estimate_bytes, measured_bytes,
                              error, json.dumps(record), status))
            return cur.lastrowid

    def save_load_job(self, model: str, device: str, dtype: str, state: str, results: list[dict],
                      stderr: str = "") -> None:
        """A Measure-all job: one row per method it reports (done, or failed with its error); a job that
        ended without results (cancelled, timed out, failed before the first method) is one row."""
        for r in results:
            done = "peak_device_bytes" in r
            self.save("load", model, {"method": r.get("method"), "dtype": r.get("dtype", dtype)}, device,
                      r.get("estimate", {}).get("peak_device_bytes"), r.get("peak_device_bytes"), r,
                      "done" if done else "failed")
        if not results:
            self.save("load", model, {"method": "all", "dtype": dtype}, device, None, None,
                      {"stderr_tail": stderr[-1500:]}, state if state != "done" else "failed")

    def list(self, kind: str | None = None) -> list[dict]:
        query, args = "SELECT * FROM runs", ()
        if kind:
            query, args = query + " WHERE kind = ?", (kind,)
        with self._connect() as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(query + " ORDER BY id DESC", args).fetchall()
        return [{**dict(r), "settings": json.loads(r["settings"]), "record": json.loads(r["record"])} for r in rows]

    def delete(self, ids: list[int]) -> None:
        """Forget these runs, and remove the files they exported into the data folder."""
        exports = (data_dir() / "exports").resolve()
        for run in self.list():
            if run["id"] in ids:
                for _, path in run_files(run):
                    if path.resolve().parent == exports:
                        path.unlink(missing_ok=True)
        with self._connect() as db:
            db.executemany("DELETE FROM runs WHERE id = ?", [(i,) for i in ids])


def runs_table(runs: list[dict]) -> list[dict]:
    """Rows for display and CSV export: the estimate and the measurement first, bytes as integers (each
    with a readable column beside it), the error as a number, then what was run."""
    from .units import fmt_bytes

    def readable(n):
        return fmt_bytes(n) if n is not None else ""

    return [{"estimate_bytes": r["estimate_bytes"], "estimate": readable(r["estimate_bytes"]),
             "measured_bytes": r["measured_bytes"], "measured": readable(r["measured_bytes"]),
             "error_pct": round(r["error_pct"], 3) if r["error_pct"] is not None else None,
             "status": r["status"], "kind": r["kind"], "source": source(r), "model": r["model"], "device": r["device"],
             "settings": ", ".join(f"{k}={v}" for k, v in r["settings"].items()),
             "when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created"])), "id": r["id"]}
            for r in runs]


def source(run: dict) -> str:
    """How the figure was obtained: "measure" (a real step or load) or "simulate" (the step on fake tensors),
    as the record the CLI printed says (records from before simulation have no kind: measured)."""
    return run["record"].get("kind", "measure") if isinstance(run.get("record"), dict) else "measure"


def runs_csv(runs: list[dict]) -> str:
    """The CSV export: runs_table's rows, integers as integers, an empty cell where nothing was measured."""
    rows = runs_table(runs)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["estimate_bytes"])
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
