"""Any decoder transformers can build (issue #20): a config.json whose `model_type` has no formula family here.

A published config.json with a `model_type` that transformers' AutoModelForCausalLM maps to a class
(transformers/models/auto/modeling_auto.py MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: OLMo 2 `olmo2`, Granite, Phi-2
`phi`, Cohere, SmolLM3, ...) and that no family file in planner/arch reads is accepted as this family, "auto":
simulate and measure build transformers' own model (AutoModelForCausalLM.from_config, never downloaded, never
remote code) and train it as its users do (`model(input_ids=x, labels=y).loss`); the estimate is answered from a
fit of simulations (planner/fitted.py: the what-if machinery), whose records say `"basis": "fitted simulation"`.
Families with a formula file stay the fast path: a `model_type` one of them reads is never "auto".

No torch and no transformers here: the list of model types is read from transformers' source file as text (its
syntax tree), so the app and the estimate side import neither. The parameter inventory is not known without
building the model, so it is empty here (param_count 0): the counts come from the simulation (the fit's record).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from ..validation import ConfigError, _check_optional, check_attention_kind
from .base import HFCausalLM

# Keys of a config.json that are not the model's shape: dropped before transformers' config class sees them
# (auto_map would point at remote code, which the planner never runs).
_NOT_MODEL = ("model_type", "transformers_version", "_name_or_path", "architectures", "auto_map", "torch_dtype",
              "dtype", "name", "attention", "_attn_implementation", "arch")
# How configs name the widths the planner shows (the first present wins).
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim", "model_dim")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_CONTEXT = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
_HEADS = ("num_attention_heads", "n_head", "num_heads")
# A config without a context length (a state-space model, some RoPE models): the sequence is bounded here
DEFAULT_CONTEXT = 131072


@functools.lru_cache(maxsize=1)
def causal_lm_model_types() -> tuple[str, ...]:
    """The model types transformers' AutoModelForCausalLM maps to a class, read from the installed transformers'
    models/auto/modeling_auto.py (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) without importing it; () without transformers."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return ()
    path = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return ()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
                                                for t in node.targets):
            try:
                pairs = node.value.args[0].elts
                return tuple(sorted(p.elts[0].value for p in pairs))
            except (AttributeError, IndexError):
                return ()
    return ()


def _first(data: dict, keys: tuple[str, ...]):
    return next((data[k] for k in keys if isinstance(data.get(k), int) and not isinstance(data.get(k), bool)), None)


@dataclass(frozen=True)
class AutoConfig:
    """Any transformers causal LM: its model_type and its config.json (as canonical JSON text: hashable, and its
    repr keys the memo caches), the attention kernel, the checkpoint dtype and a display name."""
    model_type: str
    hf: str                                  # the config's own keys (json.dumps(..., sort_keys=True))
    attention: str = "sdpa"
    torch_dtype: str | None = None
    name: str | None = None
    arch: str = dataclasses.field(default="auto", init=False)

    def __post_init__(self) -> None:
        _check_optional(self)
        check_attention_kind(self.attention)
        data = self.data
        for what, keys in (("hidden size", _HIDDEN), ("number of layers", _LAYERS)):
            value = _first(data, keys)
            if value is None or value <= 0:
                raise ConfigError(f"{self.model_type} config has no positive {what} ({' or '.join(keys)})")
        if not isinstance(data.get("vocab_size"), int) or data["vocab_size"] <= 0:
            raise ConfigError(f"{self.model_type} config has no positive vocab_size")

    @property
    def data(self) -> dict:
        return json.loads(self.hf)

    @property
    def max_seq_len(self) -> int:
        return _first(self.data, _CONTEXT) or DEFAULT_CONTEXT

    @property
    def hidden(self) -> int:
        return _first(self.data, _HIDDEN)

    @property
    def layers(self) -> int:
        return _first(self.data, _LAYERS)

    @property
    def heads(self) -> int:
        return _first(self.data, _HEADS) or 1

    @property
    def vocab_size(self) -> int:
        return self.data["vocab_size"]

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(self.data.get("tie_word_embeddings", False))


