"""The benchmarks: every grid behind docs/accuracy.md, docs/loading.md and docs/speed.md, one file per grid.

`python -m planner bench WHAT` (planner/cli/main.py) calls them; planner/bench/main.py holds the training grids
and the dispatcher, planner/bench/common.py what they all share, planner/bench/recorded.py the measured rows
kept in tests/data/measured/. Nothing here is imported by the estimate side or the app's pages at import time.
"""
