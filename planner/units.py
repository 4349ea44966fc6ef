"""Byte formatting and size parsing, shared by the CLI and the app."""
from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def fmt_bytes(n: float) -> str:
    """Binary units (GiB), as torch.cuda and nvidia-smi report memory."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_count(n: int) -> str:
    """A parameter count as people say it: 124M, 1.1B, 46.7K."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


def parse_size(text: str) -> int:
    """'24GiB', '800MB', '1.5 GB' or plain bytes -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use bytes or units like 24GiB, 800MB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])



def parse_budget(text: str) -> int:
    """A `--budget` value (24GiB, 80GB, bytes) in bytes, positive; anything else: ConfigError (exit 2) in one line."""
    from .validation import ConfigError

    try:
        budget = parse_size(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if budget <= 0:
        raise ConfigError(f"the budget must be positive, got {text}")
    return budget

def gib_to_bytes(gib: float) -> int:
    """A budget typed in GiB (the pages' number inputs) -> bytes, truncated as the budget was on every page."""
    return int(gib * 2**30)


def bytes_to_gib(n: int, digits: int = 1) -> float:
    """Bytes -> GiB rounded to `digits` (a number input's default value)."""
    return round(n / 2**30, digits)
