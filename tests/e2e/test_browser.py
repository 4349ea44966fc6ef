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
    # the estimate beneath the plan search's answer (issue #35: the page leads with the plan)
    value = page.get_by_test_id("stMetric").filter(has_text="Estimated peak").get_by_test_id("stMetricValue")
    before = value.inner_text()
    slider = page.locator(".st-key-batch").get_by_role("slider")
    slider.focus()
    for _ in range(10):
        slider.press("ArrowRight")
    settle(page)
    assert value.inner_text() != before
    page.wait_for_selector("[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg")
    page.wait_for_timeout(1000)
    no_errors(page)
    page.screenshot(path=SHOTS / "planner.png", full_page=True)


def test_a_link_with_a_model_opens_with_exactly_its_settings(server, page):
    """`/?budget_gib=24&batch=1&seq=2048` used to drop seq (gpt2's context is 1024): the model is in the link now."""
    from planner.config import PRESETS
    from planner.estimate.training import estimate_training
    from planner.spec import TrainSpec
    from planner.units import fmt_bytes

    with page.context.browser.new_context(viewport={"width": 1400, "height": 1000}) as fresh:  # a new session
        tab = fresh.new_page()
        tab.goto(f"{server}/?model=llama-3.2-1b&budget_gib=24&batch=1&seq=2048&precision=bf16-amp")
        sync_api.expect(tab.get_by_role("heading", name="Planner: will it fit?")).to_be_visible()
        settle(tab)
        no_errors(tab)
        assert [tab.locator(f".st-key-{k}").get_by_role("slider").input_value() for k in ("batch", "seq")] == ["1", "2048"]
        assert tab.get_by_label("Memory budget (GiB)").input_value() == "24.00"
        sync_api.expect(tab.get_by_test_id("stSidebar").get_by_text("llama-3.2-1b").first).to_be_visible()
        expected = estimate_training(PRESETS["llama-3.2-1b"], TrainSpec(1, 2048, "bf16-amp")).peak_bytes
        peak = tab.get_by_test_id("stMetric").filter(has_text="Estimated peak").get_by_test_id("stMetricValue")
        assert peak.inner_text() == fmt_bytes(expected)
        assert "seq=2048" in tab.url and "model=llama-3.2-1b" in tab.url
        tab.screenshot(path=SHOTS / "planner-deep-link.png", full_page=True)


def test_move_a_slider_then_measure_this_option(server, page):
    """It raised StreamlitAPIException from st.switch_page once a slider had put its value in the URL."""
    page.goto(server)
    settle(page)
    page.get_by_text("Paste a config").click()
    settle(page)
    box = page.get_by_role("textbox", name="Config JSON")
    box.fill(json.dumps(TINY))
    box.press("Control+Enter")
    settle(page)
    slider = page.locator(".st-key-batch").get_by_role("slider")
    slider.focus()
    for _ in range(4):
        slider.press("ArrowRight")  # batch 4 -> 8
    settle(page)
    assert "batch=8" in page.url
    page.get_by_role("combobox", name="Option").click()
    page.keyboard.type("grad-accum 4 x batch 2")  # the selectbox filters as one types
    page.keyboard.press("Enter")
    settle(page)
    page.get_by_role("button", name="Measure this option").click()
    sync_api.expect(page.get_by_role("heading", name="Training step: measured against estimated")).to_be_visible()
    no_errors(page)
    sync_api.expect(page.get_by_text("pasted gpt2").first).to_be_visible()  # the pasted model survived the switch
    sync_api.expect(page.get_by_text("batch 2 x seq 64")).to_be_visible()
    sync_api.expect(page.get_by_text("grad. accumulation 4")).to_be_visible()
    sync_api.expect(page.get_by_text("Measured peak")).to_be_visible(timeout=120_000)
    settle(page)
    no_errors(page)
    page.screenshot(path=SHOTS / "measure-this-option.png", full_page=True)


