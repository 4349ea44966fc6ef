"""The `python -m planner` contract: keys, exit codes, one-line errors, and measurement failures."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = {"arch": "gpt2", "vocab_size": 300, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 2,
        "drop_rate": 0.1}


def planner(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_estimate_json_keys():
    r = planner("estimate", "train", "--model", "gpt2-small", "--batch-size", "2", "--seq-len", "128",
                "--precision", "bf16-amp", "--optimizer", "adamw", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    for key in ("params_bytes", "buffers_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes"):
        assert isinstance(rec[key], int)
    assert rec["params_bytes"] == 163_037_184 * 4
    assert rec["buffers_bytes"] == 12 * 1024 * 1024 * 4
    assert rec["peak_phase"] in ("forward", "loss", "backward", "optimizer", "zero_grad")


def test_estimate_table_and_hf_config():
    r = planner("estimate", "train", "--config", str(ROOT / "tests/data/Llama-3-8B.config.json"),
                "--batch-size", "1", "--seq-len", "2048", "--precision", "bf16", "--checkpointing")
    assert r.returncode == 0, r.stderr
    assert "peak_bytes" in r.stdout and "GiB" in r.stdout


@pytest.mark.parametrize("args", [
    ["--model", "gpt2-nope"],
    ["--config", "/nonexistent/config.json"],
    ["--model", "gpt2-small", "--config", "x.json"],
    ["--model", "gpt2-small", "--batch-size", "0"],
    ["--model", "gpt2-small", "--batch-size", "-3"],
    ["--model", "gpt2-small", "--seq-len", "4096"],
    ["--model", "gpt2-small", "--precision", "fp8"],
    ["--model", "gpt2-small", "--optimizer", "lion"],
    ["--model", "gpt2-small", "--device", "tpu"],
    ["--model", "gpt2-small", "--attention", "flash"],
])
def test_invalid_input_exits_2_with_one_line(args):
    base = {"--batch-size": "1", "--seq-len": "8"}
    for k, v in base.items():
        if k not in args:
            args = args + [k, v]
    r = planner("estimate", "train", *args)
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"arch": "gpt2", "vocab_size": 10, "context_length": 8, "emb_dim": 10, "n_heads": 3, "n_layers": 1}),
    json.dumps({"arch": "llama", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 8,
                "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 3}),
    json.dumps({"arch": "gpt2", "vocab_size": 10}),
    json.dumps({"arch": "gpt2", "vocab_size": 10**8, "context_length": 8, "emb_dim": 10**6, "n_heads": 2,
                "n_layers": 1000}),
])
def test_bad_config_files_exit_2(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    r = planner("estimate", "train", "--config", str(path), "--batch-size", "1", "--seq-len", "4")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_measure_tiny_cpu(tiny_config):
    r = planner("measure", "train", "--config", tiny_config, "--batch-size", "2", "--seq-len", "32",
                "--device", "cpu", "--json", "--progress")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert any(l.get("event") == "progress" for l in lines[:-1])
    rec = lines[-1]
    for key in ("peak_bytes", "peak_rss_bytes", "peak_phase", "step_time_s", "timeline", "estimate", "error_pct"):
        assert key in rec
    assert abs(rec["error_pct"]) <= 2.0


def test_measure_missing_cuda_device_exits_2():
    r = planner("measure", "train", "--model", "gpt2-small", "--batch-size", "1", "--seq-len", "8",
                "--device", "cuda:7", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_ram_guard_refuses_before_starting():
    r = planner("measure", "train", "--model", "llama-3-8b", "--batch-size", "8", "--seq-len", "4096",
                "--device", "cpu", "--json")
    assert r.returncode == 2 and "refused" in r.stderr


def test_out_of_memory_is_reported_with_phase(tmp_path):
    path = tmp_path / "big.json"  # ~0.9 GB peak against a 200 MiB cap on the child's extra address space
    path.write_text(json.dumps({**TINY, "vocab_size": 50257, "emb_dim": 256, "n_heads": 4, "context_length": 256}))
    r = planner("measure", "train", "--config", str(path), "--batch-size", "4", "--seq-len", "256",
                "--device", "cpu", "--json", "--memory-limit", "200MiB")
    assert r.returncode == 3, r.stderr
    rec = json.loads(r.stdout.splitlines()[-1])
    assert "out of memory" in rec["error"] and rec["phase"]


def test_timeout_kills_the_child(tiny_config):
    r = planner("measure", "train", "--config", tiny_config, "--batch-size", "2", "--seq-len", "32",
                "--device", "cpu", "--json", "--timeout", "0.5")
    assert r.returncode == 3
    assert "timed out" in json.loads(r.stdout.splitlines()[-1])["error"]


def test_killed_child_is_reported():
    cfg = {**TINY, "emb_dim": 256, "n_heads": 4, "n_layers": 4, "vocab_size": 50257, "context_length": 512}
    proc = subprocess.Popen([sys.executable, "-m", "planner", "measure", "train", "--config", "/dev/stdin",
                             "--batch-size", "4", "--seq-len", "512", "--device", "cpu", "--json", "--progress"],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps(cfg))
    proc.stdin.close()
    assert json.loads(proc.stdout.readline())["event"] == "progress"  # the worker is running
    workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if "planner.measure.worker" in " ".join(c.cmdline())]
    assert workers
    os.kill(workers[0].pid, signal.SIGKILL)
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 3
    rec = json.loads(out.splitlines()[-1])
    assert "SIGKILL" in rec["error"]
