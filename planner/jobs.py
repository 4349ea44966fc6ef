"""Background measurements for the app: a child `python -m planner measure ...`, polled without blocking.

One run at a time per machine (a lock file holding the child's PID). Timeout and cancel end the child and
every process it started (runner.kill_group: the CLI ends its worker, what is left is killed) and only then
release the lock and remove the job's temporary folder. No streamlit, no torch.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .runner import PROJECT_ROOT, child_env, kill_group
from .store import data_dir


class JobBusy(RuntimeError):
    """Another measurement is running on this machine."""


def _lock_path() -> Path:
    return data_dir() / "measurement.lock"


def running_pid() -> int | None:
    """PID of the measurement that holds the machine, if it is still alive."""
    try:
        pid = int(_lock_path().read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
        return pid
    except OSError:
        _lock_path().unlink(missing_ok=True)  # a stale lock from a killed app
        return None


@dataclass
class Job:
    args: list[str]
    timeout_s: float
    config: dict | None = None    # a model config: written into the job's folder and passed as --config
    proc: subprocess.Popen | None = None
    folder: Path | None = None
    started: float = field(default_factory=time.monotonic)
    final: str | None = None      # done | failed | timeout | cancelled
    _events: list | None = None   # read once when the job ends (its folder is then removed)
    _stderr: str = ""

    def start(self) -> "Job":
        if running_pid() is not None:
            raise JobBusy("a measurement is already running on this machine; wait for it or cancel it")
        self.folder = Path(tempfile.mkdtemp(prefix="planner-job-"))
        args = list(self.args)
        if self.config is not None:
            (self.folder / "config.json").write_text(json.dumps(self.config))
            args += ["--config", str(self.folder / "config.json")]
        with (self.folder / "out.jsonl").open("w") as out, (self.folder / "err.txt").open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "planner", *args], stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=PROJECT_ROOT,
                                         env=child_env())
        _lock_path().parent.mkdir(parents=True, exist_ok=True)
        _lock_path().write_text(str(self.proc.pid))
        return self

    def events(self) -> list[dict]:
        if self._events is not None:
            return self._events
        out = []
        path = self.folder / "out.jsonl" if self.folder else None
        if path and path.exists():
            for line in path.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return out

    def state(self) -> str:
        if self.final:
            return self.final
        if self.proc.poll() is None:
            if time.monotonic() - self.started > self.timeout_s:
                self._finish("timeout", kill=True)
                return self.final
            return "running"
        self._finish("done" if self.proc.returncode == 0 else "failed")
        return self.final

    def cancel(self) -> None:
        if not self.final:
            self._finish("cancelled", kill=True)

    def result(self) -> dict | None:
        """The last JSON object the child printed (its result or error record)."""
        ev = [e for e in self.events() if e.get("event") != "progress"]
        return ev[-1] if ev else None

    def stderr(self) -> str:
        return self._stderr

    def _finish(self, final: str, kill: bool = False) -> None:
        if kill:
            kill_group(self.proc)  # returns once the CLI and its worker are gone
        self.proc.wait()
        self._events = self.events()  # reads the file: _events is still None here
        err = self.folder / "err.txt"
        self._stderr = err.read_text()[-3000:] if err.exists() else ""
        self.final = final
        if running_pid() == self.proc.pid:
            _lock_path().unlink(missing_ok=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def progress(self) -> tuple[float, str]:
        prog = [e for e in self.events() if e.get("event") == "progress"]
        if not prog:
            return 0.0, "starting (importing torch)"
        return float(prog[-1].get("fraction", 0.0)), str(prog[-1].get("stage", ""))
