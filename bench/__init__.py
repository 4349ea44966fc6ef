"""The benchmarks: every grid behind docs/accuracy.md, docs/loading.md and docs/speed.md, one file per grid.

`python -m planner bench WHAT` (planner/cli/main.py) calls them; bench/main.py holds the training grids
and the dispatcher, bench/common.py what they all share, bench/recorded.py the measured rows
kept in tests/data/measured/. They sit beside planner/, not in it: test and benchmark scaffolding the product
never imports (planner/cli/main.py loads this package lazily, for `bench` alone).
"""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: bench/ and planner/ side by side


def child_env(env: dict | None = None) -> dict:
    """The environment for a child `python` that imports bench and planner: the repository first on PYTHONPATH,
    so the child finds both whatever its working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env
