"""Issue #24: --offload-optimizer (torchao's CPUOffloadOptimizer, planner/estimate/offload.py): the device peak
and the host's bytes as two figures, estimated only; refusals in one line."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.accounting import tensor_inventory
from planner.cli.args import EXIT_INVALID
from planner.config import ConfigError, LlamaConfig
from planner.estimate.training import estimate_training
from planner.fit import advice
from planner.spec import TrainSpec, run_args

ROOT = Path(__file__).resolve().parent.parent
LLAMA = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _pow2(n):
    p = 1
    while p < n:
        p *= 2
    return p


def test_device_loses_the_offloaded_states_and_the_host_holds_them():
    spec = TrainSpec(2, 32, "bf16-amp", "adamw", device="cuda", offload_optimizer=True)
    off = estimate_training(LLAMA, spec)
    # torchao sets fused=True: the run it replaces is the fused AdamW one
    on = estimate_training(LLAMA, dataclasses.replace(spec, offload_optimizer=False, optimizer_impl="fused"))
    sizes = [t.numel for t in tensor_inventory(LLAMA) if t.kind == "param"]
    big = [n for n in sizes if n >= 4096]  # torchao's minimal_size: the norms (64 elements) stay on the device
    assert 0 < len(big) < len(sizes)
    moved = sum(2 * (-(-4 * n // 512) * 512) + 512 for n in big)  # fp32 states and steps in 512-B CUDA blocks
    for phase, value in on.phase_peak_bytes.items():
        assert off.phase_peak_bytes[phase] == value - moved
    assert off.optimizer_bytes == on.optimizer_bytes - sum(8 * n + 4 for n in big)
    host = off.transients["host_optimizer_offload"]
    assert host == sum(2 * _pow2(4 * n) + 8 * n + 4 for n in big)  # pinned copies rounded to powers of two
    assert host not in off.phase_peak_bytes.values() and off.peak_bytes < on.peak_bytes
    assert any("not measured here (needs a GPU)" in n for n in off.notes)
    assert run_args(spec)[-1] == "--offload-optimizer"


def test_advice_offers_it_on_a_gpu_with_its_host_bytes():
    spec = TrainSpec(1, 64, "bf16-amp", "adamw", device="cuda")
    peak = estimate_training(LLAMA, spec).peak_bytes
    opts = [o for o in advice(LLAMA, spec, peak - 1) if o.changes == ["offload-optimizer"]]
    assert len(opts) == 1 and "of host RAM" in opts[0].cost and opts[0].peak_bytes < peak
    assert not [o for o in advice(LLAMA, dataclasses.replace(spec, device="cpu"), peak - 1)
                if "offload-optimizer" in o.changes]


@pytest.mark.parametrize("kw", [dict(optimizer="sgd", device="cuda"), dict(device="cpu"),
                                dict(device="cuda", train_layers="last:1")])
def test_refused_in_one_line(kw):
    with pytest.raises(ConfigError):
        estimate_training(LLAMA, TrainSpec(1, 8, offload_optimizer=True, **kw))


def test_cli():
    base = [sys.executable, "-m", "planner"]
    run = ["--model", "llama-3.2-1b", "--batch-size", "1", "--seq-len", "64", "--offload-optimizer"]
    ok = subprocess.run(base + ["estimate", "train", *run, "--device", "cuda", "--json"], cwd=ROOT,
                        capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["transients"]["host_optimizer_offload"] > 0
    for cmd in (["measure", "train", *run, "--device", "cpu"], ["simulate", "train", *run, "--device", "cuda"],
                ["estimate", "train", *run, "--device", "cpu"]):
        proc = subprocess.run(base + cmd, cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == EXIT_INVALID and len(proc.stderr.strip().splitlines()) == 1, cmd
