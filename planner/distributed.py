"""Start N ranks of a data-parallel measurement as children and collect their records (no torch here).

Every rank is a `python -m planner.measure.distributed` child; rank 0 leads a new process group and the
others join its process group, so one killpg ends them all (planner.runner.kill_group): on timeout, on
cancel, and as soon as one rank fails or dies, since the others would wait for it in their next
collective. The result has the per-rank records under "ranks" and the largest rank's figures at the
top level (peak_bytes, peak_phase, peak_rank), so a per-rank run reads like a single-device one.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import Callable

from .config import ConfigError
from .parallel import ParallelSpec
from .runner import EXIT_FAILED, EXIT_INVALID, EXIT_OK, WorkerOutcome, child_env, kill_group

# One rank's fixed cost on this machine: the interpreter with torch and torch.distributed imported,
# gloo's threads (RSS before the model is built, measured: ~330 MB per rank with torch 2.13 CPU).
RANK_OVERHEAD_BYTES = 350 * 2**20


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# gloo ranks on the CPU time-slice the cores (each gets cores // N intra-op threads, at least one);
# beyond 4 per core a tiny model's step takes minutes of scheduling for no new information.
RANKS_PER_CORE = 4


def _cuda_devices() -> int:
    """CUDA devices per nvidia-smi -L (no torch in this process); 0 without a driver."""
    import shutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def max_real_ranks(device: str) -> tuple[int, str]:
    """How many ranks this machine can run for real, and why: one per CUDA device (nccl needs its own
    device per rank), or RANKS_PER_CORE per CPU core for gloo."""
    if device.startswith("cuda"):
        n = _cuda_devices()
        return n, f"this machine has {n} CUDA device{'s' if n != 1 else ''} (one per rank)"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return RANKS_PER_CORE * cores, (f"this machine runs at most {RANKS_PER_CORE * cores} gloo ranks "
                                    f"({RANKS_PER_CORE} per CPU core, {cores} cores); simulate runs any number")


def check_real_ranks(pspec: ParallelSpec, device: str, per_rank_bytes: int | None = None) -> None:
    """Refuse (exit 2) a real run this machine cannot hold: more ranks than devices/cores, or more RAM."""
    limit, why = max_real_ranks(device)
    if pspec.world_size > limit:
        raise ConfigError(f"refused: {pspec.world_size} ranks cannot run for real here: {why}")
    if device.startswith("cpu") and per_rank_bytes is not None:
        import psutil

        from .units import fmt_bytes

        need = pspec.world_size * (per_rank_bytes + RANK_OVERHEAD_BYTES)
        available = psutil.virtual_memory().available
        if need > 0.8 * available:
            raise ConfigError(f"refused: {pspec.world_size} ranks need about {fmt_bytes(need)} of RAM "
                              f"(estimate + torch per rank), more than 80% of the {fmt_bytes(available)} available now")


def rank_command(payload: dict) -> list[str]:
    return [sys.executable, "-m", "planner.measure.distributed", json.dumps(payload)]


def run_ranks(cfg_dict: dict, spec_dict: dict, pspec: ParallelSpec, timeout_s: float | None = None,
              on_event: Callable[[dict], None] = lambda e: None, third_opinion: bool = False) -> WorkerOutcome:
    """Measure every rank for real; the outcome's record combines them (combine_ranks). third_opinion: each
    FSDP2 rank also runs one step under torch's FSDPMemTracker (its peak in the rank's record)."""
    n = pspec.world_size
    payload = {"config": cfg_dict, "spec": spec_dict, "parallel": asdict(pspec), "third_opinion": third_opinion,
               # a rank whose peer died waits in a collective for at most this long (then errors)
               "pg_timeout_s": max(30.0, float(timeout_s or 600))}
    base_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(n)}
    children = [(rank_command(payload), {**base_env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(n)]
    outcome = _run_children(children, timeout_s, on_event, [f"rank {r}" for r in range(n)])
    if outcome.exit_code == EXIT_OK:
        outcome.record = combine_ranks(outcome.record["results"])
    return outcome


def run_simulation(cfg_dict: dict, spec_dict: dict, pspec: ParallelSpec | None, timeout_s: float | None = None,
                   on_event: Callable[[dict], None] = lambda e: None) -> WorkerOutcome:
    """Simulate the ranks in one child under FakeTensorMode (planner.measure.distributed --simulate)."""
    payload = {"config": cfg_dict, "spec": spec_dict, "parallel": asdict(pspec) if pspec else None}
    cmd = [sys.executable, "-m", "planner.measure.distributed", "--simulate", json.dumps(payload)]
    outcome = _run_children([(cmd, {})], timeout_s, on_event, ["the simulation"])
    if outcome.exit_code == EXIT_OK:
        outcome.record = outcome.record["results"][0]
    return outcome


def _run_children(children: list[tuple[list[str], dict]], timeout_s: float | None,
                  on_event: Callable[[dict], None], names: list[str]) -> WorkerOutcome:
    """Start the children in one process group (led by the first), read their JSON lines, end them all
    on timeout or when one fails; the record is {"results": [each child's result event]}."""
    n = len(children)
    procs: list[subprocess.Popen] = []
    lines: queue.Queue = queue.Queue()
    stderr: dict[int, list[str]] = {}
    try:
        for rank, (cmd, extra_env) in enumerate(children):
            env = child_env(extra_env)
            group = {"process_group": 0 if rank == 0 else procs[0].pid}  # one group, led by the first child
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, text=True, env=env, **group)
            procs.append(proc)
            stderr[rank] = []
            threading.Thread(target=lambda p=proc, r=rank: [lines.put((r, l)) for l in p.stdout] + [lines.put((r, None))],
                             daemon=True).start()
            threading.Thread(target=lambda p=proc, r=rank: stderr[r].append(p.stderr.read()), daemon=True).start()
    except BaseException:
        if procs:
            kill_group(procs[0])
        raise

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    results: dict[int, dict] = {}
    errors: dict[int, dict] = {}
    ended: set[int] = set()
    last_stage = "setup"
    failure: dict | None = None
    try:
        while len(ended) < n:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                failure = {"error": f"timed out after {timeout_s:g} s; {'all ' + str(n) + ' ranks were' if n > 1 else 'the child was'} killed",
                           "timeout": True}
                break
            try:
                rank, line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                ended.add(rank)
                code = procs[rank].wait()
                if rank not in results and rank not in errors:
                    failure = {"error": _death(names[rank], code, "".join(stderr.get(rank, [])), n),
                               "killed": code < 0, "failed_rank": rank}
                    break
                if rank in errors:
                    failure = {**errors[rank], "failed_rank": rank}
                    failure["error"] = f"{names[rank]}: {errors[rank].get('error')}" if n > 1 else errors[rank].get("error")
                    failure["exit_code"] = code
                    break
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event.get("event")
            if kind == "progress":
                last_stage = event.get("stage", last_stage)
                if event.get("rank", 0) == 0:
                    on_event(event)
            elif kind == "result":
                results[rank] = {k: v for k, v in event.items() if k != "event"}
            elif kind == "error":
                errors[rank] = event
    finally:
        if failure is not None or len(ended) < n:
            kill_group(procs[0])
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:  # a rank outside the group (cannot happen): end it by its pid
                p.kill()
                p.wait()
    time.sleep(0.05)  # let the stderr readers finish
    tail = "\n".join(f"[rank {r}] {''.join(t)[-1500:]}" for r, t in stderr.items() if ''.join(t).strip())
    if failure is not None:
        code = EXIT_INVALID if failure.get("exit_code") == EXIT_INVALID else EXIT_FAILED
        failure.pop("exit_code", None)
        return WorkerOutcome(code, {**failure, "phase": failure.get("phase", last_stage), "world_size": n}, [], tail)
    return WorkerOutcome(EXIT_OK, {"results": [results[r] for r in range(n)]}, [], tail)


def _death(name: str, code: int, stderr: str, n: int) -> str:
    others = "; the other ranks were ended" if n > 1 else ""
    if code < 0:
        sig = signal.Signals(-code).name
        why = " (the kernel's OOM killer sends SIGKILL when RAM runs out)" if sig == "SIGKILL" else ""
        return f"{name} was killed by {sig}{why}{others}"
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "no output"
    return f"{name} failed (exit {code}): {last}{others}"


def combine_ranks(ranks: list[dict]) -> dict:
    """The record of a distributed step: per-rank records, and the largest rank at the top level."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    top = max(ranks, key=lambda r: r["peak_bytes"])
    rec = {"world_size": len(ranks), "peak_bytes": top["peak_bytes"], "peak_rank": top["rank"],
           "peak_phase": top["peak_phase"], "phase_peak_bytes": top["phase_peak_bytes"],
           "min_rank_peak_bytes": min(r["peak_bytes"] for r in ranks), "ranks": ranks}
    for key in ("step_time_s", "peak_rss_bytes"):
        if all(key in r for r in ranks):
            rec[key] = max(r[key] for r in ranks)
    return rec
