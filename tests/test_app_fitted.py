"""The Planner page with a model no formula family reads (issue #20): a pasted OLMo 2 config.json is accepted,
fitted by simulation in a child (a background job), and every figure is labelled as a fitted simulation, with the
fit's held-out check (streamlit.testing.v1.AppTest)."""
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.config import load_config
from planner.fit import tensor_budget
from planner.fitted import fit_file, load_fit
from planner.plan import module_plan
from planner.spec import TrainSpec
from planner.units import fmt_bytes
from tests.replay import DATA as RECORDED_DIR

ROOT = Path(__file__).resolve().parent.parent
OLMO2 = ROOT / "tests" / "data" / "configs" / "olmo2-tiny.json"

pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


def pasted() -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.radio(key="source").set_value("Paste a config").run()
    at.text_area(key="config_text").set_value(OLMO2.read_text()).run()
    return at


def test_pasted_olmo2_is_fitted_in_a_child_and_labelled_fitted():
    at = pasted()
    assert not at.exception and not at.error
    assert any("parameters counted by the simulation" in c.value for c in at.sidebar.caption)
    assert "fitted simulation" in at.info[0].value
    at.button(key="fit_start").click().run()
    job = at.session_state["fit_job"]
    assert job.args[:2] == ["estimate", "train"] and "--progress" in job.args and job.config["arch"] == "auto"
    assert job.args == ["estimate", "train", "--batch-size", "4", "--seq-len", "512", "--precision", "fp32",
                        "--optimizer", "adamw", "--grad-accum", "1", "--optimizer-impl", "default", "--device", "cpu",
                        "--loss", "default", "--attention", "sdpa", "--json", "--progress", "--timeout", "600"]
    job.cancel()  # the child is `estimate train`, tested in tests/test_auto_family.py; here the fit file that this
    cfg, spec = load_config(OLMO2), TrainSpec(4, 512)  # command wrote is put where it writes it (tests/replay.py)
    path = fit_file(cfg, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((RECORDED_DIR / "fit_olmo2_tiny_b4_s512.json").read_text())
    what = load_fit(json.loads(path.read_text())["fit"])
    at.run()
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    budget = tensor_budget(int(at.number_input(key="budget_gib").value * 2**30), "cpu")
    expected = module_plan(what, 4, 512, budget, cfg.max_seq_len)
    assert metrics["Estimated peak (fitted simulation)"] == fmt_bytes(expected.peak_bytes)
    assert metrics["Fit check"] == "exact"
    assert metrics["Largest batch that fits"] == str(expected.max_batch)
    assert any(c.value.startswith("Basis\\: fitted simulation") for c in at.main.caption)
    at.slider(key="batch").set_value(7).run()
    assert next(m.value for m in at.metric if m.label.startswith("Estimated peak")) == fmt_bytes(what.peak_bytes(7, 512))
