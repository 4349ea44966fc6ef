"""Child-process entry point: `python -m planner.measure.worker '<json payload>'`.

Prints JSON lines on stdout: {"event": "progress", ...} while running, then exactly one of
{"event": "result", ...} (exit 0) or {"event": "error", "error": ..., "phase": ...} (exit 3 for out
of memory, exit 2 for a request this machine cannot run, such as a CUDA device it does not have).
Only this process imports torch; the app and the CLI parent stay light and survive its failures.
It never outlives the process that started it (die_with_parent), and keeps its temporary files in the
TMPDIR its parent made for it (and removes).
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys

EXIT_INVALID, EXIT_OOM = 2, 3


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent ends, however it ends (Linux PR_SET_PDEATHSIG;
    strictly, when the parent's thread that started it ends: run_worker waits in that thread): a CLI killed
    outright leaves no measurement running. The parent's PID comes in PLANNER_PARENT_PID; a parent that
    was gone before the request took effect ends the worker here."""
    parent = os.environ.get("PLANNER_PARENT_PID")
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            return
    except (OSError, AttributeError):  # not Linux: the parent's kill_group still ends the worker
        return
    if parent and os.getppid() != int(parent):
        os._exit(EXIT_OOM)  # 3: a measurement that did not complete


def _limit_memory(extra_bytes: int) -> None:
    """Cap the address space at what the process maps now plus `extra_bytes` (simulates a smaller machine)."""
    from .procmem import read_vm_size

    limit = read_vm_size() + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower())


def main(argv: list[str]) -> int:
    die_with_parent()
    payload = json.loads(argv[0])
    import torch

    from ..config import config_from_dict
    from ..spec import TrainSpec
    from .training import measure_training

    if payload.get("kind") in ("infer", "simulate-infer"):  # generate() (planner.measure.inference / simulate_infer)
        return _infer(payload)
    if payload.get("kind") == "simulate":  # planner.measure.simulate: the step on fake tensors
        from .simulate import worker_main

        return worker_main(payload, emit)
    cfg = config_from_dict(payload["config"]) if payload.get("config") else None  # None: a user's --module
    if payload.get("kind") == "load":
        return _load(cfg, payload)
    if payload.get("kind") == "write":
        from pathlib import Path

        from ..routines.loading import MANIFEST, cache_key, write_checkpoints

        folder = Path(payload["cache_dir"]) / cache_key(cfg)
        writing = {} if (folder / MANIFEST).exists() else {"writing": str(folder)}  # removed if this run ends early
        emit({"event": "progress", "stage": "writing checkpoints", "fraction": 0.1, **writing})
        emit({"event": "result", "folder": str(write_checkpoints(cfg, Path(payload["cache_dir"])))})
        return 0
    spec = TrainSpec(**payload["spec"])
    problem = _check_cuda(spec.device)
    if problem:
        emit({"event": "error", "error": problem, "phase": "setup"})
        return EXIT_INVALID
    if payload.get("memory_limit_bytes"):
        torch.ones(64, 64) @ torch.ones(64, 64)  # start the OpenMP thread pool before the cap applies
        _limit_memory(int(payload["memory_limit_bytes"]))
    module = tuple(payload["module"]) if payload.get("module") else None
    try:
        result = measure_training(cfg, spec, emit=emit, exports=payload.get("exports"), module=module)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one JSON line
        from ..routines.user_module import ModuleError, exception_line

        if isinstance(exc, ModuleError):  # the user's module cannot be used: one line, invalid input
            emit({"event": "error", "error": str(exc), "phase": getattr(exc, "train_phase", "build")})
            return EXIT_INVALID
        if module is not None and not _is_oom(exc) and isinstance(exc, Exception):  # the user's code failed
            emit({"event": "error", "error": f"the module failed in {getattr(exc, 'train_phase', 'setup')}: "
                                             f"{exception_line(exc)}", "phase": getattr(exc, "train_phase", "setup")})
            return EXIT_INVALID
        if _is_oom(exc):
            emit({"event": "error", "error": f"out of memory: {str(exc).splitlines()[0][:300]}",
                  "phase": getattr(exc, "train_phase", "setup"), "oom": True})
            return EXIT_OOM
        raise
    emit({"event": "result", **result})
    return 0


def _infer(payload: dict) -> int:
    """One generate() call, measured ("infer") or on fake tensors ("simulate-infer")."""
    import torch

    from ..config import config_from_dict
    from ..infer_spec import InferSpec

    cfg = config_from_dict(payload["config"])
    ispec = InferSpec(**payload["spec"])
    problem = _check_cuda(ispec.device)
    if problem:
        emit({"event": "error", "error": problem, "phase": "setup"})
        return EXIT_INVALID
    if payload["kind"] == "simulate-infer":
        from .simulate_infer import SimulationError, simulate_inference

        try:
            result = simulate_inference(cfg, ispec, emit=emit)
        except SimulationError as exc:
            emit({"event": "error", "error": str(exc), "phase": getattr(exc, "train_phase", "setup")})
            return EXIT_INVALID
        emit({"event": "result", **result})
        return 0
    if payload.get("memory_limit_bytes"):
        torch.ones(64, 64) @ torch.ones(64, 64)  # start the OpenMP thread pool before the cap applies
        _limit_memory(int(payload["memory_limit_bytes"]))
    from .inference import measure_inference

    try:
        result = measure_inference(cfg, ispec, emit=emit)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one JSON line
        if _is_oom(exc):
            emit({"event": "error", "error": f"out of memory: {str(exc).splitlines()[0][:300]}",
                  "phase": getattr(exc, "train_phase", "setup"), "oom": True})
            return EXIT_OOM
        raise
    emit({"event": "result", **result})
    return 0


def _check_cuda(device: str) -> str | None:
    import torch

    if not device.startswith("cuda"):
        return None
    if not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        return f"no CUDA device {index}: this machine has {torch.cuda.device_count()}"
    return None


def _load(cfg, payload: dict) -> int:
    from pathlib import Path

    from ..routines.loading import CheckpointError
    from .loading import measure_loading

    problem = _check_cuda(payload["device"])
    if problem:
        emit({"event": "error", "error": problem, "phase": "setup"})
        return EXIT_INVALID
    emit({"event": "progress", "stage": f"loading with {payload['method']}", "fraction": 0.1})
    try:
        result = measure_loading(cfg, payload["method"], Path(payload["folder"]), payload["device"])
    except CheckpointError as exc:
        emit({"event": "error", "error": str(exc), "phase": "load"})
        return EXIT_INVALID
    except BaseException as exc:  # noqa: BLE001
        if _is_oom(exc):
            emit({"event": "error", "error": f"out of memory: {str(exc).splitlines()[0][:300]}", "phase": "load",
                  "oom": True})
            return EXIT_OOM
        raise
    emit({"event": "result", **result})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
