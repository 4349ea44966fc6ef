"""The Planner page's rerun time in a real browser: `python tests/e2e/bench_page.py [--moves N] [--model NAME]
[--goal training|inference]`.

Starts the app on a free port, opens it in Debian's chromium, moves the batch slider one step at a time and
times each move from the key press until the script has finished and the page has painted the new estimate
(the figure docs/speed.md reports). A benchmark, not a test: timings depend on the machine.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"


def is_script_finished(frame) -> bool:
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    return isinstance(frame, bytes) and ForwardMsg.FromString(frame).WhichOneof("type") == "script_finished"


def children_cpu_s(server: int) -> tuple[float, float]:
    """CPU seconds used so far by the app's server and by chromium with its driver (this process's other
    children): figures that other load on the machine does not inflate as much as wall time."""
    used = [0.0, 0.0]
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            used[child.pid != server] += t.user + t.system
        except psutil.Error:
            pass
    return used[0], used[1]


def start_server(data: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PLANNER_DATA": str(data / "data"), "PLANNER_CACHE": str(data / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless=true",
                             "--server.address=127.0.0.1", f"--server.port={port}",
                             "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the app did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=20)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--goal", choices=("training", "inference"), default="training",
                    help="inference: the batch of the inference mode, one step up (its + button) per move")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp))
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                sockets = []
                page.on("websocket", lambda ws: sockets.append(ws))
                page.goto(f"{url}/?model={args.model}&batch=1" if args.goal == "training" else
                          f"{url}/?model={args.model}&goal=inference&infer_precision=bf16&infer_batch=1")
                page.wait_for_selector(IDLE, timeout=60_000)
                page.wait_for_timeout(2000)
                slider = page.locator(".st-key-batch").get_by_role("slider")  # the batch (the sequence is the question's)
                step_up = page.locator(".st-key-infer_batch [data-testid='stNumberInputStepUp']")
                times, server_cpu, browser_cpu = [], 0.0, 0.0
                for i in range(args.moves + 2):
                    if args.goal == "training":
                        slider.focus()
                    s0, b0 = children_cpu_s(proc.pid)
                    t0 = time.perf_counter()
                    with sockets[-1].expect_event("framereceived", predicate=is_script_finished, timeout=30_000):
                        if args.goal == "training":
                            slider.press("ArrowRight")
                        else:
                            step_up.click()
                    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                    if i >= 2:  # the first moves warm caches
                        times.append(time.perf_counter() - t0)
                        s1, b1 = children_cpu_s(proc.pid)
                        server_cpu, browser_cpu = server_cpu + s1 - s0, browser_cpu + b1 - b0
                    page.wait_for_timeout(300)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(10)
    print(f"Planner page ({args.goal}), {args.model}, {len(times)} moves in chromium: median {statistics.median(times) * 1e3:.0f} ms, "
          f"max {max(times) * 1e3:.0f} ms (key press to the rerun's last message received and the page painted); CPU per move: server "
          f"{server_cpu / len(times) * 1e3:.0f} ms, browser {browser_cpu / len(times) * 1e3:.0f} ms "
          f"(load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
