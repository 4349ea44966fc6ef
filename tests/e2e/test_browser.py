"""The running app in a real browser (Debian's chromium driven by Playwright): every page, a deep link on
a fresh server, a slider, a real tiny measurement; screenshots go to tests/e2e/screenshots/."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")
sync_api = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(__file__).parent / "screenshots"
TINY = {"arch": "gpt2", "vocab_size": 300, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 2,
        "drop_rate": 0.1}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PLANNER_DATA": str(tmp / "data"), "PLANNER_CACHE": str(tmp / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless=true",
                             "--server.address=127.0.0.1", f"--server.port={port}",
                             "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("the app did not start")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def page(server):
    SHOTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        yield page
        browser.close()


def settle(page):
    page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']", timeout=60_000)
    page.wait_for_timeout(800)


def no_errors(page):
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0


def test_deep_link_first_on_a_fresh_server(server, page):
    page.goto(f"{server}/training")
    sync_api.expect(page.get_by_role("heading", name="Training step: measured against estimated")).to_be_visible()
    settle(page)
    sync_api.expect(page.get_by_text("Torch Memory Planner").first).to_be_visible()  # the frame's sidebar
    no_errors(page)
    page.screenshot(path=SHOTS / "training-deep-link.png", full_page=True)


def test_planner_slider_moves_the_estimate(server, page):
    page.goto(server)
    sync_api.expect(page.get_by_role("heading", name="Planner: will it fit?")).to_be_visible()
    settle(page)
    value = page.get_by_test_id("stMetricValue").first
    before = value.inner_text()
    slider = page.get_by_role("slider").first
    slider.focus()
    for _ in range(10):
        slider.press("ArrowRight")
    settle(page)
    assert value.inner_text() != before
    page.wait_for_selector("[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg")
    page.wait_for_timeout(1000)
    no_errors(page)
    page.screenshot(path=SHOTS / "planner.png", full_page=True)


def test_pages_render(server, page):
    for path, heading, shot in (("loading", "Weight loading", "loading.png"), ("runs", "Runs", "runs-empty.png")):
        page.goto(f"{server}/{path}")
        sync_api.expect(page.get_by_role("heading", name=heading)).to_be_visible()
        settle(page)
        no_errors(page)
        page.screenshot(path=SHOTS / shot, full_page=True)


def test_a_tiny_measurement_end_to_end(server, page):
    page.goto(server)
    settle(page)
    page.get_by_text("Paste a config").click()
    settle(page)
    box = page.get_by_role("textbox", name="Config JSON")
    box.fill(json.dumps(TINY))
    box.press("Control+Enter")
    settle(page)
    no_errors(page)
    page.get_by_role("link", name="Training step").click()
    sync_api.expect(page.get_by_role("heading", name="Training step: measured against estimated")).to_be_visible()
    settle(page)
    page.get_by_role("button", name="Run measurement").click()
    sync_api.expect(page.get_by_text("Measured peak")).to_be_visible(timeout=120_000)
    settle(page)
    page.wait_for_timeout(1500)
    no_errors(page)
    page.screenshot(path=SHOTS / "training-result.png", full_page=True)
    page.get_by_role("link", name="Runs").click()
    sync_api.expect(page.get_by_text("Worst |error| over these runs")).to_be_visible()
    settle(page)
    page.wait_for_timeout(1000)
    page.screenshot(path=SHOTS / "runs.png", full_page=True)


def run_processes():
    """The measurement processes of this module's app server (its `planner measure` child and that child's
    worker, wherever they were re-parented), told from other sessions' by the server's PLANNER_DATA."""
    import psutil

    def env(p):
        try:
            return p.environ().get("PLANNER_DATA")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    ours = {env(p) for p in psutil.Process().children() if "streamlit" in " ".join(p.cmdline())} - {None}
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        try:
            if (("planner.measure.worker" in cmd or "-m planner measure" in cmd) and env(p) in ours
                    and p.status() != psutil.STATUS_ZOMBIE):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def test_cancel_ends_the_measurement(server, page):
    """The issue's case: gpt2-small, batch 4, seq 512 (the Planner's defaults) runs for tens of seconds on a
    CPU; Cancel after ~6 s leaves no process, and says so as information, not as an error."""
    page.goto(server)
    settle(page)
    page.get_by_role("link", name="Training step").click()
    sync_api.expect(page.get_by_role("heading", name="Training step: measured against estimated")).to_be_visible()
    settle(page)
    page.get_by_role("button", name="Run measurement").click()
    cancel = page.get_by_role("button", name="Cancel")
    sync_api.expect(cancel).to_be_visible(timeout=60_000)
    deadline = time.monotonic() + 30
    while not any("planner.measure.worker" in " ".join(p.cmdline()) for p in run_processes()):
        assert time.monotonic() < deadline, "the measurement's worker did not start"
        time.sleep(0.2)
    page.wait_for_timeout(6000)
    assert run_processes(), "the measurement ended before it could be cancelled"
    cancel.click()
    t0 = time.monotonic()
    while run_processes() and time.monotonic() - t0 < 3:
        time.sleep(0.05)
    assert not run_processes(), "a measurement process outlived Cancel by 3 s"
    info = page.get_by_test_id("stAlertContentInfo").filter(has_text="cancelled")
    sync_api.expect(info).to_be_visible(timeout=60_000)
    settle(page)
    no_errors(page)
    sync_api.expect(page.get_by_role("button", name="Run measurement")).to_be_enabled()
    page.screenshot(path=SHOTS / "training-cancelled.png", full_page=True)
