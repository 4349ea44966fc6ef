"""Per-rank memory of DDP and FSDP2 (issue #13): estimate vs real gloo ranks vs fake-tensor simulation,
the N-rank launcher's failure handling, and the invalid inputs."""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from planner.config import ConfigError, GPT2Config, LlamaConfig, config_to_dict
from planner.estimate.distributed import (deepspeed_bytes, estimate_distributed, padded_shard_numel, param_order,
                                          rank_runs, zero_paper_bytes)
from planner.parallel import ParallelSpec
from planner.spec import TrainSpec

ROOT = Path(__file__).resolve().parent.parent
# vocab 97 and ctx 50 are not multiples of 2 or 4: padded shards, and a last rank with fewer rows.
GPT = GPT2Config(vocab_size=97, context_length=50, emb_dim=32, n_heads=2, n_layers=2, drop_rate=0.1)
LLAMA = LlamaConfig(vocab_size=301, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                    num_key_value_heads=2, max_position_embeddings=64)
TIED = LlamaConfig(vocab_size=2000, hidden_size=64, intermediate_size=172, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=1, max_position_embeddings=64, attention="eager", tie_word_embeddings=True)
WIDE = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=8, max_position_embeddings=2048)
BAR_PCT = 2.0


def planner(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _config_file(tmp_path, cfg) -> str:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    return str(path)


# ------------------------------------------------------------------ arithmetic (no torch)

def test_zero_paper_figure_1():
    """The paper's Figure 1: 7.5B parameters on 64 devices, 120 / 31.4 / 16.6 / 1.9 GB."""
    z = zero_paper_bytes(7_500_000_000, 64)
    assert [round(z[k] / 1e9, 1) for k in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")] == [120.0, 31.4, 16.6, 1.9]
    ds = deepspeed_bytes(10**9, 10**8, 8, cpu_offload=False)
    assert ds == {"ZeRO-2": 2 * 10**9 + 18 * 10**9 // 8, "ZeRO-3": 4 * 10**8 + 18 * 10**9 // 8}


def test_padded_shards_and_rank_runs():
    params = list(param_order(GPT))
    # ctx 50 on 4 ranks: 13 rows each, the last rank 11; vocab 97: 25 rows, the last 22.
    assert padded_shard_numel([p for p in params if p.name == "pos_emb.weight"], 4) == 13 * 32
    runs = rank_runs(params, 4)
    assert runs[0][0] == 0 and runs[-1][1] == 3 and len(runs) >= 2
    est = estimate_distributed(GPT, TrainSpec(2, 16), ParallelSpec(4, "fsdp"))
    first, last = est.rank_groups[0], est.rank_groups[-1]
    assert last["optimizer_bytes"] < first["optimizer_bytes"]  # fewer local rows on the last rank
    assert est.params_bytes == 4 * padded_shard_numel(params, 4)  # the padded shard on every rank


def test_estimate_shapes_and_trends():
    spec = TrainSpec(1, 2048, "bf16", "adamw", checkpointing=True)
    from planner.config import PRESETS

    cfg = PRESETS["llama-3-8b"]
    one = estimate_distributed(cfg, spec, ParallelSpec(8, "fsdp"))
    many = estimate_distributed(cfg, spec, ParallelSpec(64, "fsdp"))
    keep = estimate_distributed(cfg, spec, ParallelSpec(8, "fsdp", reshard_after_forward=False))
    ddp = estimate_distributed(cfg, spec, ParallelSpec(8, "ddp"))
    assert many.peak_bytes < one.peak_bytes < keep.peak_bytes < ddp.peak_bytes
    assert ddp.peak_bytes - ddp.single_device["peak_bytes"] == ddp.comm_buffers_bytes == 2 * 8_030_261_248
    assert one.reference["closest"] == "ZeRO-3" and keep.reference["closest"] == "ZeRO-2"
    off = estimate_distributed(cfg, spec, ParallelSpec(8, "fsdp", cpu_offload=True))
    assert off.host_bytes >= off.params_bytes + off.grads_bytes + off.optimizer_bytes
    assert all({"name", "formula", "bytes"} <= set(t) for t in one.terms)


@pytest.mark.parametrize("pspec, spec, message", [
    (dict(world_size=0), TrainSpec(1, 8), "at least 1"),
    (dict(world_size=1, parallel="fsdp"), TrainSpec(1, 8), "at least 2"),
    (dict(world_size=2, parallel="ddp", cpu_offload=True), TrainSpec(1, 8), "only applies to --parallel fsdp"),
    (dict(world_size=2, parallel="fsdp", mp_param_dtype="bfloat16"), TrainSpec(1, 8, "bf16-amp"), "--precision fp32"),
    (dict(world_size=2, parallel="fsdp"), TrainSpec(1, 8, grad_accum=2), "gradient accumulation"),
])
def test_invalid_parallel_specs(pspec, spec, message):
    with pytest.raises(ConfigError, match=message):
        estimate_distributed(GPT, spec, ParallelSpec(**pspec))


def test_model_without_blocks_is_refused(monkeypatch):
    import planner.parallel

    monkeypatch.setattr(planner.parallel, "block_prefixes", lambda cfg: [])
    with pytest.raises(ConfigError, match="no repeated blocks"):
        estimate_distributed(GPT, TrainSpec(1, 8), ParallelSpec(2, "fsdp"))
    estimate_distributed(GPT, TrainSpec(1, 8), ParallelSpec(2, "ddp"))  # DDP wraps the whole model


def test_unwrappable_model_is_refused():
    import torch

    from planner.measure.distributed import WrapError, wrap_model

    with pytest.raises(WrapError, match="no repeated blocks"):
        wrap_model(torch.nn.Linear(4, 4), ParallelSpec(2, "fsdp"), torch.device("cpu"),
                   mesh=object())


# ------------------------------------------------------------------ simulation (fake tensors, in process)

@pytest.mark.parametrize("cfg, spec, pspec", [
    (GPT, TrainSpec(2, 16, "fp32", "adamw"), ParallelSpec(4, "fsdp")),
    (LLAMA, TrainSpec(2, 16, "fp32", "sgd", checkpointing=True), ParallelSpec(2, "fsdp", reshard_after_forward=False)),
    (LLAMA, TrainSpec(2, 16, "fp32", "adamw"), ParallelSpec(2, "fsdp", mp_param_dtype="bfloat16",
                                                               mp_reduce_dtype="float32")),
    (TIED, TrainSpec(1, 16, "fp32", "sgd-momentum", checkpointing=True), ParallelSpec(4, "fsdp")),
    # Blocks heavy against activations (as in 8B-70B models): the high point moves to the second block
    # (block 0 prefetched) at 8 ranks, to the second-last (block L-1's reduce-scatter input held) at 64.
    (WIDE, TrainSpec(1, 1024, "fp32", "adamw", checkpointing=True),
     ParallelSpec(8, "fsdp", mp_param_dtype="bfloat16", mp_reduce_dtype="float32")),
    (WIDE, TrainSpec(1, 256, "fp32", "adamw", checkpointing=True),
     ParallelSpec(64, "fsdp", mp_param_dtype="bfloat16", mp_reduce_dtype="float32")),
], ids=["gpt-fsdp4", "llama-noreshard-ckpt-sgd", "llama-mp-bf16", "llama-tied-ckpt", "wide-x8", "wide-x64"])
def test_estimate_matches_simulation_per_rank(cfg, spec, pspec):
    from planner.measure.distributed import simulate

    sim = simulate(cfg, spec, pspec)
    est = estimate_distributed(cfg, spec, pspec)
    for r in sim["ranks"]:
        g = next(g for g in est.rank_groups if g["first_rank"] <= r["rank"] <= g["last_rank"])
        assert abs(g["peak_bytes"] - r["peak_bytes"]) <= BAR_PCT / 100 * r["peak_bytes"], (r["rank"], g, r["peak_bytes"])
        assert g["optimizer_bytes"] == r["optimizer_bytes"]
    assert sim["world_size"] == pspec.world_size


def test_simulation_at_a_thousand_ranks():
    """Any world size runs on one CPU, nothing allocated: with every dim-0 a multiple of 1024 all ranks are
    alike, so one rank is simulated and stands for all."""
    from planner.measure.distributed import simulate

    cfg = LlamaConfig(vocab_size=2048, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64)
    spec, pspec = TrainSpec(1, 8, "fp32", "sgd"), ParallelSpec(1024, "fsdp")
    sim = simulate(cfg, spec, pspec)
    assert [r["ranks_like_this"] for r in sim["ranks"]] == [[0, 1023]]
    est = estimate_distributed(cfg, spec, pspec)
    assert abs(est.peak_bytes - sim["peak_bytes"]) <= BAR_PCT / 100 * sim["peak_bytes"]


# ------------------------------------------------------------------ real gloo ranks (CLI)

@pytest.mark.parametrize("cfg, run, par", [
    (GPT, ["--batch-size", "2", "--seq-len", "16", "--optimizer", "adamw"], ["--parallel", "fsdp"]),
    (LLAMA, ["--batch-size", "2", "--seq-len", "16", "--optimizer", "sgd", "--checkpointing"], ["--parallel", "ddp"]),
], ids=["gpt-fsdp", "llama-ddp-ckpt"])
def test_measure_two_ranks_matches_estimate_and_simulation(tmp_path, cfg, run, par):
    path = _config_file(tmp_path, cfg)

    def measure() -> dict:
        r = planner("measure", "train", "--config", path, *run, "--device", "cpu", "--world-size", "2", *par, "--json")
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    rec = measure()
    assert [x["rank"] for x in rec["ranks"]] == [0, 1]
    assert rec["peak_bytes"] == max(x["peak_bytes"] for x in rec["ranks"])
    for x in rec["ranks"]:
        assert abs(x["error_pct"]) <= BAR_PCT, x
        assert {"forward", "backward", "optimizer"} <= {p["phase"] for p in x["timeline"]}
    if par[1] == "fsdp":  # the CLI once; in process otherwise (a torch import less)
        s = planner("simulate", "train", "--config", path, *run, "--world-size", "2", *par, "--json")
        assert s.returncode == 0, s.stderr[-2000:]
        sim = json.loads(s.stdout)
    else:
        from planner.measure.distributed import simulate

        sim = simulate(cfg, TrainSpec(2, 16, "fp32", "sgd", checkpointing=True), ParallelSpec(2, "ddp"))
    twin_of = lambda x: next(y for y in sim["ranks"] if y["ranks_like_this"][0] <= x["rank"] <= y["ranks_like_this"][1])
    same = lambda rec: all(abs(twin_of(x)["peak_bytes"] - x["peak_bytes"]) <= 0.001 * x["peak_bytes"] for x in rec["ranks"])
    if not same(rec):
        # Real gloo ranks are one ordering of their asynchronous collectives; the simulation is another. Seen
        # once in CI under load (gpt-fsdp: a rank measured 5,632 B above its simulation, 0.77%), never here
        # in repeated runs: measure once more before calling it a difference.
        rec = measure()
    for x in rec["ranks"]:
        assert abs(twin_of(x)["peak_bytes"] - x["peak_bytes"]) <= 0.001 * x["peak_bytes"], (x, twin_of(x))


def _rank_pids(parent: int) -> list[int]:
    return [c.pid for c in psutil.Process(parent).children(recursive=True)
            if "planner.measure.distributed" in " ".join(c.cmdline())]


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_killing_one_rank_ends_the_run(tmp_path):
    cfg = GPT2Config(vocab_size=50257, context_length=256, emb_dim=256, n_heads=4, n_layers=4)
    proc = subprocess.Popen([sys.executable, "-m", "planner", "measure", "train", "--config", _config_file(tmp_path, cfg),
                             "--batch-size", "4", "--seq-len", "256", "--device", "cpu", "--world-size", "2",
                             "--parallel", "fsdp", "--json", "--progress"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline())["event"] == "progress"  # rank 0 is building its model
    pids = []
    for _ in range(100):
        pids = _rank_pids(proc.pid)
        if len(pids) == 2:
            break
        time.sleep(0.1)
    assert len(pids) == 2
    os.kill(pids[1], signal.SIGKILL)
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 3
    rec = json.loads(out.splitlines()[-1])
    assert "killed by SIGKILL" in rec["error"] and rec["killed"]
    time.sleep(0.5)
    assert _alive(pids) == []


def test_timeout_ends_every_rank(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "planner", "measure", "train", "--config", _config_file(tmp_path, GPT),
                             "--batch-size", "2", "--seq-len", "16", "--device", "cpu", "--world-size", "2",
                             "--parallel", "ddp", "--json", "--timeout", "2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    for _ in range(200):
        pids = _rank_pids(proc.pid)
        if len(pids) == 2:
            break
        time.sleep(0.01)
    assert len(pids) == 2
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "timed out" in json.loads(out.splitlines()[-1])["error"]
    assert _alive(pids) == []


@pytest.mark.parametrize("args, message", [
    (["--world-size", "0", "--parallel", "ddp"], "at least 1"),
    (["--parallel", "fsdp"], "needs --world-size"),
    (["--world-size", "2"], "needs --parallel"),
    (["--world-size", "2", "--parallel", "ddp", "--reshard-after-forward", "false"], "only applies to --parallel fsdp"),
    (["--world-size", "4096", "--parallel", "fsdp"], "cannot run for real here"),
])
def test_measure_invalid_input_exits_2_with_one_line(tmp_path, args, message):
    r = planner("measure", "train", "--config", _config_file(tmp_path, GPT), "--batch-size", "1", "--seq-len", "8",
                "--device", "cpu", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_estimate_cli_per_rank_record(tmp_path):
    r = planner("estimate", "train", "--config", _config_file(tmp_path, GPT), "--batch-size", "2", "--seq-len", "16",
                "--world-size", "4", "--parallel", "fsdp", "--mp-param-dtype", "bf16", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["world_size"] == 4 and rec["parallel"]["mp_param_dtype"] == "bfloat16"
    assert rec["peak_bytes"] == max(g["peak_bytes"] for g in rec["rank_groups"])
    assert {"zero_paper", "deepspeed"} <= set(rec["reference"])


def test_single_device_simulation_equals_measurement():
    """simulate without --parallel: the one-device step on fake tensors, GradScaler included (its inf
    check cannot read a fake value; a steady-state step is assumed to have finite gradients)."""
    from planner.measure.distributed import simulate
    from planner.measure.training import measure_training

    spec = TrainSpec(2, 16, "fp16-amp", "adamw")
    sim = simulate(GPT, spec, None)
    meas = measure_training(GPT, spec)
    assert sim["world_size"] == 1 and sim["ranks"][0]["optimizer_bytes"] == meas["optimizer_bytes"]
    assert abs(sim["peak_bytes"] - meas["peak_bytes"]) <= 0.001 * meas["peak_bytes"]
