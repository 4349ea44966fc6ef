"""Your own module, measured (issue #20): `measure train --module`, `estimate train --module` (from the what-if fit),
models without a sequence (--input-shape, one-argument make_batch), and simulate == measure to the byte over a
grid of user modules (examples/), with the fake kernels corrected where they differed from the CPU's."""
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.modules import EXAMPLES, module_grid, run_row
from planner.module_ref import has_sequence, make_batch_arity, parse_input_shape
from planner.validation import ConfigError

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("data_dir")  # tests/conftest.py: the data folders in tmp_path


@pytest.mark.parametrize("label,module,spec", module_grid(quick=True), ids=[r[0] for r in module_grid(quick=True)])
def test_user_modules_simulate_equals_measure_to_the_byte(label, module, spec):
    """CNN with BatchNorm, a ViT-like patch model, a tabular MLP and a text model, fp32 and bf16 autocast: the
    peak and every phase's peak, simulated and measured, are the same number."""
    r = run_row(module, spec, in_process=True)
    assert r["diff_bytes"] == 0 and r["measured_bytes"] > 0, r
    assert set(r["phase_diff_bytes"].values()) == {0}, r
    assert r["peak_phase"] == r["sim_peak_phase"]


def _log_ops(run):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.rec = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if "norm" in str(func):
                outs = out if isinstance(out, (tuple, list)) else [out]
                self.rec.append((str(func), [(tuple(o.shape), o.dtype) for o in outs if isinstance(o, torch.Tensor)]))
            return out

    log = Log()
    with log:
        run()
    return log.rec


@pytest.mark.parametrize("norm,train", itertools.product(["batch", "group", "layer", "instance"], [True, False]))
def test_fake_normalisation_kernels_return_the_cpu_kernels_dtypes(norm, train):
    """A bf16 input into fp32 norm parameters (what autocast makes after a conv or a linear): the CPU kernels keep
    their statistics in fp32; the fake kernels, under CpuKernelDtypes, now say the same (shapes and dtypes of every
    output of the norm ops, forward and backward)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from planner.measure.cpu_kernels import CpuKernelDtypes

    make = {"batch": lambda: torch.nn.BatchNorm2d(4), "group": lambda: torch.nn.GroupNorm(2, 4),
            "layer": lambda: torch.nn.LayerNorm([6]), "instance": lambda: torch.nn.InstanceNorm2d(4, affine=True)}[norm]

    def run():
        m = make().train(train)
        x = torch.randn(2, 4, 6, 6, dtype=torch.bfloat16, requires_grad=True)
        m(x).float().sum().backward()

    real = _log_ops(run)
    with FakeTensorMode(allow_non_fake_inputs=True), CpuKernelDtypes():
        fake = _log_ops(run)
    assert fake == real and real


def test_deep_copied_fake_modules_are_counted_once():
    """nn.TransformerEncoder deep-copies its layer: the copies' fake tensors got a fake mode of their own, and each
    view of a copied weight was counted as new memory. adopt_fake_tensors gives them the simulation's mode back."""
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode

    from planner.measure.simulate import adopt_fake_tensors

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        lin = copy.deepcopy(torch.nn.Linear(4, 4))
        assert lin.weight.untyped_storage() is not lin.weight.t().untyped_storage()
        assert adopt_fake_tensors(lin, mode) == 2
        assert lin.weight.untyped_storage() is lin.weight.t().untyped_storage()


def test_module_sequence_axis_is_read_without_running_the_file(tmp_path):
    assert make_batch_arity(EXAMPLES / "vit.py") == 1 and make_batch_arity(EXAMPLES / "cnn.py") is None
    assert not has_sequence(EXAMPLES / "vit.py", None) and has_sequence(EXAMPLES / "text_lm.py", None)
    assert not has_sequence(EXAMPLES / "cnn.py", (3, 32, 32))
    assert parse_input_shape("3x224x224") == (3, 224, 224) and parse_input_shape(None) is None
    for bad in ("3xtwo", "0x4"):
        with pytest.raises(ConfigError):
            parse_input_shape(bad)


def planner(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_measure_and_estimate_a_cnn_by_input_shape():
    """measure train --module runs the real step (after simulating the point: its estimate block); estimate train
    --module answers from the what-if fit, made once and kept: all three are the same number."""
    cnn = f"{EXAMPLES / 'cnn.py'}:make_model"
    m = planner("measure", "train", "--module", cnn, "--input-shape", "3x32x32", "--batch-size", "6",
                "--precision", "bf16-amp", "--device", "cpu", "--json")
    assert m.returncode == 0, m.stderr
    meas = json.loads(m.stdout)
    assert meas["kind"] == "measure" and meas["estimate"]["basis"] == "simulation"
    assert meas["estimate"]["peak_bytes"] == meas["peak_bytes"] and meas["error_pct"] == 0
    e = planner("estimate", "train", "--module", cnn, "--input-shape", "3x32x32", "--batch-size", "6",
                "--precision", "bf16-amp", "--json")
    assert e.returncode == 0, e.stderr
    est = json.loads(e.stdout)
    assert est["basis"] == "fitted simulation" and est["status"] == "exact" and est["bound_bytes"] == 0
    assert est["peak_bytes"] == meas["peak_bytes"] and est["sequence"] is False and not est["fit_cached"]
    again = json.loads(planner("estimate", "train", "--module", cnn, "--input-shape", "3x32x32", "--batch-size", "40",
                               "--precision", "bf16-amp", "--json").stdout)
    assert again["fit_cached"] and again["fit_file"] == est["fit_file"] and again["peak_bytes"] > est["peak_bytes"]


@pytest.mark.parametrize("args,message", [
    (["--module", "{ex}/text_lm.py:make_model", "--batch-size", "2"], "--seq-len is required"),
    (["--module", "{ex}/vit.py:make_model", "--batch-size", "2", "--input-shape", "3x32x32"], "replaces make_batch"),
    (["--model", "gpt2-small", "--batch-size", "2"], "required: --seq-len"),
    (["--module", "{ex}/cnn.py:make_model", "--batch-size", "2", "--input-shape", "3xx"], "--input-shape must be"),
])
def test_module_run_errors_are_one_line(args, message):
    r = planner("measure", "train", *[a.format(ex=EXAMPLES) for a in args], "--device", "cpu")
    assert r.returncode == 2 and message in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
