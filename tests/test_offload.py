"""Issue #24: --offload-optimizer (torchao's CPUOffloadOptimizer, planner/estimate/offload.py): the device peak
and the host's bytes as two figures; on CUDA estimated, on the CPU measured with a plain-torch equivalent
(planner/routines/offload_optim.py); refusals in one line."""
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
    assert any("not measured on a GPU yet" in n and "allocated_bytes.peak" in n for n in off.notes)
    assert run_args(spec)[-1] == "--offload-optimizer"


def test_advice_offers_it_on_a_gpu_with_its_host_bytes():
    spec = TrainSpec(1, 64, "bf16-amp", "adamw", device="cuda")
    peak = estimate_training(LLAMA, spec).peak_bytes
    opts = [o for o in advice(LLAMA, spec, peak - 1) if o.changes == ["offload-optimizer"]]
    assert len(opts) == 1 and "of host RAM" in opts[0].cost and opts[0].peak_bytes < peak
    assert not [o for o in advice(LLAMA, dataclasses.replace(spec, device="cpu"), peak - 1)
                if "offload-optimizer" in o.changes]


@pytest.mark.parametrize("kw", [dict(optimizer="sgd", device="cuda"), dict(device="cpu", precision="fp16-amp"),
                                dict(device="cuda", train_layers="last:1"), dict(device="cpu", train_layers="last:1")])
def test_refused_in_one_line(kw):
    with pytest.raises(ConfigError):
        estimate_training(LLAMA, TrainSpec(1, 8, offload_optimizer=True, **kw))


def test_cli():
    base = [sys.executable, "-m", "planner"]
    run = ["--model", "llama-3.2-1b", "--batch-size", "1", "--seq-len", "64", "--offload-optimizer"]
    ok = subprocess.run(base + ["estimate", "train", *run, "--device", "cuda", "--json"], cwd=ROOT,
                        capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["transients"]["host_optimizer_offload"] > 0
    cpu = subprocess.run(base + ["estimate", "train", *run, "--device", "cpu"], cwd=ROOT, capture_output=True,
                         text=True)  # the CPU mechanism's figures (no pinning, no 512 B blocks)
    assert cpu.returncode == 0 and "host (offloaded optimizer)" in cpu.stdout, cpu.stderr
    for cmd in (["measure", "train", *run, "--device", "cuda", "--optimizer", "sgd"],
                ["estimate", "train", *run, "--device", "cpu", "--precision", "fp16-amp"]):
        proc = subprocess.run(base + cmd, cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == EXIT_INVALID and len(proc.stderr.strip().splitlines()) == 1, cmd


def test_cpu_estimate_has_no_cuda_terms():
    spec = TrainSpec(2, 32, "bf16-amp", "adamw", offload_optimizer=True)
    off = estimate_training(LLAMA, spec)
    on = estimate_training(LLAMA, dataclasses.replace(spec, offload_optimizer=False, optimizer_impl="fused"))
    big = [t.numel for t in tensor_inventory(LLAMA) if t.kind == "param" and t.numel >= 4096]
    states = sum(8 * n + 4 for n in big)  # fp32 exp_avg, exp_avg_sq and the 0-d fp32 step, unrounded
    assert all(off.phase_peak_bytes[k] == v - states for k, v in on.phase_peak_bytes.items())
    assert off.transients["host_optimizer_offload"] == sum(4 * n for n in big) * 2 + states  # unpinned copies
    assert not any("on a GPU" in n for n in off.notes)


def test_the_equivalent_steps_as_adamw_and_keeps_small_params_on_the_device():
    """The plain-torch CPUOffloadOptimizer gives the weights a fused AdamW gives, with its copies on the host."""
    import torch

    from planner.routines.offload_optim import HostOffloadAdamW

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 3))
    off = __import__("copy").deepcopy(ref)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, fused=True)
    opt_off = HostOffloadAdamW(list(off.parameters()), lr=1e-2)
    x = torch.randn(5, 96)
    for _ in range(3):
        for model, opt in ((ref, opt_ref), (off, opt_off)):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(ref.parameters(), off.parameters()):
        assert torch.equal(a, b)
    big = [p for p in off.parameters() if p.numel() >= 4096]  # only the first Linear's weight (96 x 64)
    assert [id(p) for p in opt_off.param_d2h_map] == [id(p) for p in big] and len(big) == 1
    assert len(opt_off.d_opt.param_groups[0]["params"]) == 5  # two biases, the norm's two, the 64 x 3 weight
    hosts = {t.untyped_storage().data_ptr() for t in opt_off.host_tensors()}
    assert not hosts & {p.untyped_storage().data_ptr() for p in off.parameters()}
    assert sum(t.nbytes for t in opt_off.host_tensors()) == 4 * 96 * 64 * 4 + 4  # copy, grad, 2 states, step