def test_upload_a_non_llama_config_json(server, page):
    """A published Qwen2.5 config.json through the file uploader: transformers' family, estimated at once."""
    page.goto(server)
    settle(page)
    page.get_by_text("Paste a config").click()
    settle(page)
    page.locator("input[type='file']").set_input_files(str(ROOT / "tests/data/Qwen2.5-0.5B.config.json"))
    settle(page)
    page.screenshot(path=SHOTS / "upload-qwen2.png", full_page=True)
    no_errors(page)
    sync_api.expect(page.get_by_text("qwen2").first).to_be_visible()
    sync_api.expect(page.get_by_text("494,032,768 parameters", exact=False).first).to_be_visible()  # published
    sync_api.expect(page.get_by_text("Estimated peak").first).to_be_visible()


def test_upload_a_config_no_family_file_reads_then_fit_it(server, page):
    """An OLMo 2 config.json (no formula family): the page offers the fit by simulation, runs it as a background job
    and then labels every figure as a fitted simulation with the fit's own check (issue #20)."""
    page.goto(server)
    settle(page)
    page.get_by_text("Paste a config").click()
    settle(page)
    page.locator("input[type='file']").set_input_files(str(ROOT / "tests/data/configs/olmo2-tiny.json"))
    settle(page)
    no_errors(page)
    sync_api.expect(page.get_by_text("fitted simulation", exact=False).first).to_be_visible()
    page.get_by_role("button", name="Fit by simulation").click()
    # a tiny model's fit: a few simulations in child processes (about half a minute on 2 busy cores)
    sync_api.expect(page.get_by_text("Estimated peak (fitted simulation)").first).to_be_visible(timeout=240_000)
    settle(page)
    no_errors(page)
    sync_api.expect(page.get_by_text("Fit check").first).to_be_visible()
    sync_api.expect(page.get_by_text("Largest batch that fits").first).to_be_visible()
    page.screenshot(path=SHOTS / "upload-olmo2-fitted.png", full_page=True)


def test_data_parallel_link_shows_per_rank_figures(server, page):
    page.goto(f"{server}/?model=llama-3-8b&parallel=fsdp&world=8&batch=1&seq=4096&budget_gib=80&ckpt=true"
              "&precision=bf16")
    settle(page)
    no_errors(page)
    sync_api.expect(page.get_by_text("Estimated peak per rank", exact=True)).to_be_visible()
    sync_api.expect(page.get_by_text("Fewest devices of").first).to_be_visible()
    sync_api.expect(page.get_by_text("fsdp x8 reshard").first).to_be_visible()
    page.screenshot(path=SHOTS / "planner-fsdp.png", full_page=True)


def test_fine_tuning_link_shows_the_longest_context_beside_unsloth(server, page):
    """Unsloth's setting on a 24 GiB GPU, QLoRA on Llama-3.1-8B: the fine-tuning controls hold the link's settings,
    and the longest-context table stands beside Unsloth's figures, labelled as theirs."""
    page.goto(f"{server}/?model=llama-3.1-8b&tune=qlora&lora_r=32&lora_targets=all-linear&batch=1&seq=4096"
              "&device=cuda&ckpt=true&budget_gib=24")
    settle(page)
    no_errors(page)
    sync_api.expect(page.get_by_text("LoRA r=32 on").first).to_be_visible()  # the estimate's note: what trains
    page.get_by_text("Longest context at each GPU size").click()
    settle(page)
    no_errors(page)
    # the table is computed when the expander opens (a bisection per GPU size)
    sync_api.expect(page.get_by_text("not measurements of ours", exact=False).first).to_be_visible(timeout=60_000)
    settle(page)
    page.screenshot(path=SHOTS / "planner-lora-longest-context.png", full_page=True)


def test_pages_render(server, page):
    for path, heading, shot in (("loading", "Weight loading", "loading.png"), ("runs", "Runs", "runs-empty.png"),
                                ("module", "Your module: will it fit?", "module-empty.png")):
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


