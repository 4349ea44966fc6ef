"""Model configs: what a user brings (a preset, a book-style dict, an HF config.json), validated.

Torch-free on purpose: the app and the estimators read configs without paying torch's import time.
Every validation failure raises ConfigError with a one-line message a user can act on.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Union

# A model with more parameters than this is refused: 1e13 parameters is ~20x the largest dense model
# ever published, so a config this size is a typo (an extra zero in a width), and its byte counts
# would be meaningless to plan for.
MAX_PARAMETERS = 10**13

ATTENTION_KINDS = ("eager", "sdpa")
# The dtypes a checkpoint is saved in (HF's torch_dtype); a config without one is read as float32.
CHECKPOINT_DTYPES = ("float32", "float16", "bfloat16")


class ConfigError(ValueError):
    """An invalid model or run description; its message is one line, shown to the user as is."""


@dataclass(frozen=True)
class GPT2Config:
    """LLMs-from-scratch's GPTModel config, keys exactly as the book's BASE_CONFIG."""
    vocab_size: int = 50257       # GPT-2 BPE vocabulary; the book does not pad it
    context_length: int = 1024    # also sizes each block's persistent fp32 causal-mask buffer (ctx x ctx)
    emb_dim: int = 768
    n_heads: int = 12
    n_layers: int = 12
    drop_rate: float = 0.0        # the loading notebook's BASE_CONFIG uses 0.0; training chapters use 0.1
    qkv_bias: bool = True         # True to match OpenAI's GPT-2 weights (book ch05 loads them this way)
    attention: str = "eager"      # eager: the book's manual attention; sdpa: F.scaled_dot_product_attention
    torch_dtype: str | None = None  # the checkpoint's dtype (None: float32, as the book saves it)
    name: str | None = None       # optional display name (runs are stored under it)
    arch: str = dataclasses.field(default="gpt2", init=False)

    def __post_init__(self) -> None:
        _check_positive(self, ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"))
        _check_optional(self)
        if self.emb_dim % self.n_heads:
            raise ConfigError(f"emb_dim {self.emb_dim} is not divisible by n_heads {self.n_heads}")
        if not 0.0 <= self.drop_rate < 1.0:
            raise ConfigError(f"drop_rate must be in [0, 1), got {self.drop_rate}")
        check_attention_kind(self.attention)

    @property
    def max_seq_len(self) -> int:
        return self.context_length

    @property
    def hidden(self) -> int:
        return self.emb_dim

    @property
    def layers(self) -> int:
        return self.n_layers

    @property
    def heads(self) -> int:
        return self.n_heads


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-style decoder, keys as Hugging Face's LlamaConfig (config.json) names them."""
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008          # SwiGLU width (gate/up/down projections)
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None means = num_attention_heads (HF's default: plain MHA)
    max_position_embeddings: int = 2048     # only bounds the sequence length: RoPE has no position table
    tie_word_embeddings: bool = False       # True: lm_head shares embed_tokens' weight (Llama 3.2 1B/3B)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    head_dim: int | None = None             # None means hidden_size // num_attention_heads (HF's default)
    attention_bias: bool = False            # HF flag: biases on q/k/v/o projections
    mlp_bias: bool = False                  # HF flag: biases on gate/up/down projections
    rope_scaling: dict | None = None        # accepted for HF compatibility; changes RoPE values, not memory
    attention: str = "sdpa"                 # sdpa (HF's default kernel) or eager (manual softmax attention)
    torch_dtype: str | None = None          # the published checkpoint's dtype (HF key); None: float32
    name: str | None = None                 # optional display name (runs are stored under it)
    hidden_act: str = "silu"                # the gated MLP's activation (transformers' ACT2FN name)
    arch: str = dataclasses.field(default="llama", init=False)

    def __post_init__(self) -> None:
        _check_optional(self)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        _check_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "max_position_embeddings"))
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by "
                                  f"num_attention_heads {self.num_attention_heads}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _check_positive(self, ("head_dim",))
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_key_value_heads {self.num_key_value_heads} does not divide "
                              f"num_attention_heads {self.num_attention_heads}")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        check_attention_kind(self.attention)
        check_activation(self.hidden_act)

    @property
    def max_seq_len(self) -> int:
        return self.max_position_embeddings

    @property
    def hidden(self) -> int:
        return self.hidden_size

    @property
    def layers(self) -> int:
        return self.num_hidden_layers

    @property
    def heads(self) -> int:
        return self.num_attention_heads


# Any family's config (planner/arch/<family>.py defines the others); kept as a name for type hints.
ModelConfig = Union[GPT2Config, LlamaConfig, Any]

# Attention kernels transformers offers that need a CUDA GPU and an extra package: refused with the reason.
GPU_ONLY_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention", "paged_attention")

# transformers 5.23's ACT2FN names (activations.py); the planner models the ones in ACTIVATION_SAVED.
HF_ACTIVATIONS = ("gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh",
                  "gelu_python_tanh", "gelu_accurate", "hardswish", "laplace", "leaky_relu", "linear", "mish",
                  "quick_gelu", "relu", "relu2", "relu6", "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh",
                  "prelu", "xielu")
# Tensors of the activation's input size that its autograd nodes save, besides its output (which the
# next op saves): one fused kernel saves its input (silu, gelu, gelu tanh: aten derivatives.yaml) or its
# output (relu: threshold_backward(result)); transformers' Python tanh-GELUs (NewGELUActivation,
# GELUTanh(use_gelu_tanh_python)) save x, 0.5x, tanh(.) and 1 + tanh(.) (measured, saved-tensor hooks).
ACTIVATION_SAVED = {"silu": 1, "swish": 1, "gelu": 1, "gelu_pytorch_tanh": 1, "relu": 0, "gelu_new": 4,
                    "gelu_python_tanh": 4}


def check_attention_kind(attention: str) -> None:
    if attention in GPU_ONLY_ATTENTION:
        raise ConfigError(f"attention {attention!r} needs a CUDA GPU and its kernel package; the planner "
                          f"measures on this machine's CPU with one of: {', '.join(ATTENTION_KINDS)}")
    if attention not in ATTENTION_KINDS:
        raise ConfigError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}")


def check_activation(act: str) -> None:
    if act not in HF_ACTIVATIONS:
        raise ConfigError(f"hidden_act {act!r} is not an activation transformers knows; it accepts: "
                          f"{', '.join(HF_ACTIVATIONS)}")
    if act not in ACTIVATION_SAVED:
        raise ConfigError(f"hidden_act {act!r} is valid in transformers but its memory is not modelled yet; "
                          f"supported: {', '.join(ACTIVATION_SAVED)}")


def _check_optional(cfg: Any) -> None:
    if cfg.torch_dtype is not None and cfg.torch_dtype not in CHECKPOINT_DTYPES:
        raise ConfigError(f"torch_dtype must be one of {', '.join(CHECKPOINT_DTYPES)}, got {cfg.torch_dtype!r}")
    if cfg.name is not None and not (isinstance(cfg.name, str) and 0 < len(cfg.name) <= 100):
        raise ConfigError(f"name must be a string of 1 to 100 characters, got {cfg.name!r}")


def _check_positive(cfg: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")


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
