"""Issue #24: checkpointing policies every:K and selective (planner/checkpointing.py): the real step measured and
simulated (to the byte), between no checkpointing and full; `--checkpointing` alone unchanged; refusals."""
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli_args import EXIT_INVALID
from planner.config import LlamaConfig, ConfigError
from planner.measure.simulate import simulate_training
from planner.measure.training import measure_training
from planner.spec import TrainSpec, run_args

ROOT = Path(__file__).resolve().parent.parent
LLAMA = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)


def test_policies_sit_between_none_and_full_and_simulate_equals_measure():
    peaks = {}
    for name, kw in {"none": {}, "full": {"checkpointing": True},
                     "every:2": {"checkpointing": True, "checkpoint_policy": "every:2"},
                     "selective": {"checkpointing": True, "checkpoint_policy": "selective"}}.items():
        spec = TrainSpec(2, 32, "bf16-amp", "sgd", **kw)
        meas = measure_training(LLAMA, spec)
        if name in ("every:2", "selective"):  # the new policies on fake tensors: the same step
            assert simulate_training(LLAMA, spec)["peak_bytes"] == meas["peak_bytes"], name
        peaks[name] = meas["phase_peak_bytes"]
    for phase in ("forward", "loss", "backward"):
        assert peaks["full"][phase] < peaks["every:2"][phase] < peaks["none"][phase], phase
        # torchtitan's policy keeps the matmul outputs and SDPA's: more than full, less than none
        assert peaks["full"][phase] < peaks["selective"][phase] < peaks["none"][phase], phase
    # half the blocks keep their saved set: every:2's forward saves about half of none's over full's
    gap = peaks["none"]["forward"] - peaks["full"]["forward"]
    assert abs((peaks["every:2"]["forward"] - peaks["full"]["forward"]) - gap / 2) < 0.1 * gap


def test_spec_and_run_args():
    assert run_args(TrainSpec(1, 8, checkpointing=True))[-1] == "--checkpointing"  # unchanged for full
    args = run_args(TrainSpec(1, 8, checkpointing=True, checkpoint_policy="every:3"))
    assert args[args.index("--checkpointing") + 1] == "every:3"
    with pytest.raises(ConfigError):
        TrainSpec(1, 8, checkpoint_policy="every:2")  # a policy without checkpointing
    with pytest.raises(ConfigError):
        TrainSpec(1, 8, checkpointing=True, checkpoint_policy="every:0")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True)


def test_cli_checkpointing_flag():
    import json

    plain = _cli("estimate", "train", "--model", "gpt2-small", "--batch-size", "1", "--seq-len", "64",
                 "--checkpointing", "--json")
    assert plain.returncode == 0 and json.loads(plain.stdout)["run"]["checkpointing"] is True
    assert json.loads(plain.stdout)["run"]["checkpoint_policy"] == "full"
    for policy, needle in (("selective", "not estimated yet"), ("every:x", "unknown checkpointing policy")):
        proc = _cli("estimate", "train", "--model", "gpt2-small", "--batch-size", "1", "--seq-len", "64",
                    "--checkpointing", policy)
        assert proc.returncode == EXIT_INVALID and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
