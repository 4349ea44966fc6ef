"""The command line: `python -m planner ...` (planner/__main__.py calls planner/cli/main.py's `main`).

planner/cli/main.py the parser and the commands, planner/cli/args.py the MODEL and RUN options, parsing and exit
codes; one file per command family beside them (simulate, infer, module, fitted, parallel, paths).
"""
