"""A user's own module as the command line and the app name it (no torch: nothing here imports the user's file).

    --module FILE.py:FUNCTION [--input-shape 3x224x224]

The module travels to the children as a tuple (path, function) or (path, function, input shape), the form
planner.routines.user_module.ModuleTrainingStep takes. Whether the model has a sequence axis decides the
what-if points and the sliders: not with --input-shape, not when the file's make_batch takes one argument
(read from the file's syntax tree, never by running it), otherwise yes (the fit may still find that the step
does not depend on s: planner.whatif WhatIf.has_seq).

The what-if fit of a module (planner.whatif) is kept in the data folder (planner.store.whatif_fit_path), keyed
by the file's contents, the function, the settings other than batch and sequence, and FIT_VERSION; `module_fit`
loads it or makes it (every point simulated in one child) and saves it.
"""
from __future__ import annotations

import ast
import json
import time
from pathlib import Path
from typing import Callable

from .validation import ConfigError

# Bumped when the simulator or the fit changes what a fit holds: fits made before are not reused.
# 2: the basis chosen from the data with held-out validation (issue #20), the CPU normalisation stats dtypes.
FIT_VERSION = 2


def parse_input_shape(text: str | None) -> tuple[int, ...] | None:
    """`3x224x224` -> (3, 224, 224) (the shape of one sample, without the batch); None for None/empty."""
    if text is None or not str(text).strip():
        return None
    try:
        shape = tuple(int(n) for n in str(text).lower().replace(",", "x").split("x"))
    except ValueError:
        raise ConfigError(f"--input-shape must be sizes joined by x, like 3x224x224; got {text!r}") from None
    if not shape or any(n < 1 for n in shape):
        raise ConfigError(f"--input-shape sizes must be positive; got {text!r}")
    return shape


def make_batch_arity(path: Path) -> int | None:
    """The number of required positional parameters of the file's top-level make_batch (None: no make_batch,
    or a file this cannot read; the child then decides)."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "make_batch":
            a = node.args
            if a.vararg is not None:
                return 2
            positional = a.posonlyargs + a.args
            return len(positional) - len(a.defaults)
    return None


def has_sequence(path: Path, input_shape) -> bool:
    """False for --input-shape or a one-argument make_batch (an image or tabular model), else True."""
    return not input_shape and make_batch_arity(path) != 1


def module_tuple(path: Path, func: str, input_shape=None) -> tuple:
    """What the children take: (path, function) or (path, function, [input shape])."""
    return (str(path), func) + ((list(input_shape),) if input_shape else ())


def module_label(module: tuple) -> str:
    text = f"{module[0]}:{module[1]}"
    return text + (" --input-shape " + "x".join(map(str, module[2])) if len(module) > 2 else "")


def fit_points(sequence: bool) -> tuple[tuple, tuple]:
    """(points, held-out points) of a what-if fit (planner/spec.py)."""
    from .spec import WHATIF_HOLDOUT, WHATIF_HOLDOUT_NO_SEQ, WHATIF_POINTS, WHATIF_POINTS_NO_SEQ

    return (WHATIF_POINTS, WHATIF_HOLDOUT) if sequence else (WHATIF_POINTS_NO_SEQ, WHATIF_HOLDOUT_NO_SEQ)


def run_key(spec, input_shape=None) -> dict:
    """The settings a module's fit answers for (all but batch and sequence), as the page and the CLI key it."""
    run = {"precision": spec.precision, "optimizer": spec.optimizer, "optimizer_impl": spec.optimizer_impl,
           "grad_accum": spec.grad_accum, "device": spec.device}
    if input_shape:
        run["input_shape"] = list(input_shape)
    return run


def fit_path(path: Path, func: str, run: dict) -> Path:
    """Where the fit of this module and these settings is kept (the data folder's whatif/)."""
    from .store import whatif_fit_path

    return whatif_fit_path(path, func, {**run, "fit_version": FIT_VERSION})


def module_fit(module: tuple, spec, on_point: Callable[[tuple[int, int], int, int], None] = lambda p, i, n: None,
               timeout_s: float = 600, refit: bool = False) -> tuple:
    """(WhatIf, fit file, cached: bool, seconds) for the module at spec's settings: the kept fit, else a new one
    (every point simulated in one child, on_point(point, done, total) after each) that is then kept."""
    from .whatif import WhatIf, fit_whatif

    path, func = Path(module[0]), module[1]
    shape = module[2] if len(module) > 2 else None
    out = fit_path(path, func, run_key(spec, shape))
    if out.exists() and not refit:
        try:
            what = WhatIf.from_dict(json.loads(out.read_text()))
            if what.status != "unvalidated":
                return what, out, True, 0.0
        except (ValueError, KeyError, json.JSONDecodeError):
            pass  # an unreadable or old fit: made again
    sequence = has_sequence(path, shape)
    points, holdout = fit_points(sequence)
    total = len(points) + len([p for p in holdout if p not in points])
    done: list = []

    def point(p):
        done.append(p)
        on_point(p, len(done), total)

    t0 = time.perf_counter()
    what = fit_whatif(None, spec, points, module=module, holdout=holdout, sequence=sequence, on_point=point,
                      timeout_s=timeout_s)
    seconds = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(what.save_dict()))
    return what, out, False, seconds


def parse_module_ref(text: str) -> tuple[Path, str]:
    """`path/to/file.py:make_model` -> (absolute path, function name); ConfigError if malformed or missing."""
    path_text, sep, func = text.rpartition(":")
    if not sep or not path_text or not func.isidentifier():
        raise ConfigError(f"--module must be FILE.py:FUNCTION, got {text!r}")
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"module file not found: {path}")
    return path, func