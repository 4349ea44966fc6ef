"""Run a measurement in a child process and collect its JSON-lines events (no torch here).

The child (planner.measure.worker) is started in its own session, so Ctrl-C in a terminal reaches only
the parent, which reports it. How a run's processes end, whatever ends it (timeout, Ctrl-C, SIGTERM, the
app's Cancel, any exception): the parent ends its worker before it returns or raises (run_worker), the
worker dies with its parent when the parent is killed outright (worker.die_with_parent), and kill_group
ends a child with everything it started and returns only once they are all gone. Each worker's temporary
files live in a folder of its own (its TMPDIR), removed when it ends. A child that dies (the kernel's OOM
killer, a signal, a crash) becomes an error record with exit code 3 rather than an exception in the caller.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

EXIT_OK, EXIT_INVALID, EXIT_FAILED = 0, 2, 3
PROJECT_ROOT = Path(__file__).resolve().parent.parent
PARENT_ENV = "PLANNER_PARENT_PID"  # the worker dies with this process (worker.die_with_parent)


@dataclass
class WorkerOutcome:
    exit_code: int
    record: dict                      # the result event, or an error record with "error" and "phase"
    events: list[dict] = field(default_factory=list)
    stderr: str = ""


def worker_command(payload: dict) -> list[str]:
    return [sys.executable, "-m", "planner.measure.worker", json.dumps(payload)]


def _alive(procs: list) -> list:
    """The psutil processes that still run (a zombie holds no memory and counts as gone)."""
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # it ended just now
        pass


def kill_group(proc: subprocess.Popen, grace_s: float = 1.0) -> None:
    """End a child and every process it started; return once they are all gone.

    SIGTERM goes to the child's process group (a planner CLI then ends its own worker and exits); what is
    left after `grace_s` gets SIGKILL: the group, and each descendant, wherever its session. The child is
    only signalled while it is unreaped, so its PID and group cannot belong to another process."""
    import psutil

    if proc.poll() is not None:
        return
    tree = _descendants(proc.pid)
    _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is None:
        tree += _descendants(proc.pid)  # any started meanwhile
        _signal_group(proc, signal.SIGKILL)
    for p in _alive(tree):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    deadline = time.monotonic() + 5.0
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.02)


def _collect(proc: subprocess.Popen, timeout_s: float | None,
             on_event: Callable[[dict], None]) -> tuple[list[dict], bool, list[str]]:
    """Read the worker's JSON lines until it ends or the timeout (then it is killed); wait for its exit."""
    lines: queue.Queue = queue.Queue()
    stderr_chunks: list[str] = []
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
    err_reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)
    err_reader.start()
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
    err_reader.join(1.0)
    return events, timed_out, stderr_chunks


def child_env(extra: dict | None = None) -> dict:
    """The environment of every child: unbuffered output, and this project importable from any cwd."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


def run_worker(payload: dict, timeout_s: float | None = None,
               on_event: Callable[[dict], None] = lambda e: None, env: dict | None = None) -> WorkerOutcome:
    """Run one worker to its end. Whatever stops this call early (the timeout, Ctrl-C, SIGTERM turned into an
    exception by the CLI, an exception in on_event), the worker is gone and its files removed before it returns."""
    tmp = tempfile.mkdtemp(prefix="planner-run-")
    env = child_env({**(env or {}), "TMPDIR": tmp, PARENT_ENV: str(os.getpid())})
    try:
        proc = subprocess.Popen(worker_command(payload), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True, env=env)
        try:
            events, timed_out, stderr_chunks = _collect(proc, timeout_s, on_event)
        except BaseException:
            kill_group(proc)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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
    """Write (or reuse) the cached checkpoints of a config in a child process; a folder it did not finish
    writing (a failure, a timeout, Ctrl-C) is removed."""
    writing: list[str] = []
    done = False
    try:
        out = run_worker({"kind": "write", "config": cfg_dict, "cache_dir": str(cache_dir)}, timeout_s=timeout_s,
                         on_event=lambda e: writing.append(e["writing"]) if "writing" in e else None)
        done = out.exit_code == 0
    finally:
        if not done:
            for folder in writing:
                shutil.rmtree(folder, ignore_errors=True)
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
