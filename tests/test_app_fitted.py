"""The Planner page with a model no formula family reads (issue #20): a pasted OLMo 2 config.json is accepted,
fitted by simulation in a child (a background job), and every figure is labelled as a fitted simulation, with the
fit's held-out check (streamlit.testing.v1.AppTest)."""
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.config import load_config
from planner.fit import tensor_budget
from planner.fitted import fit_file, make_fit
from planner.plan import module_plan
from planner.spec import TrainSpec
from planner.units import fmt_bytes

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
    job.cancel()  # the child is `estimate train`, tested in tests/test_auto_family.py; here its fit is made in-process
    cfg, spec = load_config(OLMO2), TrainSpec(4, 512)
    what, info = make_fit(cfg, spec, simulate_in_process=True)
    path = fit_file(cfg, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fit": what.save_dict(), "info": info}))
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
