"""Tensor parallel and FSDP2 + TP in the app (issue #23): the layouts give the per-rank estimate of the settings
shown, and the fewest-devices solver (planner.fit.choose_layout, TP degrees from planner.parallel_solver) picks among DDP / FSDP / FSDP + TP."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.config import PRESETS
from planner.estimate.distributed import estimate_distributed
from planner.fit import tensor_budget
from planner.parallel import ParallelSpec
from planner.fit import choose_layout
from planner.spec import TrainSpec, prepare
from planner.units import fmt_bytes
from tests.test_app import metric, shown

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


def test_fsdp_tp_layout_and_the_solver_on_the_page():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.selectbox(key="preset").set_value("llama-3-8b").run()
    at.selectbox(key="parallel").set_value("fsdp+tp").run()
    at.number_input(key="world").set_value(8).run()
    at.number_input(key="tp").set_value(4).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    spec, attention = shown(at)
    cfg = prepare(PRESETS["llama-3-8b"], spec, attention)
    pspec = ParallelSpec(8, "fsdp+tp", tp=4)
    est = estimate_distributed(cfg, spec, pspec)
    assert metric(at, "Estimated peak per rank") == fmt_bytes(est.peak_bytes)
    assert any("fsdp x2 + tp x4" in c.value for c in at.caption)
    assert at.session_state["run_settings"]["parallel"]["tp"] == 4
    usable = tensor_budget(int(at.number_input(key="budget_gib").value * 2**30), spec.device)
    choice = choose_layout(cfg, spec, usable, pspec)
    best = choice["best"]
    assert str(metric(at, "Layout with the fewest devices")) == (f"{best['layout']} x{best['devices']}" if best else "none")
    # TP alone on every rank: the per-rank figure of that layout.
    at.selectbox(key="parallel").set_value("tp").run()
    at.number_input(key="world").set_value(2).run()
    assert not at.exception and not at.error
    assert metric(at, "Estimated peak per rank") == fmt_bytes(estimate_distributed(cfg, spec, ParallelSpec(2, "tp")).peak_bytes)


def test_the_solver_takes_tp_where_fsdp_alone_cannot_fit():
    """llama-3-8b, batch 1 x 4096 in bf16-AMP with checkpointing on 24 GiB devices: FSDP alone never fits (the
    activations and the gathered blocks are not sharded), FSDP2 x TP does; on 80 GiB FSDP on 2 devices wins."""
    cfg, spec = PRESETS["llama-3-8b"], TrainSpec(1, 4096, "bf16-amp", "adamw", checkpointing=True)
    small = choose_layout(cfg, spec, 24 * 2**30)
    by = {c["layout"]: c for c in small["candidates"]}
    assert by["ddp"]["devices"] == 0 and by["fsdp"]["devices"] == 0
    assert small["best"]["parallel"] == "fsdp+tp"
    n, tp = small["best"]["devices"], small["best"]["tp"]
    assert estimate_distributed(cfg, spec, ParallelSpec(n, "fsdp+tp", tp=tp)).peak_bytes <= 24 * 2**30
    assert all(c["devices"] == 0 or c["devices"] >= n for c in small["candidates"])
    big = choose_layout(cfg, spec, 80 * 2**30)
    assert big["best"]["layout"] == "fsdp" and big["best"]["devices"] == 2


def test_sequence_parallel_toggle_on_the_tp_layout():
    """The Sequence parallel toggle: offered with tp only (planner.parallel.sequence_parallel_applies), and on it the
    page shows the per-rank estimate of torchtitan's SequenceParallel plan, below plain TP's in forward."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.selectbox(key="preset").set_value("llama-3-8b").run()
    at.selectbox(key="parallel").set_value("fsdp+tp").run()
    assert at.toggle(key="sequence_parallel").disabled
    at.selectbox(key="parallel").set_value("tp").run()
    at.number_input(key="world").set_value(8).run()
    assert not at.toggle(key="sequence_parallel").disabled
    at.toggle(key="sequence_parallel").set_value(True).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    spec, attention = shown(at)
    cfg = prepare(PRESETS["llama-3-8b"], spec, attention)
    est = estimate_distributed(cfg, spec, ParallelSpec(8, "tp", sequence_parallel=True))
    plain = estimate_distributed(cfg, spec, ParallelSpec(8, "tp"))
    assert metric(at, "Estimated peak per rank") == fmt_bytes(est.peak_bytes)
    assert est.phase_peak_bytes["forward"] < plain.phase_peak_bytes["forward"]
    assert at.session_state["run_settings"]["parallel"]["sequence_parallel"] is True
    assert any("seq-parallel" in c.value for c in at.caption)
