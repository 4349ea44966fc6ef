"""A user's own module: `simulate whatif` (the fit, in child processes) and the "Your module" page that
answers the sliders from it (streamlit.testing.v1.AppTest)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.plan import module_plan
from planner.units import fmt_bytes
from tests.replay import DATA as RECORDED_DIR

ROOT = Path(__file__).resolve().parent.parent
TINY_LM = '''
import torch
from torch import nn

class TinyLM(nn.Module):
    def __init__(self, vocab=101, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        h = self.emb(x)
        att = torch.softmax(h @ h.transpose(1, 2), dim=-1)  # (b, s, s): the s^2 terms
        return self.head(torch.relu(self.mix(att @ h)))

def make_model():
    return TinyLM()
'''
RUN = {"precision": "fp32", "optimizer": "adamw", "optimizer_impl": "default", "grad_accum": 1, "device": "cpu"}


pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "tiny_lm.py"
    path.write_text(TINY_LM)
    return path


def planner(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_simulate_whatif_cli_fits_and_answers_an_unseen_point_exactly(module, tmp_path):
    """Six points simulated in children; the fit's answer at (5, 64) equals a fresh simulation there."""
    out = tmp_path / "fit.json"
    r = planner("simulate", "whatif", "--module", f"{module}:make_model", "--batch-size", "5", "--seq-len", "64",
                "--points", "2x16,2x32,3x16,3x40,4x24,4x48", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["kind"] == "whatif" and rec["fit_file"] == str(out.resolve()) and out.exists()
    s = planner("simulate", "train", "--module", f"{module}:make_model", "--batch-size", "5", "--seq-len", "64",
                "--json")
    sim = json.loads(s.stdout)
    assert rec["peak_bytes"] == sim["peak_bytes"] and rec["peak_phase"] == sim["peak_phase"]
    assert module_plan(json.loads(out.read_text()), 5, 64, 1, 64).peak_bytes == sim["peak_bytes"]


def test_simulate_whatif_invalid_input_is_one_line(module):
    r = planner("simulate", "whatif", "--module", f"{module}:make_model", "--batch-size", "2", "--seq-len", "8",
                "--points", "2x16,nonsense")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--points" in r.stderr
    r = planner("simulate", "whatif", "--module", f"{module}:make_model", "--batch-size", "2", "--seq-len", "8",
                "--points", "2x16,2x32")
    assert r.returncode == 2 and "need at least 5 points" in r.stderr


def page(ref: str | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.switch_page("pages/4_module.py").run()
    if ref is not None:
        at.text_input(key="module_ref").set_value(ref).run()
    return at


def test_page_asks_for_a_module_and_says_what_is_wrong(tmp_path):
    at = page()
    assert not at.exception and "make_model" in at.info[0].value
    at = page(str(tmp_path / "missing.py:make_model"))
    assert not at.exception and "module file not found" in at.error[0].value


def test_page_fits_in_a_child_and_answers_from_the_fit(module, data_dir):
    from planner.module_ref import fit_path

    at = page(f"{module}:make_model")
    assert not at.exception and any("No fit yet" in c.value for c in at.main.caption)
    at.button(key="module_fit").click().run()
    job = at.session_state["module_job"]
    fit_file = fit_path(module, "make_model", RUN)
    assert job.args[:4] == ["simulate", "whatif", "--module", f"{module}:make_model"] and str(fit_file) in job.args
    assert job.args == ["simulate", "whatif", "--module", f"{module}:make_model", "--batch-size", "2", "--precision",
                        "fp32", "--optimizer", "adamw", "--optimizer-impl", "default", "--grad-accum", "1", "--json",
                        "--progress", "--timeout", "900", "--seq-len", "16", "--out", str(fit_file)]
    job.cancel()  # the child is the CLI tested above; the page answers from the fit file it writes (that command's
    fit_file.parent.mkdir(parents=True, exist_ok=True)  # file, recorded: tests/replay.py)
    fit_file.write_text((RECORDED_DIR / "whatif_tiny_lm_fp32.json").read_text())
    at.run()
    assert not at.exception
    at.slider(key="m_batch").set_value(6).run()
    at.slider(key="m_seq").set_value(300).run()
    budget = int(at.number_input(key="m_budget_gib").value * 2**30)
    expected = module_plan(json.loads(fit_file.read_text()), 6, 300, budget, 4096)
    assert next(m.value for m in at.metric if m.label == "Fitted peak") == fmt_bytes(expected.peak_bytes)
    assert next(m.value for m in at.metric if m.label == "Largest batch that fits") == str(expected.max_batch)
    assert next(m.value for m in at.metric if m.label == "Longest sequence at batch 6") == str(expected.max_seq)
    # Another precision is another fit.
    at.selectbox(key="m_precision").set_value("bf16").run()
    assert not at.exception and any("No fit yet" in c.value for c in at.main.caption)
