"""Where the planner keeps what it writes (torch-free, shared by the CLI and the child routines)."""
from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """Generated checkpoints; override with PLANNER_CACHE. Safe to delete at any time."""
    return Path(os.environ.get("PLANNER_CACHE", Path.home() / ".cache" / "torch-memory-planner"))
