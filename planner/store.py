"""Run history in SQLite (no torch): every measurement the app makes is kept, one committed row per run.

WAL journaling and a commit per insert mean a crash or a kill loses at most the run being written.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

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
    record TEXT NOT NULL           -- the full JSON record the CLI printed
)"""


def data_dir() -> Path:
    """User data folder (PLANNER_DATA overrides): survives restarts of the app."""
    return Path(os.environ.get("PLANNER_DATA", Path.home() / ".local" / "share" / "torch-memory-planner"))


class RunStore:
    def __init__(self, path: Path | None = None):
        self.path = Path(path or data_dir() / "runs.sqlite")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    def save(self, kind: str, model: str, settings: dict, device: str, estimate_bytes: int | None,
             measured_bytes: int | None, record: dict) -> int:
        error = (100.0 * (estimate_bytes - measured_bytes) / measured_bytes
                 if estimate_bytes is not None and measured_bytes else None)
        with self._connect() as db:  # the context manager commits
            cur = db.execute("INSERT INTO runs (created, kind, model, settings, device, estimate_bytes, measured_bytes,"
                             " error_pct, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (time.time(), kind, model, json.dumps(settings), device, estimate_bytes, measured_bytes,
                              error, json.dumps(record)))
            return cur.lastrowid

    def list(self, kind: str | None = None) -> list[dict]:
        query, args = "SELECT * FROM runs", ()
        if kind:
            query, args = query + " WHERE kind = ?", (kind,)
        with self._connect() as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(query + " ORDER BY id DESC", args).fetchall()
        return [{**dict(r), "settings": json.loads(r["settings"]), "record": json.loads(r["record"])} for r in rows]

    def delete(self, ids: list[int]) -> None:
        with self._connect() as db:
            db.executemany("DELETE FROM runs WHERE id = ?", [(i,) for i in ids])