class AutoCausalLM(HFCausalLM):
    arch = "auto"
    config_cls = AutoConfig
    basis = "fitted simulation"
    description = "any causal LM transformers builds (no formula family): estimated from a fit of simulations"

    # ---- configs ---------------------------------------------------------------------------------------
    def from_dict(self, data: dict) -> AutoConfig:
        model_type = data.get("model_type")
        if not isinstance(model_type, str) or not model_type:
            raise ConfigError('an "auto" config needs its "model_type"')
        keys = {k: v for k, v in data.items() if k not in _NOT_MODEL}
        attention = data.get("attention") or data.get("_attn_implementation") or "sdpa"
        dtype = data.get("torch_dtype") or data.get("dtype")
        name = data.get("name") if isinstance(data.get("name"), str) else None
        try:
            hf = json.dumps(keys, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{model_type} config is not plain JSON: {exc}") from None
        return AutoConfig(model_type=model_type, hf=hf, attention=attention,
                          torch_dtype=dtype if isinstance(dtype, str) else None, name=name)

    def to_dict(self, cfg: AutoConfig) -> dict:
        out = {"arch": self.arch, "model_type": cfg.model_type, **cfg.data, "attention": cfg.attention}
        if cfg.torch_dtype:
            out["torch_dtype"] = cfg.torch_dtype
        if cfg.name:
            out["name"] = cfg.name
        return out

    def hf_kwargs(self, cfg: AutoConfig) -> dict:
        return cfg.data

    def build(self, cfg, device, dtype: str):
        """HFCausalLM.build with the config's own model_type (transformers' config class for it)."""
        import torch
        from transformers import AutoConfig as HFAutoConfig
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_cfg = HFAutoConfig.for_model(cfg.model_type, **self.hf_kwargs(cfg))
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        with torch.device(device):
            return AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=cfg.attention, dtype=torch_dtype)

    def with_layers(self, cfg: AutoConfig, n: int) -> AutoConfig:
        """The same model with n layers: the layer count set and every per-layer list of the config (layer_types,
        no_rope_layers, ...) cut to its first n entries."""
        data = cfg.data
        key = next(k for k in _LAYERS if k in data)
        full = data[key]
        out = {k: (v[:n] if isinstance(v, list) and len(v) == full else v) for k, v in data.items()}
        out[key] = n
        return dataclasses.replace(cfg, hf=json.dumps(out, sort_keys=True))

    def count_note(self, cfg) -> str:
        return ("No formula family reads this model_type: its parameters are counted and its peak estimated by "
                "simulating transformers' own model (a fitted simulation).")

    # ---- what the formula families provide and this one cannot -----------------------------------------
    def inventory(self, cfg) -> list:
        return []  # known only once the model is built (the simulation counts it)

    def check_run(self, cfg, spec) -> None:
        if spec.finetuning or spec.quantize_base != "none":
            raise ConfigError(f"{cfg.model_type}: fine-tuning (--lora-r, --train-layers, --quantize-base) is modelled "
                              "for the formula families only; train the full model, or use --module with your own "
                              "wrapping")
        from ..losses import is_fused

        if is_fused(spec.loss):
            raise ConfigError(f"{cfg.model_type}: --loss {spec.loss} needs a formula family")
        if spec.checkpointing and getattr(spec, "checkpoint_policy", "full") != "full":
            raise ConfigError(f"{cfg.model_type}: --checkpointing {spec.checkpoint_policy} needs a formula family "
                              "(plain --checkpointing is simulated)")

    def check_infer(self, cfg, ispec) -> None:
        raise ConfigError(f"{cfg.model_type}: inference (estimate, simulate and measure infer) is modelled for the "
                          "formula families only so far; training is estimated from a fit of simulations")

    def grid_configs(self) -> list:
        return []


FAMILY = AutoCausalLM()
