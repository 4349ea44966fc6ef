"""Model configs: what a user brings (a preset, a book-style dict, an HF config.json), validated.

Torch-free on purpose: the app and the estimators read configs without paying torch's import time.
Every validation failure raises ConfigError with a one-line message a user can act on.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

# The families' config classes live in their architecture files (planner/arch/<family>.py) and the shared
# checks in planner/validation.py; both are re-exported here, where configs are read, resolved and written.
from .arch.gpt2_book import GPT2Config
from .arch.llama import LlamaConfig
from .validation import (ACTIVATION_SAVED, ATTENTION_KINDS, CHECKPOINT_DTYPES, GPU_ONLY_ATTENTION, HF_ACTIVATIONS,
                         MAX_PARAMETERS, ConfigError, _check_optional, _check_positive, check_activation,
                         check_attention_kind)

# Any family's config (planner/arch/<family>.py defines the others); kept as a name for type hints.
ModelConfig = Union[GPT2Config, LlamaConfig, Any]



class _Presets(Mapping):
    """Every family's presets (planner/arch/<family>.py), by name; read on first use, as the families
    import this module."""

    def _all(self) -> dict:
        from .arch import all_presets

        return all_presets()

    def __getitem__(self, name: str):
        return self._all()[name]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


PRESETS: Mapping[str, ModelConfig] = _Presets()


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None


def config_from_dict(data: Any) -> ModelConfig:
    """Build a config from a JSON object: {"arch": ...} (the form config_to_dict writes) or a Hugging Face
    config.json ({"model_type": ...}); each family (planner/arch) reads its own keys.

    Unknown keys are ignored (HF files carry many: bos_token_id, use_cache, ...); missing required
    keys are named in the error.
    """
    from .arch import family_for_dict

    if not isinstance(data, dict):
        raise ConfigError(f"a model config must be a JSON object, got {type(data).__name__}")
    family = family_for_dict(data)
    cfg = family.from_dict(data)
    _check_size(cfg)
    return cfg


def _check_size(cfg: ModelConfig) -> None:
    from .accounting import param_count  # local: accounting imports this module

    n = param_count(cfg)
    if n > MAX_PARAMETERS:
        raise ConfigError(f"config describes {n:.3g} parameters, more than the {MAX_PARAMETERS:.0e} "
                          "this planner accepts; check the sizes for a typo")


def load_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.__class__.__name__}") from None
    return parse_config_text(text, source=str(path))


def parse_config_text(text: str, source: str = "config") -> ModelConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    return config_from_dict(data)


def resolve_model(preset_name: str | None = None, config_path: str | None = None) -> ModelConfig:
    """The CLI's MODEL argument: exactly one of a preset name or a config file."""
    if (preset_name is None) == (config_path is None):
        raise ConfigError("give exactly one of --model PRESET or --config FILE.json")
    cfg = preset(preset_name) if preset_name is not None else load_config(config_path)
    return cfg


def with_attention(cfg: ModelConfig, attention: str | None) -> ModelConfig:
    """The same model with another attention kernel (a run option that changes activations only)."""
    if attention is None or attention == cfg.attention:
        return cfg
    return dataclasses.replace(cfg, attention=attention)


def with_dtype(cfg: ModelConfig, dtype: str | None) -> ModelConfig:
    """The same model saved in another dtype (the checkpoint's dtype decides what loading holds)."""
    if dtype is None or dtype == checkpoint_dtype(cfg):
        return cfg
    return dataclasses.replace(cfg, torch_dtype=dtype)


def checkpoint_dtype(cfg: ModelConfig) -> str:
    """The dtype a checkpoint of `cfg` is saved in: its torch_dtype, else float32."""
    return cfg.torch_dtype or "float32"


def model_label(cfg: ModelConfig, preset_name: str | None = None) -> str:
    """The name a run is stored under: the preset's, the config's `name`, else arch, width, depth and size."""
    from .accounting import param_count  # local: accounting imports this module

    if preset_name in PRESETS:
        return preset_name
    if cfg.name:
        return cfg.name
    n = param_count(cfg)
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"
    return f"{cfg.arch} h{cfg.hidden} L{cfg.layers} ({size} params)"


def config_to_dict(cfg: ModelConfig) -> dict:
    """JSON form that config_from_dict reads back (round-trips)."""
    from .arch import family_of

    return family_of(cfg).to_dict(cfg)
