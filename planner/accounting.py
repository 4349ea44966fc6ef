"""Exact parameter and buffer accounting from a config alone (no torch).

The inventory lists every tensor the real model (planner.models) registers, with the same names and
shapes, so counts, bytes, the largest tensor (which sizes the for-loop Adam temporaries and the
per-tensor loading peak) and the checkpoint layout all come from one place. Tests compare it
name by name with the model built on the meta device.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from math import prod

from .config import GPT2Config, LlamaConfig, ModelConfig

# Bytes per element of each dtype the planner reasons about.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "bool": 1}


def per_config(fn):
    """Memoise a pure function of a config (and hashable run settings): the app re-estimates on every
    slider move and a fit bisects, so the inventory walk (~16 tensors per layer) is done once per config.
    The key is the config's repr, which lists every field (dict fields included)."""
    cache: dict = {}

    @functools.wraps(fn)
    def wrapper(cfg, *args, **kwargs):
        key = (repr(cfg), args, tuple(sorted(kwargs.items())))
        if key not in cache:
            if len(cache) > 4096:
                cache.clear()
            cache[key] = fn(cfg, *args, **kwargs)
        return cache[key]

    return wrapper


@dataclass(frozen=True)
class TensorSpec:
    name: str                 # state_dict key (parameters and persistent buffers) or buffer name
    shape: tuple[int, ...]
    kind: str                 # "param" or "buffer"
    persistent: bool = True   # non-persistent buffers are not in the state_dict
    autocast: bool = False    # a weight that torch.autocast casts (and caches) for a matmul
    dtype: str | None = None  # fixed dtype (RoPE's inv_freq is built with .float()); None = the weights' dtype

    @property
    def numel(self) -> int:
        return prod(self.shape)


@per_config
def tensor_inventory(cfg: ModelConfig) -> list[TensorSpec]:
    """Every parameter and buffer, in the model's registration order.

    Tied weights (Llama's tie_word_embeddings) appear once, as named_parameters() lists them.
    """
    if isinstance(cfg, GPT2Config):
        return _gpt2_inventory(cfg)
    if isinstance(cfg, LlamaConfig):
        return _llama_inventory(cfg)
    raise TypeError(f"not a model config: {cfg!r}")


def _linear(name: str, n_in: int, n_out: int, bias: bool) -> list[TensorSpec]:
    specs = [TensorSpec(f"{name}.weight", (n_out, n_in), "param", autocast=True)]
    if bias:
        specs.append(TensorSpec(f"{name}.bias", (n_out,), "param", autocast=True))
    return specs


def _gpt2_inventory(c: GPT2Config) -> list[TensorSpec]:
    h, ctx = c.emb_dim, c.context_length
    specs = [TensorSpec("tok_emb.weight", (c.vocab_size, h), "param"),
             TensorSpec("pos_emb.weight", (ctx, h), "param")]
    for i in range(c.n_layers):
        p = f"trf_blocks.{i}"
        specs += _linear(f"{p}.att.W_query", h, h, c.qkv_bias)
        specs += _linear(f"{p}.att.W_key", h, h, c.qkv_bias)
        specs += _linear(f"{p}.att.W_value", h, h, c.qkv_bias)
        specs += _linear(f"{p}.att.out_proj", h, h, True)
        specs += _linear(f"{p}.ff.layers.0", h, 4 * h, True)
        specs += _linear(f"{p}.ff.layers.2", 4 * h, h, True)
        specs += [TensorSpec(f"{p}.norm1.scale", (h,), "param"), TensorSpec(f"{p}.norm1.shift", (h,), "param"),
                  TensorSpec(f"{p}.norm2.scale", (h,), "param"), TensorSpec(f"{p}.norm2.shift", (h,), "param")]
    specs += [TensorSpec("final_norm.scale", (h,), "param"), TensorSpec("final_norm.shift", (h,), "param")]
    specs += _linear("out_head", h, c.vocab_size, False)
    # The book registers the causal mask as a persistent buffer in every block (in the state_dict).
    specs += [TensorSpec(f"trf_blocks.{i}.att.mask", (ctx, ctx), "buffer") for i in range(c.n_layers)]
    return specs


def _llama_inventory(c: LlamaConfig) -> list[TensorSpec]:
    h, hd, f = c.hidden_size, c.head_dim, c.intermediate_size
    q_out, kv_out = c.num_attention_heads * hd, c.num_key_value_heads * hd
    specs = [TensorSpec("model.embed_tokens.weight", (c.vocab_size, h), "param")]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        specs += _linear(f"{p}.self_attn.q_proj", h, q_out, c.attention_bias)
        specs += _linear(f"{p}.self_attn.k_proj", h, kv_out, c.attention_bias)
        specs += _linear(f"{p}.self_attn.v_proj", h, kv_out, c.attention_bias)
        specs += _linear(f"{p}.self_attn.o_proj", q_out, h, c.attention_bias)
        specs += _linear(f"{p}.mlp.gate_proj", h, f, c.mlp_bias)
        specs += _linear(f"{p}.mlp.up_proj", h, f, c.mlp_bias)
        specs += _linear(f"{p}.mlp.down_proj", f, h, c.mlp_bias)
        specs += [TensorSpec(f"{p}.input_layernorm.weight", (h,), "param"),
                  TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), "param")]
    specs.append(TensorSpec("model.norm.weight", (h,), "param"))
    if not c.tie_word_embeddings:
        specs += _linear("lm_head", h, c.vocab_size, False)
    # RoPE inverse frequencies, non-persistent as in HF (not in checkpoints).
    specs.append(TensorSpec("model.rotary_emb.inv_freq", (hd // 2,), "buffer", persistent=False, dtype="float32"))
    return specs


@per_config
def param_count(cfg: ModelConfig) -> int:
    return sum(t.numel for t in tensor_inventory(cfg) if t.kind == "param")


@per_config
def param_bytes(cfg: ModelConfig, dtype: str = "float32") -> int:
    return param_count(cfg) * DTYPE_BYTES[dtype]


@per_config
def buffer_bytes(cfg: ModelConfig, dtype: str = "float32") -> int:
    """Buffers follow the weights' dtype (the GPT mask is built with torch.ones under the default dtype),
    except those built in a fixed dtype (Llama's fp32 inv_freq)."""
    return sum(t.numel * DTYPE_BYTES[t.dtype or dtype] for t in tensor_inventory(cfg) if t.kind == "buffer")


@per_config
def checkpoint_numel(cfg: ModelConfig) -> int:
    """Elements in a state_dict saved by `torch.save(model.state_dict())` (persistent buffers included).

    A tied Llama head appears twice as a key but shares one storage, which torch.save writes once.
    """
    return sum(t.numel for t in tensor_inventory(cfg) if t.persistent)


def weights_table(cfg: ModelConfig) -> list[dict]:
    """Parameter and buffer bytes of the model held in each dtype (the app's first table)."""
    n_params = param_count(cfg)
    return [{"dtype": dt, "bytes_per_element": DTYPE_BYTES[dt], "params_bytes": n_params * DTYPE_BYTES[dt],
             "buffers_bytes": buffer_bytes(cfg, dt),
             "total_bytes": n_params * DTYPE_BYTES[dt] + buffer_bytes(cfg, dt)}
            for dt in ("float32", "bfloat16", "float16")]
