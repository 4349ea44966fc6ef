"""Any family by config.json (issue #20): a model_type transformers' AutoModelForCausalLM builds and no family file
reads (OLMo 2, Granite, Phi-2, Cohere, SmolLM3, ...) is simulated and measured as transformers' own model, and
estimated from a fit of simulations kept on disk, every record saying its basis."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.arch import all_families, families, family_of
from planner.arch.auto import causal_lm_model_types
from planner.config import config_from_dict, config_to_dict, load_config
from planner.fitted import depth_plan, is_fitted, layer_period
from planner.spec import TrainSpec
from planner.validation import ConfigError

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "configs"
TINY = ["olmo2-tiny", "granite-tiny", "phi-tiny", "cohere-tiny", "smollm3-tiny"]

pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


def test_model_types_are_transformers_own_list():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert causal_lm_model_types() == tuple(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
    assert {"olmo2", "granite", "phi", "cohere", "smollm3"} <= set(causal_lm_model_types())


@pytest.mark.parametrize("name", TINY)
def test_configs_are_read_as_the_auto_family_and_round_trip(name):
    cfg = load_config(CONFIGS / f"{name}.json")
    assert family_of(cfg).arch == "auto" and is_fitted(cfg) and family_of(cfg).basis == "fitted simulation"
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    assert cfg.layers >= 2 and cfg.hidden == 64 and cfg.vocab_size == 1000
    assert "auto" in all_families() and "auto" not in families()  # the formula families' loops never see it


def test_formula_families_stay_the_fast_path_and_the_rest_is_refused():
    llama = load_config(ROOT / "tests" / "data" / "Llama-3.2-1B.config.json") if (
        ROOT / "tests" / "data" / "Llama-3.2-1B.config.json").exists() else None
    if llama is not None:
        assert family_of(llama).arch == "llama" and not is_fitted(llama)
    with pytest.raises(ConfigError, match="unsupported model_type 't5'.*any causal LM model_type"):
        config_from_dict({"model_type": "t5", "hidden_size": 8})
    with pytest.raises(ConfigError, match="olmo2 config has no positive vocab_size"):
        config_from_dict({"model_type": "olmo2", "hidden_size": 8, "num_hidden_layers": 2})


def test_layer_type_periods():
    smol = load_config(CONFIGS / "smollm3-tiny.json")
    assert layer_period(smol) == 4 and depth_plan(smol) is None  # 8 layers: too shallow to gain
    deep = family_of(smol).with_layers(config_from_dict({**json.loads((CONFIGS / "smollm3-tiny.json").read_text()),
                                                         "num_hidden_layers": 22,
                                                         "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(22)]}),
                                       22)
    assert layer_period(deep) == 4 and depth_plan(deep) == (2, 4)  # 22 = 2 + 5 units of 4
    cut = family_of(deep).with_layers(deep, 10)
    assert cut.layers == 10 and cut.data["no_rope_layers"] == [1, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    olmo = load_config(CONFIGS / "olmo2-tiny.json")
    assert layer_period(olmo) == 1 and depth_plan(family_of(olmo).with_layers(olmo, 32)) == (0, 1)


def test_the_estimate_side_imports_neither_torch_nor_transformers():
    code = ("import sys, json; from planner.config import load_config; from planner.fitted import fitted_record, "
            "is_fitted, cached_fit, depth_plan; import planner.cli.fitted, planner.whatif_depth; "
            f"cfg = load_config({str(CONFIGS / 'olmo2-tiny.json')!r}); assert is_fitted(cfg); depth_plan(cfg); "
            "print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize("name,precision", [(n, p) for i, n in enumerate(TINY)
                                            for p in (("fp32", "bf16-amp") if i % 2 == 0 else ("bf16-amp", "bf16"))])
def test_simulate_equals_measure_for_any_family(name, precision):
    from planner.measure.simulate import simulate_training
    from planner.measure.training import measure_training

    cfg = load_config(CONFIGS / f"{name}.json")
    spec = TrainSpec(2, 24, precision, "adamw")
    meas, sim = measure_training(cfg, spec), simulate_training(cfg, spec)
    assert sim["peak_bytes"] == meas["peak_bytes"] and sim["phase_peak_bytes"] == meas["phase_peak_bytes"]
    assert sim["param_count"] > 0


def planner(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_olmo2_fitted_estimate_equals_measure_and_says_so():
    """The issue's test: OLMo 2 (tiny): the fitted estimate within 1% of measure (it is exact), simulate == measure;
    the first estimate makes the fit (progress per point), the second reads it; measure then carries its answer."""
    path = str(CONFIGS / "olmo2-tiny.json")
    run = ["--batch-size", "3", "--seq-len", "40", "--precision", "bf16-amp"]
    e = planner("estimate", "train", "--config", path, *run, "--json", "--progress")
    assert e.returncode == 0, e.stderr
    lines = [json.loads(line) for line in e.stdout.splitlines()]
    assert [x["event"] for x in lines[:-1]] == ["progress"] * (len(lines) - 1) and len(lines) > 10
    est = lines[-1]
    assert est["basis"] == "fitted simulation" and est["status"] == "exact" and not est["fit_cached"]
    assert est["fit"]["validation"]["exact"] and est["fit_info"]["simulations"] == 15
    m = planner("measure", "train", "--config", path, *run, "--device", "cpu", "--json")
    assert m.returncode == 0, m.stderr
    meas = json.loads(m.stdout)
    assert abs(est["peak_bytes"] - meas["peak_bytes"]) <= 0.01 * meas["peak_bytes"]
    assert est["peak_bytes"] == meas["peak_bytes"]
    assert meas["estimate"]["basis"] == "fitted simulation" and meas["error_pct"] == 0
    again = json.loads(planner("estimate", "train", "--config", path, "--batch-size", "9", "--seq-len", "300",
                               "--precision", "bf16-amp", "--json").stdout)
    assert again["fit_cached"] and again["fit_file"] == est["fit_file"]
    # a formula family's record says its basis too
    f = json.loads(planner("estimate", "train", "--model", "llama-3.2-1b", "--batch-size", "1", "--seq-len", "8",
                           "--json").stdout)
    assert f["basis"] == "formula"


def test_depth_extrapolation_is_exact_at_full_depth():
    """A 7-layer OLMo 2 fitted from 2, 3 and 4 layers at full width: every op of the full-depth step at a held-out
    point, and the peak at a point outside the fitted range, to the byte."""
    from planner.measure.simulate import simulate_training
    from planner.whatif_depth import UNITS, DepthWhatIf

    base = load_config(CONFIGS / "olmo2-tiny.json")
    fam = family_of(base)
    cfg = fam.with_layers(base, 7)
    points = [(2, 16), (2, 40), (3, 16), (3, 32), (5, 24)]
    traces = {m: {(b, s): simulate_training(fam.with_layers(cfg, m), TrainSpec(b, s), trace=True)["trace"]
                  for b, s in points} for m in UNITS}
    held = {(6, 48): simulate_training(cfg, TrainSpec(6, 48), trace=True)["trace"]}
    what = DepthWhatIf.fit(traces, 7, 0, 1, held)
    assert what.status == "exact" and what.validation.max_op_error_bytes <= 0.5, what.describe()
    sim = simulate_training(cfg, TrainSpec(9, 100))
    assert what.peak_bytes(9, 100) == sim["peak_bytes"]
    phases = what.phase_peak_bytes(9, 100)  # the phases that run ops (zero_grad(set_to_none) runs none)
    assert phases and phases == {k: sim["phase_peak_bytes"][k] for k in phases}
    again = DepthWhatIf.from_dict(json.loads(json.dumps(what.save_dict())))
    assert again.peak_bytes(9, 100) == sim["peak_bytes"] and again.status == "exact"


def test_depth_structure_refuses_blocks_that_are_not_alike():
    from planner.whatif import MisalignedError
    from planner.whatif_depth import Structure

    def trace(ops):
        return {"ops": ops, "phases": ["forward"] * len(ops), "bytes": list(np.arange(len(ops)) * 8)}

    ok = Structure.find(trace(["e", "a", "b", "h"]), trace(["e", "a", "b", "a", "b", "h"]),
                        trace(["e", "a", "b", "a", "b", "a", "b", "h"]))
    assert ok.names(5) == [(o, "forward") for o in ["e"] + ["a", "b"] * 4 + ["h"]]
    with pytest.raises(MisalignedError, match="not alike"):
        Structure.find(trace(["e", "a", "h"]), trace(["e", "a", "b", "h"]), trace(["e", "a", "b", "c", "h"]))
