"""Exact parameter and buffer accounting from a config alone (no torch).

The inventory (from each architecture's file in planner/arch) lists every tensor the real model
registers, with the same names and shapes, and its role, so counts, bytes, the largest tensor (which sizes the for-loop Adam temporaries and the
per-tensor loading peak) and the checkpoint layout all come from one place. Tests compare it
name by name with the model built on the meta device.
"""
from __future__ import annotations

import functools

from .arch import family_of
from .arch.memo import config_key
from .arch.terms import DTYPE_BYTES, TensorSpec  # re-exported: bytes per dtype and the inventory's row type


def per_config(fn):
    """Memoise a pure function of a config (and hashable run settings): the app re-estimates on every
    slider move and a fit bisects, so the inventory walk (~16 tensors per layer) is done once per config.
    The key is the config's repr (config_key), which lists every field (dict fields included)."""
    cache: dict = {}

    @functools.wraps(fn)
    def wrapper(cfg, *args, **kwargs):
        key = (config_key(cfg), args, tuple(sorted(kwargs.items())) if kwargs else ())
        if key not in cache:
            if len(cache) > 4096:
                cache.clear()
            cache[key] = fn(cfg, *args, **kwargs)
        return cache[key]

    return wrapper


@per_config
def tensor_inventory(cfg: ModelConfig) -> list[TensorSpec]:
    """Every parameter and buffer, in the model's registration order (its family file lists them).

    Tied weights (a tied output head) appear once, as named_parameters() lists them.
    """
    return family_of(cfg).inventory(cfg)


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