@pytest.mark.parametrize("prec,ckpt", [("fp32", False), ("bf16-amp", True)])
def test_cpu_mechanism_measured_simulated_estimated(prec, ckpt):
    from planner.measure.simulate import simulate_training
    from planner.measure.training import measure_training

    spec = TrainSpec(2, 32, prec, "adamw", checkpointing=ckpt, offload_optimizer=True)
    meas = measure_training(LLAMA, spec)
    plain = measure_training(LLAMA, TrainSpec(2, 32, prec, "adamw", checkpointing=ckpt, optimizer_impl="fused"))
    sim = simulate_training(LLAMA, spec)
    est = estimate_training(LLAMA, spec)
    assert "CUDA check" in meas["device_figure_note"] and "host_optimizer_offload_bytes" not in plain
    # the optimizer phase loses exactly the offloaded states; they (and the copies) are the host's
    big = [t.numel for t in tensor_inventory(LLAMA) if t.kind == "param" and t.numel >= 4096]
    assert plain["phase_peak_bytes"]["optimizer"] - meas["phase_peak_bytes"]["optimizer"] == sum(8 * n + 4 for n in big)
    assert meas["host_optimizer_offload_bytes"] == sum(16 * n + 4 for n in big)
    assert sim["peak_bytes"] == meas["peak_bytes"]
    assert sim["host_optimizer_offload_bytes"] == meas["host_optimizer_offload_bytes"]
    assert abs(est.peak_bytes / meas["peak_bytes"] - 1) < 0.01
    assert est.transients["host_optimizer_offload"] == meas["host_optimizer_offload_bytes"]


# Measured rows of `bench offload` (docs/accuracy.md "# Optimizer offloading", torch 2.13.0+cpu, transformers 5.23.0):
# (grid label, precision, checkpointing, measured device peak, measured host bytes)
MEASURED = [("llama V300 h48 a6 kv2 f96 L2", "fp32", False, 1_060_508, 903_200),
            ("gemma2 V1000 h64 a4 kv2 untied", "bf16-amp", True, 3_114_176, 3_817_536),
            ("gpt2-hf V1000 h64 a4 p0.1", "fp32", True, 2_901_584, 2_727_976),
            ("gpt2 (book) V1000 h64 a4", "bf16-amp", False, 4_406_376, 3_686_460)]


@pytest.mark.parametrize("label,prec,ckpt,peak,host", MEASURED)
def test_cpu_estimate_holds_the_measured_rows(label, prec, ckpt, peak, host):
    from bench.offload_opt import grid

    (cfg, b, s), = [(c, b, s) for name, c, b, s in grid() if name == label]
    est = estimate_training(cfg, TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_optimizer=True))
    assert abs(est.peak_bytes / peak - 1) < 0.01
    assert est.transients["host_optimizer_offload"] == host


def test_measure_runs_it_on_cuda_as_torchao_with_pinned_copies():
    """measure / simulate do not refuse --offload-optimizer on cuda (the routine pins its host copies there, as
    torchao); what the estimate refuses stays refused, in one line."""
    from planner.estimate.offload import refuse_run

    refuse_run(TrainSpec(2, 32, "bf16-amp", "adamw", device="cuda", offload_optimizer=True))
    with pytest.raises(ConfigError):
        refuse_run(TrainSpec(2, 32, "bf16-amp", "sgd", device="cuda", offload_optimizer=True))