def test_simulate_then_download_the_memory_snapshot(server, page, tmp_path):
    """Issue #22: Simulate on the Training step page, then download the memory_viz snapshot it offers; the
    downloaded pickle replays (as memory_viz does) to the simulated peak."""
    import pickle

    from planner.measure.export import viewer_peak

    page.goto(server)
    settle(page)
    page.get_by_text("Paste a config").click()
    settle(page)
    box = page.get_by_role("textbox", name="Config JSON")
    box.fill(json.dumps(TINY))
    box.press("Control+Enter")
    settle(page)
    page.get_by_role("link", name="Training step").click()
    settle(page)
    page.get_by_role("button", name="Simulate").click()
    sync_api.expect(page.get_by_text("Simulated peak")).to_be_visible(timeout=120_000)
    settle(page)
    sync_api.expect(page.get_by_text("Memory by category over the step")).to_be_visible()
    page.wait_for_timeout(1500)
    no_errors(page)
    page.get_by_text("Memory by category over the step").scroll_into_view_if_needed()
    page.wait_for_timeout(800)
    page.screenshot(path=SHOTS / "training-export.png")
    with page.expect_download() as info:
        page.get_by_role("button", name="Download memory snapshot").click()
    path = tmp_path / "snapshot.pickle"
    info.value.save_as(path)
    snap = pickle.loads(path.read_bytes())
    assert viewer_peak(snap) == snap["planner"]["peak_bytes"] > 0
    assert {"alloc", "free_completed"} <= {e["action"] for e in snap["device_traces"][0]}


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


def test_inference_mode_by_deep_link(server, page):
    """The Planner in inference mode opens from a link with its settings: the estimate of generate() and the
    serving capacity are shown for exactly those settings (planner.serving)."""
    from planner.config import PRESETS
    from planner.infer_spec import InferSpec
    from planner.serving import plan_inference
    from planner.units import fmt_bytes

    page.goto(f"{server}/?model=llama-3.2-1b&goal=inference&infer_precision=bf16&infer_batch=4&prompt=2048"
              "&new_tokens=128&infer_budget_gib=24")
    settle(page)
    no_errors(page)
    p = plan_inference(PRESETS["llama-3.2-1b"], InferSpec(4, 2048, 128, precision="bf16"), 24 * 2**30)
    sync_api.expect(page.get_by_text("Serving capacity")).to_be_visible()
    sync_api.expect(page.get_by_text(fmt_bytes(p.peak_bytes)).first).to_be_visible()
    sync_api.expect(page.get_by_text(f"{p.kv_tokens:,}").first).to_be_visible()
    page.screenshot(path=SHOTS / "planner-inference.png", full_page=True)


def test_inference_mode_choose_nf4_weights(server, page):
    """In inference mode, clicking nf4 in the weight quantization control changes the estimate of generate()
    to the planner's for nf4 weights (planner.serving), and the weights line names bitsandbytes' storage."""
    from planner.config import PRESETS
    from planner.infer_spec import InferSpec
    from planner.serving import plan_inference
    from planner.units import fmt_bytes

    page.goto(f"{server}/?model=llama-3.2-1b&goal=inference&infer_precision=bf16&infer_batch=4&prompt=2048"
              "&new_tokens=128&infer_budget_gib=24&infer_device=cuda")
    settle(page)
    no_errors(page)
    cfg, budget = PRESETS["llama-3.2-1b"], 24 * 2**30
    plain = plan_inference(cfg, InferSpec(4, 2048, 128, precision="bf16", device="cuda"), budget)
    nf4 = plan_inference(cfg, InferSpec(4, 2048, 128, precision="bf16", device="cuda", quantize_weights="nf4"), budget)
    peak = page.get_by_test_id("stMetric").filter(has_text="Estimated peak of generate()")
    sync_api.expect(peak).to_contain_text(fmt_bytes(plain.peak_bytes))
    page.locator(".st-key-infer_quant").get_by_role("radio", name="nf4", exact=True).click()
    settle(page)
    no_errors(page)
    sync_api.expect(peak).to_contain_text(fmt_bytes(nf4.peak_bytes))
    assert nf4.peak_bytes < plain.peak_bytes
    sync_api.expect(page.get_by_text("linears nf4").first).to_be_visible()
    assert "infer_quant=nf4" in page.url
    page.screenshot(path=SHOTS / "planner-inference-nf4.png", full_page=True)
