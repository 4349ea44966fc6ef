"""Measure one loading method in this (fresh, child) process: device peak, RSS peak, time, correctness.

The model and checkpoint are in the config's checkpoint dtype (torch_dtype, else float32).
On CPU the device figure is the exact peak of live tensor storage bytes (the tracker), on CUDA
max_memory_allocated. The RSS peak is VmHWM reset just before the load, minus the RSS then; the
anonymous/file split is read right after the load, before verification reads every weight.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..config import ModelConfig, checkpoint_dtype
from ..routines.loading import LOADERS, verify_against_checkpoint
from . import procmem
from .tracker import LiveBytesTracker


def _warm_up(cfg: ModelConfig, method: str, device: torch.device) -> None:
    """Run the same method once on a tiny model of the same architecture, so that the library code it
    pages in on first use (torch.load's unpickler and zip reader, safetensors, module construction)
    is resident before the baseline RSS is read: the figure is then the method's, not first-use costs."""
    import tempfile

    from ..arch import family_of
    from ..routines.loading import write_checkpoints

    tiny = family_of(cfg).tiny(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoints(tiny, Path(tmp))
        model = LOADERS[method](tiny, folder, device)
        verify_against_checkpoint(model, folder)
        del model


def measure_loading(cfg: ModelConfig, method: str, folder: Path, device: str = "cpu") -> dict:
    dev = torch.device(device)
    result: dict = {"method": method, "device": device, "dtype": checkpoint_dtype(cfg)}
    _warm_up(cfg, method, dev)
    if dev.type == "cuda":
        before = procmem.read_status().get("VmRSS", 0)
        torch.cuda.init()
        torch.empty(1, device=dev)
        result["cuda_init_rss_bytes"] = procmem.read_status().get("VmRSS", 0) - before
        torch.cuda.reset_peak_memory_stats(dev)
        allocated_before = torch.cuda.memory_allocated(dev)
    # Pass 1, untracked: RSS, time and (CUDA) the allocator's peak. The tracker is left out of it because
    # its Python dispatch costs memory of its own during module initialisation (measured: +68 MB).
    before = procmem.read_status()
    procmem.reset_peak_rss()
    t0 = time.perf_counter()
    model = LOADERS[method](cfg, folder, dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - t0
    after = procmem.read_status()
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json"
               and _used_by(method, p))
    # Lazy methods (mmap, safetensors) read nothing until a weight is used: time the first read of every
    # weight too, so throughput compares like with like.
    t1 = time.perf_counter()
    with torch.no_grad():
        for p in model.parameters():
            p.sum()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    first_read = time.perf_counter() - t1
    if dev.type == "cuda":
        device_peak = torch.cuda.max_memory_allocated(dev) - allocated_before
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
    result["weights_match"] = verify_against_checkpoint(model, folder)
    if dev.type != "cuda":  # pass 2, tracked: the exact peak of live tensor bytes
        del model
        tracker = LiveBytesTracker()
        with tracker:
            model = LOADERS[method](cfg, folder, dev)
        tracker.track(list(model.parameters()), list(model.buffers()))  # tensors made outside aten
        device_peak = tracker.peak
    result.update({
        "peak_device_bytes": device_peak,
        "peak_cpu_bytes": after.get("VmHWM", 0) - before.get("VmRSS", 0),
        "cpu_anon_delta_bytes": after.get("RssAnon", 0) - before.get("RssAnon", 0),
        "cpu_file_delta_bytes": after.get("RssFile", 0) - before.get("RssFile", 0),
        "load_time_s": elapsed,
        "file_bytes": size,
        "first_read_s": first_read,
        "throughput_gb_s": size / (elapsed + first_read) / 1e9,
    })
    return result


def _used_by(method: str, path: Path) -> bool:
    if method == "per-tensor":
        return path.parent.name == "model_parameters"
    if method.startswith("safetensors"):
        return path.suffix == ".safetensors"
    return path.name == "model.pth"
