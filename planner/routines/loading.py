"""The real weight-loading methods of the LLMs-from-scratch notebook (ch05/08), plus safetensors.

Each method builds the model for a config and fills it from a checkpoint, as the notebook does, and
returns the model. Every torch.load uses weights_only=True. Checkpoints are written by
`write_checkpoints` in the config's checkpoint dtype (torch_dtype, else float32) into a cache folder
(reused per config and dtype), and each method builds the model in that dtype; a load is verified
tensor by tensor against the mapped file, without holding a second copy of the weights.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..accounting import tensor_inventory
from ..config import ConfigError, ModelConfig, checkpoint_dtype, config_to_dict
from ..estimate.loading import MANIFEST, cache_key
from . import build_model

METHODS = ("baseline", "sequential", "meta", "mmap", "per-tensor", "safetensors", "safetensors-copy")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be loaded into the model: missing, corrupt, unsafe, or mismatched."""


def build_for_checkpoint(cfg: ModelConfig, device) -> torch.nn.Module:
    """The model in its checkpoint's dtype (a bf16 checkpoint loads into a bf16 model, as HF does)."""
    return build_model(cfg, device, checkpoint_dtype(cfg))


def write_checkpoints(cfg: ModelConfig, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """model.pth (the book's torch.save(model.state_dict())), model_parameters/NAME.pt and
    model.safetensors for `cfg` in its checkpoint dtype, written once per config and dtype and reused."""
    from ..routines_paths import default_cache_dir

    folder = Path(cache_dir or default_cache_dir()) / cache_key(cfg)
    if (folder / MANIFEST).exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = build_for_checkpoint(cfg, "cpu")
    state = model.state_dict()
    tmp = folder / "model.pth.tmp"
    torch.save(state, tmp)
    tmp.replace(folder / "model.pth")
    unique = {}
    seen = set()
    for name, t in state.items():  # a tied head shares storage: stored once, as HF does
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            unique[name] = t.contiguous()
    (folder / "model_parameters").mkdir(exist_ok=True)
    for name, t in unique.items():
        torch.save(t.clone(), folder / "model_parameters" / f"{name}.pt")
    from safetensors.torch import save_file

    save_file(unique, folder / "model.safetensors")
    manifest = {"config": config_to_dict(cfg), "dtype": checkpoint_dtype(cfg),
                "bytes": sum(t.numel() * t.element_size() for t in unique.values())}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def _restore_nonpersistent(model: torch.nn.Module, cfg: ModelConfig, device) -> None:
    """Buffers that are not in a checkpoint (RoPE's inv_freq) are recomputed after a meta build, as the
    config's architecture file says (planner/arch)."""
    from ..arch import family_of

    family_of(cfg).restore_buffers(model, cfg, device)


def safe_torch_load(path: Path, **kw):
    try:
        return torch.load(path, weights_only=True, **kw)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except Exception as exc:  # noqa: BLE001 - corrupt zips and refused pickles both land here
        text = str(exc).splitlines()[0][:200] if str(exc) else exc.__class__.__name__
        if "Weights only load failed" in str(exc) or exc.__class__.__name__ == "UnpicklingError":
            raise CheckpointError(f"refused {path.name}: it is not a plain tensor checkpoint (weights_only=True "
                                  f"rejected it: {text})") from None
        raise CheckpointError(f"cannot read {path.name}: it is truncated or not a PyTorch checkpoint ({text})") from None


def check_state_dict(model: torch.nn.Module, state: dict, cfg: ModelConfig) -> None:
    """Keys, shapes and the dtype must match the model; the first mismatches are named."""
    model_state = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in model_state.items()}
    if getattr(cfg, "tie_word_embeddings", False) and "lm_head.weight" not in state:
        expected.pop("lm_head.weight", None)  # HF stores a tied head once, as embed_tokens
    got = {k: tuple(v.shape) for k, v in state.items()}
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    shapes = [f"{k} {got[k]} vs model {expected[k]}" for k in expected if k in got and got[k] != expected[k]]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} key(s): {', '.join(missing[:3])}")
    if extra:
        problems.append(f"unexpected {len(extra)} key(s): {', '.join(extra[:3])}")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es): {'; '.join(shapes[:3])}")
    dtypes = {str(v.dtype).removeprefix("torch.") for k, v in state.items() if k in model_state
              and model_state[k].is_floating_point() and v.dtype != model_state[k].dtype}
    if dtypes:
        problems.append(f"its tensors are {', '.join(sorted(dtypes))} but the model is built in "
                        f"{checkpoint_dtype(cfg)}: give the checkpoint's dtype (--dtype)")
    if problems:
        raise CheckpointError("checkpoint does not match the model: " + " | ".join(problems))


def empty_model(cfg: ModelConfig, device) -> torch.nn.Module:
    """Meta build + to_empty, re-tying a tied head (to_empty gives it a storage of its own)."""
    model = build_for_checkpoint(cfg, "meta").to_empty(device=device)
    _tie_if_needed(model, cfg)
    return model


def _copy_into(model: torch.nn.Module, state: dict, device) -> None:
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if name in state:
                t.copy_(state[name].to(device))


def load_baseline(cfg, folder: Path, device):
    model = build_for_checkpoint(cfg, device)
    state = safe_torch_load(folder / "model.pth", map_location=device)
    check_state_dict(model, state, cfg)
    model.load_state_dict(state, strict=False)
    return model


def load_sequential(cfg, folder: Path, device):
    model = build_for_checkpoint(cfg, device)
    state = safe_torch_load(folder / "model.pth", map_location="cpu")
    check_state_dict(model, state, cfg)
    _copy_into(model, state, device)
    return model


