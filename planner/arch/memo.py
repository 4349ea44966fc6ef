"""The memo key of a config (planner/accounting.py per_config and the families' per-config memos)."""
from __future__ import annotations

import weakref

_REPRS: dict[int, str] = {}  # id(config) -> its repr, while that config object lives


def config_key(cfg) -> str:
    """The config's repr (every field, dict fields included: a config with a dict field is not hashable), made once
    per config object: a dataclass repr costs ~19 us (cProfile, llama-3-8b's
    LlamaConfig), and one estimate asks ~10 memos.
    The configs are frozen dataclasses, so an object's repr never changes; the entry leaves with the object
    (weakref.finalize runs before its id can be reused)."""
    k = id(cfg)
    r = _REPRS.get(k)
    if r is None:
        r = repr(cfg)
        try:
            weakref.finalize(cfg, _REPRS.pop, k, None)
        except TypeError:  # (an object without weak references: not cached)
            return r
        _REPRS[k] = r
    return r


_PARAMS: dict = {}


def params_of(family, cfg) -> list:
    """The family's parameters of `cfg` (its inventory's kind "param" rows, registration order), made once per
    config: the offload walk reads them per estimate (~16 per layer). The caller does not mutate the list."""
    key = (type(family), family.arch, config_key(cfg))
    got = _PARAMS.get(key)
    if got is None:
        if len(_PARAMS) > 4096:
            _PARAMS.clear()
        got = _PARAMS[key] = [t for t in family.inventory(cfg) if t.kind == "param"]
    return got
