"""The README's screenshot of the Planner page: `python tests/e2e/readme_shot.py [--out docs/img/planner.png]`.

Starts the app on a free port (as tests/e2e/bench_page.py does), opens the README's first question in Debian's
chromium (will Llama-3.1-8B fine-tune on a 24 GB RTX 4090 at 2,048 tokens, LoRA / QLoRA allowed; the settings
beneath left at the page's start) and keeps the page's first screen: the question and the plan search's answer
(fits, its peak against the GPU, tokens/s by the roofline, what it changes from the settings, Apply). A tool,
not a test: it writes a file.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.bench_page import CHROMIUM, IDLE, start_server  # noqa: E402

# Every setting is in the URL (app.py binds each widget to its query parameter)
QUESTION = "model=llama-3.1-8b&gpu=rtx-4090&gpus=1&task=finetune&allow=true&seq=2048"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "planner.png"))
    ap.add_argument("--full", help="also write the whole page here")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp))
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"])
                # tall enough that the page does not scroll (Streamlit scrolls its main area, not the window), so
                # the boxes below are in the screenshot's coordinates
                page = browser.new_page(viewport={"width": 1400, "height": 4000})
                page.set_default_timeout(120_000)
                page.goto(f"{url}/?{QUESTION}")
                page.get_by_role("heading", name="Planner: will it fit?").wait_for()
                page.wait_for_selector(IDLE)
                page.wait_for_selector("[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg")
                page.wait_for_timeout(1500)
                if page.locator("[data-testid='stException'], [data-testid='stAlertContentError']").count():
                    raise SystemExit("the page shows an error")
                # From the title to the end of the plan's box (the settings beneath start with their heading)
                top = page.get_by_role("heading", name="Planner: will it fit?").bounding_box()["y"] - 16
                bottom = page.get_by_role("heading", name="Adjust the settings").bounding_box()["y"] - 8
                main_box = page.get_by_test_id("stMain").bounding_box()
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=args.out, clip={"x": main_box["x"], "y": top, "width": main_box["width"],
                                                     "height": bottom - top})
                if args.full:
                    page.screenshot(path=args.full)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(10)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