def load_meta(cfg, folder: Path, device):
    model = empty_model(cfg, device)
    state = safe_torch_load(folder / "model.pth", map_location=device)
    check_state_dict(model, state, cfg)
    _copy_into(model, state, device)
    _restore_nonpersistent(model, cfg, device)
    return model


def _assign_to_meta_model(cfg, state: dict, device):
    """The state_dict's tensors become the parameters (assign=True): no copy, no second allocation."""
    model = build_for_checkpoint(cfg, "meta")
    check_state_dict(model, state, cfg)
    model.load_state_dict(state, assign=True, strict=False)
    _tie_if_needed(model, cfg)
    _restore_nonpersistent(model, cfg, device)
    return model


def load_mmap(cfg, folder: Path, device):
    return _assign_to_meta_model(cfg, safe_torch_load(folder / "model.pth", map_location=device, mmap=True), device)


def load_per_tensor(cfg, folder: Path, device):
    model = empty_model(cfg, device)
    pdir = folder / "model_parameters"
    names = [t.name for t in tensor_inventory(cfg) if t.persistent]
    missing = [n for n in names if not (pdir / f"{n}.pt").exists()]
    if missing:
        raise CheckpointError(f"per-tensor folder {pdir} lacks {len(missing)} file(s): {', '.join(missing[:3])}")
    params = dict(list(model.named_parameters()) + list(model.named_buffers()))
    with torch.no_grad():
        for name in names:
            t = safe_torch_load(pdir / f"{name}.pt", map_location="cpu")
            if tuple(t.shape) != tuple(params[name].shape):
                raise CheckpointError(f"shape mismatch for {name}: {tuple(t.shape)} vs model {tuple(params[name].shape)}")
            params[name].copy_(t)
            del t
    _restore_nonpersistent(model, cfg, device)
    return model


def _safetensors_errors(path: Path) -> tuple:
    """The exceptions a damaged safetensors file raises; a missing file is reported first."""
    from safetensors import SafetensorError

    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    return SafetensorError, OSError, ValueError


def load_safetensors(cfg, folder: Path, device):
    """load_file + assign=True: tensors come straight from the mapped file (no anonymous copy on CPU)."""
    from safetensors.torch import load_file

    errors = _safetensors_errors(folder / "model.safetensors")
    try:
        state = load_file(folder / "model.safetensors", device=str(device))
    except errors as exc:
        raise CheckpointError(f"cannot read model.safetensors: {str(exc)[:200]}") from None
    return _assign_to_meta_model(cfg, state, device)


def load_safetensors_copy(cfg, folder: Path, device):
    """safe_open + get_tensor per tensor + copy_ into a to_empty model (the lazy per-tensor variant)."""
    from safetensors import safe_open

    errors = _safetensors_errors(folder / "model.safetensors")
    model = empty_model(cfg, device)
    targets = dict(list(model.named_parameters()) + list(model.named_buffers()))
    try:
        with safe_open(folder / "model.safetensors", framework="pt", device="cpu") as f:
            check_state_dict(model, {k: _Header(f.get_slice(k)) for k in f.keys()}, cfg)
            with torch.no_grad():
                for name in f.keys():
                    t = f.get_tensor(name)
                    targets[name].copy_(t)
                    del t
    except errors as exc:
        raise CheckpointError(f"cannot read model.safetensors: {str(exc)[:200]}") from None
    _tie_if_needed(model, cfg)
    _restore_nonpersistent(model, cfg, device)
    return model


_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


class _Header:
    """A tensor's shape and dtype from a safetensors header, for check_state_dict (no data read)."""
    def __init__(self, tensor_slice):
        self.shape = tuple(tensor_slice.get_shape())
        self.dtype = _SAFETENSORS_DTYPES.get(tensor_slice.get_dtype(), tensor_slice.get_dtype())


def _tie_if_needed(model, cfg) -> None:
    if getattr(cfg, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight


LOADERS = {"baseline": load_baseline, "sequential": load_sequential, "meta": load_meta, "mmap": load_mmap,
           "per-tensor": load_per_tensor, "safetensors": load_safetensors,
           "safetensors-copy": load_safetensors_copy}


def verify_against_checkpoint(model: torch.nn.Module, folder: Path) -> bool:
    """The loaded weights equal the saved ones, compared tensor by tensor against the file itself
    (mapped lazily, so no second full copy is made)."""
    state = model.state_dict()
    if (folder / "model.pth").exists():
        saved = torch.load(folder / "model.pth", map_location="cpu", mmap=True, weights_only=True)
        return all(torch.equal(state[k].cpu(), v) for k, v in saved.items() if k in state)
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", framework="pt", device="cpu") as f:
        return all(torch.equal(state[k].cpu(), f.get_tensor(k)) for k in f.keys() if k in state)


def checkpoint_info(path: Path) -> dict:
    """Tensor count, total bytes and the largest tensor of a checkpoint, without reading its data:
    a .safetensors header is parsed directly; a .pth is opened with mmap=True (nothing is read but the pickle)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from ..estimate.loading import safetensors_header_sizes

        try:
            sizes = safetensors_header_sizes(path)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {path.name}: {exc}") from None
    else:
        state = safe_torch_load(path, map_location="cpu", mmap=True)
        sizes, seen = {}, set()
        for k, v in state.items():  # a tied head is one storage under two keys: counted once
            if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in seen:
                seen.add(v.untyped_storage().data_ptr())
                sizes[k] = v.numel() * v.element_size()
    return {"tensors": len(sizes), "bytes": sum(sizes.values()),
            "largest": max(sizes.items(), key=lambda kv: kv[1]) if sizes else None, "file_bytes": path.stat().st_size}
