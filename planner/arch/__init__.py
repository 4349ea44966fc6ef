"""The architecture registry: every `planner/arch/<family>.py` with a module-level FAMILY (no torch).

Adding a family is one new file here (plus its tests): it is discovered by name, its presets join
PRESETS, its `model_type` is read from a published config.json, and the estimator walks its roles.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil

from ..validation import ConfigError
from .base import Family

_SKIP = {"base", "parts", "decoder", "terms"}  # shared pieces, not families


@functools.lru_cache(maxsize=1)
def families() -> dict[str, Family]:
    """arch key -> family with formulas (basis "formula"), in file-name order (the book's GPT-2 and Llama first, as
    the presets list). The families answered from a fit of simulations (arch/auto.py) are in all_families()."""
    return {k: f for k, f in all_families().items() if f.basis == "formula"}


@functools.lru_cache(maxsize=1)
def all_families() -> dict[str, Family]:
    """Every family file's family: the formula ones, then those whose estimate is a fitted simulation."""
    found: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: (_ORDER.get(m.name, 99), m.name)):
        if info.name in _SKIP or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if isinstance(family, Family):
            found[family.arch] = family
    return found


_ORDER = {"gpt2_book": 0, "llama": 1}


@functools.lru_cache(maxsize=1)
def _by_config_class() -> dict[type, Family]:
    return {f.config_cls: f for f in all_families().values()}


def family_of(cfg) -> Family:
    try:
        return _by_config_class()[type(cfg)]
    except KeyError:
        raise TypeError(f"not a model config: {cfg!r}") from None


def family_for_dict(data: dict) -> Family:
    """The family of a JSON config: its "arch" (the planner's own form) or else its "model_type" (a
    Hugging Face config.json). Unknown values are refused with the supported list."""
    fams = families()
    if data.get("arch") is not None:
        arch = data["arch"]
        if arch in all_families():
            return all_families()[arch]
        raise ConfigError(f"unsupported arch {arch!r}; supported: {', '.join(fams)}")
    model_type = data.get("model_type")
    if model_type is None:
        raise ConfigError('config has no "arch" (or "model_type") key; use one of: ' + ", ".join(fams))
    by_type = {t: f for f in fams.values() for t in f.model_types}
    if model_type in by_type:
        return by_type[model_type]
    # issue #20: any other causal LM transformers builds is simulated and measured as transformers' own model and
    # estimated from a fit of simulations (planner/arch/auto.py); the formula families stay the fast path
    from .auto import causal_lm_model_types

    if "auto" in all_families() and model_type in causal_lm_model_types():
        return all_families()["auto"]
    raise ConfigError(f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(by_type))} (with "
                      "formulas), or any causal LM model_type transformers' AutoModelForCausalLM builds (fitted)")


def supported_model_types() -> list[str]:
    return sorted(t for f in families().values() for t in f.model_types)


@functools.lru_cache(maxsize=1)
def all_presets() -> dict:
    out: dict = {}
    for family in families().values():
        for name, cfg in family.presets().items():
            if name in out:
                raise RuntimeError(f"preset {name!r} is defined twice")
            out[name] = cfg
    return out


__all__ = ["Family", "families", "all_families", "family_of", "family_for_dict", "supported_model_types", "all_presets"]
