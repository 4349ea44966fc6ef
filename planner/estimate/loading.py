"""Peak device and CPU memory of each weight-loading method, from the config alone (no torch).

Symbols: W = bytes of the checkpoint's tensors (parameters + persistent buffers, a tied head once) in
the checkpoint's dtype (float32 / float16 / bfloat16: the config's torch_dtype, else float32),
N = non-persistent buffers (recomputed, not loaded), T = the largest single tensor.
What each method holds at its peak (the notebook's methods; research/pytorch-memory-facts.md 5):
  baseline     model on the device + the whole state_dict loaded to the device       device 2W
  sequential   model on the device + the whole state_dict on the CPU, copied one by one device W+T (CUDA)
  meta         empty model on the device + the state_dict loaded to the device        device 2W, CPU ~T
  mmap         meta model; the state_dict is a mapping of the file, assigned as is    device W
  per-tensor   empty model + one tensor file at a time                               device W, CPU T
  safetensors  meta model; load_file + assign=True                                   device W
On the CPU the device is the CPU: the RSS peak is the device peak, and mapped-file pages count as
file-backed RSS (reclaimable page cache), not anonymous memory.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ..accounting import DTYPE_BYTES, per_config, tensor_inventory
from ..config import CHECKPOINT_DTYPES, ConfigError, ModelConfig, checkpoint_dtype, config_to_dict, with_dtype
from ..units import fmt_bytes

METHODS = ("baseline", "sequential", "meta", "mmap", "per-tensor", "safetensors", "safetensors-copy")
# torch.save's zip container adds a few KiB per tensor (record headers, alignment to 64 B) plus the pickle.
PTH_OVERHEAD_PER_TENSOR = 1024
# Measured on the generated checkpoints (upper bounds): a one-tensor torch.save file adds ~1.9 KiB, a
# safetensors header ~0.1 KiB per tensor; files take whole 4 KiB blocks on disk.
PT_FILE_OVERHEAD, SAFETENSORS_HEADER_PER_TENSOR, DISK_BLOCK = 2048, 256, 4096
MANIFEST = "manifest.json"
# A CPU measurement may use at most this share of the free RAM (torch itself and allocator slack need the rest).
MEASURE_RAM_SHARE = 0.8

# CUDA caching allocator constants (c10/cuda/CUDACachingAllocator.cpp). 512-B rounding measured on an H100 and an
# H200 (docs/gpu.md); the un-split remainder of a >= 10 MiB block did not show on either (an upper bound by <= 1 MiB
# per such tensor); the GPT-2 XL loading table reproduced within 0.1 GB on the H200 for every method.
_MIN_BLOCK, _SMALL, _MIN_LARGE, _ROUND_LARGE = 512, 2**20, 10 * 2**20, 2 * 2**20


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes max_memory_allocated counts for one fresh tensor: 512-B rounding, and for >= 10 MiB tensors the
    2 MiB-rounded segment when the remainder (<= 1 MiB) is too small to split off."""
    size = max(_MIN_BLOCK, -(-nbytes // _MIN_BLOCK) * _MIN_BLOCK)
    if size >= _MIN_LARGE:
        segment = -(-size // _ROUND_LARGE) * _ROUND_LARGE
        if segment - size <= _SMALL:
            return segment
    return size


def per_tensor_rss(sizes: list[int]) -> int:
    """RSS peak of filling a to_empty model one tensor at a time: untouched pages of the empty model are
    not resident, so the peak is the pages written so far plus the tensor just loaded, at the worst i."""
    done, worst = 0, 0
    for size in sizes:
        done += size
        worst = max(worst, done + size)
    return worst


@dataclass
class LoadEstimate:
    method: str
    device: str
    dtype: str                   # the checkpoint's (and the loaded model's) dtype
    peak_device_bytes: int
    peak_cpu_bytes: int          # RSS increase of the loading process (anonymous + file-backed)
    peak_cpu_anon_bytes: int
    peak_cpu_file_bytes: int     # mapped checkpoint pages: page cache, reclaimable under memory pressure
    formula_device: str
    formula_cpu: str
    checkpoint_bytes: int
    notes: list

    def to_dict(self) -> dict:
        return asdict(self)


@per_config
def weights_bytes(cfg: ModelConfig, dtype: str = "float32") -> tuple[int, int, int, list[int]]:
    """(W, N, T, sizes of the checkpoint tensors) for a model saved in `dtype`."""
    inv = tensor_inventory(cfg)
    sizes = [t.numel * DTYPE_BYTES[t.dtype or dtype] for t in inv if t.persistent]
    n = sum(t.numel * DTYPE_BYTES[t.dtype or dtype] for t in inv if not t.persistent)
    return sum(sizes), n, max(sizes), sizes


def estimate_loading(cfg: ModelConfig, method: str, device: str = "cpu", dtype: str | None = None) -> LoadEstimate:
    """`dtype` is the checkpoint's; None means the config's torch_dtype, else float32."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}")
    dtype = _check_dtype(dtype) or checkpoint_dtype(cfg)
    W, N, T, sizes = weights_bytes(cfg, dtype)
    cuda = device.startswith("cuda")
    notes = []
    if not cuda:
        dev, f_dev = {
            "baseline": (2 * W + N, "2W + N (model + loaded state_dict)"),
            "sequential": (2 * W + N, "2W + N (model + state_dict on the CPU)"),
            "meta": (2 * W + N, "2W + N (to_empty model + state_dict)"),
            "mmap": (W + N, "W + N (the parameters are the mapped file)"),
            "per-tensor": (W + T + N, "W + T + N (model + one tensor file)"),
            "safetensors": (W + N, "W + N (tensors mapped from the file, assigned)"),
            "safetensors-copy": (W + T + N, "W + T + N (model + one tensor read at a time)"),
        }[method]
        file_backed = {"mmap": 0, "safetensors": 0, "safetensors-copy": W}.get(method, 0)
        anon = {"mmap": N, "safetensors": N, "safetensors-copy": W + N, "per-tensor": per_tensor_rss(sizes) + N}.get(method, dev)
        cpu, f_cpu = anon + file_backed, {
            "mmap": "N + pages touched (none until a forward pass reads them, then up to W, file-backed)",
            "safetensors": "N + pages touched (file-backed, up to W)",
            "safetensors-copy": "W + N anonymous + W file-backed pages (the file is read through while open)",
            "per-tensor": "max_i(sum(size[0..i]) + size[i]) + N: to_empty pages count once written",
        }.get(method, f_dev)
        if method in ("mmap", "safetensors"):
            notes.append("The weights stay file-backed: RSS grows by up to W of page cache as they are read, "
                         "which the kernel can reclaim; the first optimizer step copies them on write.")
    else:
        blocks = sum(cuda_block_bytes(s) for s in sizes) + N
        big = cuda_block_bytes(T)
        dev, f_dev = {
            "baseline": (2 * blocks, "2 x sum(allocator blocks of each tensor)"),
            "sequential": (blocks + big, "sum(blocks) + block(T) (one tensor staged on the device)"),
            "meta": (2 * blocks, "2 x sum(blocks) (state_dict loaded to the device)"),
            "mmap": (blocks, "sum(blocks)"),
            "per-tensor": (blocks, "sum(blocks)"),
            "safetensors": (blocks, "sum(blocks)"),
            "safetensors-copy": (blocks, "sum(blocks)"),
        }[method]
        anon, file_backed, f_cpu = {
            "baseline": (T, 0, "T (each storage is read to the CPU, then moved)"),
            "sequential": (W, 0, "W (the state_dict on the CPU)"),
            "meta": (T, 0, "T"),
            "mmap": (0, W, "W file-backed (pages touched by the copy to the GPU; reclaimable)"),
            "per-tensor": (T, 0, "T (one tensor file at a time)"),
            "safetensors": (T, W, "T + W file-backed"),
            "safetensors-copy": (T, W, "T + W file-backed"),
        }[method]
        cpu = anon + file_backed
        notes.append("CUDA figures model the caching allocator from PyTorch's source (GPT-2 XL's table measured on an "
                     "H200 within 0.1 GB: docs/gpu.md); "
                     "the host RAM of CUDA initialisation is measured separately, not included.")
    return LoadEstimate(method=method, device=device, dtype=dtype, peak_device_bytes=dev, peak_cpu_bytes=cpu,
                        peak_cpu_anon_bytes=anon, peak_cpu_file_bytes=file_backed, formula_device=f_dev,
                        formula_cpu=f_cpu, checkpoint_bytes=W, notes=notes)


def _check_dtype(dtype: str | None) -> str | None:
    if dtype is not None and dtype not in CHECKPOINT_DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; choose one of: {', '.join(CHECKPOINT_DTYPES)}")
    return dtype


def recommend(cfg: ModelConfig, device: str, free_device_bytes: int | None = None,
              free_cpu_bytes: int | None = None, dtype: str | None = None) -> tuple[str, str]:
    """The method with the lowest device peak, then the lowest anonymous CPU peak, that fits."""
    ests = [estimate_loading(cfg, m, device, dtype) for m in ("mmap", "safetensors", "per-tensor", "sequential",
                                                              "meta", "baseline")]
    fits = [e for e in ests if (free_device_bytes is None or e.peak_device_bytes <= free_device_bytes)
            and (free_cpu_bytes is None or e.peak_cpu_anon_bytes <= free_cpu_bytes)]
    if not fits:
        return "none", "no method fits: the weights alone exceed the free memory"
    best = min(fits, key=lambda e: (e.peak_device_bytes, e.peak_cpu_anon_bytes))
    return best.method, (f"{best.method}: device peak {best.formula_device}, CPU {best.formula_cpu}; "
                         "the lowest of the methods that fit")


_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                            "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_header_sizes(path) -> dict[str, int]:
    """Bytes of each tensor of a .safetensors file, from its JSON header alone (8-byte length, then JSON)."""
    import json
    import struct

    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("file too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 2**20:
            raise ValueError(f"implausible header length {n}")
        header = json.loads(fh.read(n))
    return {k: (v["data_offsets"][1] - v["data_offsets"][0]) for k, v in header.items() if k != "__metadata__"}


def cache_key(cfg: ModelConfig) -> str:
    """The cache folder of a config's generated checkpoints: a hash of what decides the tensors (not the
    display name nor the attention kernel), then the checkpoint dtype."""
    fields = {k: v for k, v in config_to_dict(cfg).items() if k not in ("name", "attention", "torch_dtype")}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return f"{digest}-{checkpoint_dtype(cfg)}"


def _on_disk(nbytes: int) -> int:
    return -(-nbytes // DISK_BLOCK) * DISK_BLOCK


def cache_files_bytes(cfg: ModelConfig) -> dict[str, int]:
    """Disk the generated checkpoints of `cfg` take, per format: model.pth, the per-tensor folder
    (one torch.save file per tensor) and model.safetensors, each about W."""
    W, _, _, sizes = weights_bytes(cfg, checkpoint_dtype(cfg))
    return {"model.pth": _on_disk(W + PTH_OVERHEAD_PER_TENSOR * len(sizes)),
            "per-tensor folder": sum(_on_disk(s + PT_FILE_OVERHEAD) for s in sizes),
            "model.safetensors": _on_disk(W + SAFETENSORS_HEADER_PER_TENSOR * len(sizes))}


def cache_plan(cfg: ModelConfig, cache_dir, dtype: str | None = None) -> dict:
    """What measuring writes before it loads: the checkpoint cache's files, whether they are there
    already, and the free space of the disk that holds the cache folder."""
    cfg = with_dtype(cfg, _check_dtype(dtype))
    folder = Path(cache_dir).expanduser() / cache_key(cfg)
    files = cache_files_bytes(cfg)
    probe = folder
    while not probe.exists() and probe != probe.parent:  # the first existing folder up the path
        probe = probe.parent
    cached = (folder / MANIFEST).exists()
    total, free = sum(files.values()), shutil.disk_usage(probe).free
    parts = " + ".join(f"{fmt_bytes(b)} {name}" for name, b in files.items())
    if cached:
        text = f"The {fmt_bytes(total)} of checkpoints are cached in {folder}: nothing is written."
    else:
        text = (f"Measuring first writes the checkpoints once: {parts} = {fmt_bytes(total)} in {folder} "
                f"({fmt_bytes(free)} free there).")
    problem = None if cached or total <= free else (
        f"the checkpoints need {fmt_bytes(total)} of disk in {folder} ({parts}); only {fmt_bytes(free)} is free there")
    return {"folder": str(folder), "files": files, "total_bytes": total, "cached": cached, "free_bytes": free,
            "problem": problem, "text": text}


def check_cache_disk(cfg: ModelConfig, cache_dir, dtype: str | None = None) -> dict:
    """The cache plan, or ConfigError when the disk cannot hold the checkpoints."""
    plan = cache_plan(cfg, cache_dir, dtype)
    if plan["problem"]:
        raise ConfigError(f"refused: {plan['problem']}")
    return plan


def measure_refusal(cfg: ModelConfig, device: str, has_gpu: bool, free_ram_bytes: int, plan: dict) -> str | None:
    """Why measuring every method cannot start here (None when it can): no GPU for cuda, too little RAM
    for the largest CPU peak, or too little disk for the checkpoints (`plan` from cache_plan)."""
    if device.startswith("cuda") and not has_gpu:
        return ("this machine has no GPU, so loading to cuda can be estimated here but not measured; "
                "choose Load to = cpu to measure on this machine")
    if not device.startswith("cuda"):
        need = max(estimate_loading(cfg, m, device).peak_cpu_bytes for m in METHODS)
        if need > MEASURE_RAM_SHARE * free_ram_bytes:
            return (f"measuring every method needs up to {fmt_bytes(need)} of RAM and {fmt_bytes(free_ram_bytes)} is "
                    "free; pick a smaller model to measure here (the estimates above still hold)")
    return plan["problem"]
