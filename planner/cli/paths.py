"""The export flags' paths (--memory-snapshot, --trace), shared by simulate and measure of a preset, a config or a
module (their own file so that planner/cli/simulate.py and planner/cli/module.py need not import each other; no torch)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..config import ConfigError


def export_paths(args: argparse.Namespace) -> dict | None:
    """{"memory_snapshot": absolute path, "trace": absolute path} for the payload, or None; ConfigError (exit 2)
    for a folder that does not exist or with --world-size (not exported yet)."""
    out = {}
    for key, flag in (("memory_snapshot", "--memory-snapshot"), ("trace", "--trace")):
        value = getattr(args, key, None)
        if not value:
            continue
        path = Path(value).expanduser().resolve()
        if not path.parent.is_dir():
            raise ConfigError(f"{flag}: the folder {path.parent} does not exist")
        out[key] = str(path)
    if out and getattr(args, "world_size", 1) and getattr(args, "world_size", 1) > 1:
        raise ConfigError("--memory-snapshot and --trace are not available with --world-size yet")
    return out or None