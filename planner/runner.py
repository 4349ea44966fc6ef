"""Run a measurement in a child process and collect its JSON-lines events (no torch here).

The child (planner.measure.worker) is started in its own session, so a timeout or cancel kills its
whole process group; a child that dies (killed by the kernel's OOM killer, a signal, a crash) becomes
an error record with exit code 3 rather than an exception in the caller.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

EXIT_OK, EXIT_INVALID, EXIT_FAILED = 0, 2, 3
PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class WorkerOutcome:
    exit_code: int
    record: dict                      # the result event, or an error record with "error" and "phase"
    events: list[dict] = field(default_factory=list)
    stderr: str = ""


def worker_command(payload: dict) -> list[str]:
    return [sys.executable, "-m", "planner.measure.worker", json.dumps(payload)]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left after 3 s."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def child_env(extra: dict | None = None) -> dict:
    """The environment of every child: unbuffered output, and this project importable from any cwd."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


def run_worker(payload: dict, timeout_s: float | None = None,
               on_event: Callable[[dict], None] = lambda e: None, env: dict | None = None) -> WorkerOutcome:
    env = child_env(env)
    proc = subprocess.Popen(worker_command(payload), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True, env=env)
    lines: queue.Queue = queue.Queue()
    stderr_chunks: list[str] = []
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
    threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True).start()

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    events: list[dict] = []
    timed_out = False
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            timed_out = True
            break
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            timed_out = True
            break
        if line is None:
            break
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        events.append(event)
        on_event(event)
    if timed_out:
        kill_group(proc)
    proc.wait()
    time.sleep(0.05)  # let the stderr reader finish
    stderr = "".join(stderr_chunks)[-4000:]
    last_phase = next((e.get("stage") for e in reversed(events) if e.get("event") == "progress"), "setup")

    if timed_out:
        return WorkerOutcome(EXIT_FAILED, {"error": f"timed out after {timeout_s:g} s; the child was killed",
                                           "phase": last_phase, "timeout": True}, events, stderr)
    final = events[-1] if events and events[-1].get("event") in ("result", "error") else None
    if proc.returncode == 0 and final and final["event"] == "result":
        return WorkerOutcome(EXIT_OK, final, events, stderr)
    if final and final["event"] == "error":
        code = proc.returncode if proc.returncode in (EXIT_INVALID, EXIT_FAILED) else EXIT_FAILED
        return WorkerOutcome(code, final, events, stderr)
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        why = " (the kernel's OOM killer sends SIGKILL when RAM runs out)" if sig == "SIGKILL" else ""
        return WorkerOutcome(EXIT_FAILED, {"error": f"the measurement process was killed by {sig}{why}",
                                           "phase": last_phase, "killed": True}, events, stderr)
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
    return WorkerOutcome(EXIT_FAILED, {"error": f"the measurement process failed (exit {proc.returncode}): {tail}",
                                       "phase": last_phase}, events, stderr)


# A fixed glibc mmap threshold (128 KiB) in the loading child: freed large buffers go back to the kernel at
# once, so the RSS peak reflects what the method holds, not the heap's caching (research 4.1: RSS - live
# fell from +7.4% to +2.4%).
LOADING_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}

USER_FORMATS = {".pth": ("baseline", "sequential", "meta", "mmap"), ".pt": ("baseline", "sequential", "meta", "mmap"),
                ".safetensors": ("safetensors", "safetensors-copy")}


def checkpoint_folder(cfg_dict: dict, cache_dir: Path, timeout_s: float = 600) -> Path:
    """Write (or reuse) the cached checkpoints of a config in a child process."""
    out = run_worker({"kind": "write", "config": cfg_dict, "cache_dir": str(cache_dir)}, timeout_s=timeout_s)
    if out.exit_code:
        raise RuntimeError(f"writing checkpoints failed: {out.record.get('error')}")
    return Path(out.record["folder"])


def user_checkpoint_folder(path: Path, method: str, cache_dir: Path) -> Path:
    """A cache folder whose model.pth / model.safetensors is a link to the user's file (never written to)."""
    import hashlib

    from .config import ConfigError

    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise ConfigError(f"checkpoint not found: {path}")
    if path.is_dir():  # a Hugging Face folder: one model.safetensors
        files = sorted(path.glob("*.safetensors"))
        if len(files) != 1:
            raise ConfigError(f"{path} holds {len(files)} .safetensors files; sharded checkpoints are not supported yet")
        path = files[0]
    allowed = USER_FORMATS.get(path.suffix)
    if allowed is None:
        raise ConfigError(f"unsupported checkpoint type {path.suffix!r}; use .pth/.pt or .safetensors")
    if method not in allowed:
        raise ConfigError(f"method {method} cannot read a {path.suffix} file; use one of: {', '.join(allowed)}")
    key = hashlib.sha256(f"{path}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    folder = Path(cache_dir) / f"user-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / ("model.safetensors" if path.suffix == ".safetensors" else "model.pth")
    if not link.exists():
        link.symlink_to(path)
    return folder


def measure_load(cfg_dict: dict, method: str, device: str, folder: Path, timeout_s: float = 600,
                 on_event: Callable[[dict], None] = lambda e: None) -> WorkerOutcome:
    payload = {"kind": "load", "config": cfg_dict, "method": method, "device": device, "folder": str(folder)}
    return run_worker(payload, timeout_s=timeout_s, on_event=on_event, env=LOADING_ENV)
