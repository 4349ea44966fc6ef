"""The `python -m planner` contract: keys, exit codes, one-line errors, and measurement failures.

Most tests call planner.cli.main in this process (its measurements still run their worker as a real child);
a real `python -m planner` process only where the process itself is what is tested (a signal, a closed pipe).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from planner import runner
from planner.cli import main as cli
from planner.estimate.loading import METHODS

ROOT = Path(__file__).resolve().parent.parent
TINY = {"arch": "gpt2", "vocab_size": 300, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 2,
        "drop_rate": 0.1}


def run(capsys, *args):
    """(exit code, stdout, stderr) of `python -m planner ARGS`, run in this process."""
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_estimate_json_keys(capsys):
    code, out, err = run(capsys, "estimate", "train", "--model", "gpt2-small", "--batch-size", "2", "--seq-len", "128",
                         "--precision", "bf16-amp", "--optimizer", "adamw", "--json")
    assert code == 0, err
    rec = json.loads(out)
    for key in ("params_bytes", "buffers_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes"):
        assert isinstance(rec[key], int)
    assert rec["params_bytes"] == 163_037_184 * 4
    assert rec["buffers_bytes"] == 12 * 1024 * 1024 * 4
    assert rec["peak_phase"] in ("forward", "loss", "backward", "optimizer", "zero_grad")


def test_estimate_table_and_hf_config(capsys):
    code, out, err = run(capsys, "estimate", "train", "--config", str(ROOT / "tests/data/Llama-3-8B.config.json"),
                         "--batch-size", "1", "--seq-len", "2048", "--precision", "bf16", "--checkpointing")
    assert code == 0, err
    assert "peak_bytes" in out and "GiB" in out


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
def test_invalid_input_exits_2_with_one_line(capsys, args):
    base = {"--batch-size": "1", "--seq-len": "8"}
    for k, v in base.items():
        if k not in args:
            args = args + [k, v]
    code, out, err = run(capsys, "estimate", "train", *args)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("planner: error: ")


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"arch": "gpt2", "vocab_size": 10, "context_length": 8, "emb_dim": 10, "n_heads": 3, "n_layers": 1}),
    json.dumps({"arch": "llama", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 8,
                "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 3}),
    json.dumps({"arch": "gpt2", "vocab_size": 10}),
    json.dumps({"arch": "gpt2", "vocab_size": 10**8, "context_length": 8, "emb_dim": 10**6, "n_heads": 2,
                "n_layers": 1000}),
])
def test_bad_config_files_exit_2(capsys, tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, out, err = run(capsys, "estimate", "train", "--config", str(path), "--batch-size", "1", "--seq-len", "4")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_measure_tiny_cpu(capsys, tiny_config):
    code, out, err = run(capsys, "measure", "train", "--config", tiny_config, "--batch-size", "2", "--seq-len", "32",
                         "--device", "cpu", "--json", "--progress")
    assert code == 0, err
    lines = [json.loads(l) for l in out.splitlines()]
    assert any(l.get("event") == "progress" for l in lines[:-1])
    rec = lines[-1]
    for key in ("peak_bytes", "peak_rss_bytes", "peak_phase", "step_time_s", "timeline", "estimate", "error_pct"):
        assert key in rec
    assert abs(rec["error_pct"]) <= 2.0


def test_measure_missing_cuda_device_exits_2(capsys):
    code, out, err = run(capsys, "measure", "train", "--model", "gpt2-small", "--batch-size", "1", "--seq-len", "8",
                         "--device", "cuda:7", "--json")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_ram_guard_refuses_before_starting(capsys):
    code, out, err = run(capsys, "measure", "train", "--model", "llama-3-8b", "--batch-size", "8", "--seq-len", "4096",
                         "--device", "cpu", "--json")
    assert code == 2 and "refused" in err


def test_out_of_memory_is_reported_with_phase(capsys, tmp_path):
    path = tmp_path / "big.json"  # ~0.9 GB peak against a 200 MiB cap on the child's extra address space
    path.write_text(json.dumps({**TINY, "vocab_size": 50257, "emb_dim": 256, "n_heads": 4, "context_length": 256}))
    code, out, err = run(capsys, "measure", "train", "--config", str(path), "--batch-size", "4", "--seq-len", "256",
                         "--device", "cpu", "--json", "--memory-limit", "200MiB")
    assert code == 3, err
    rec = json.loads(out.splitlines()[-1])
    assert "out of memory" in rec["error"] and rec["phase"]


def test_timeout_kills_the_child(capsys, tiny_config):
    code, out, err = run(capsys, "measure", "train", "--config", tiny_config, "--batch-size", "2", "--seq-len", "32",
                         "--device", "cpu", "--json", "--timeout", "0.5")
    assert code == 3
    assert "timed out" in json.loads(out.splitlines()[-1])["error"]


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


def test_estimate_load_all_methods(capsys):
    code, out, err = run(capsys, "estimate", "load", "--model", "gpt2-small", "--method", "all", "--json")
    assert code == 0, err
    rec = json.loads(out)
    assert [r["method"] for r in rec["results"]] == list(METHODS) and rec["model"]["arch"] == "gpt2"
    single = json.loads(run(capsys, "estimate", "load", "--model", "gpt2-small", "--method", "mmap", "--json")[1])
    assert rec["results"][METHODS.index("mmap")] == {k: v for k, v in single.items() if k != "model"}
    code, out, err = run(capsys, "estimate", "load", "--model", "gpt2-small", "--method", "all")
    assert code == 0 and all(re.search(rf"^{m} +\d", out, re.M) for m in METHODS), out


def test_fit_without_a_batch_reports_the_largest_batch_and_no_other_run(capsys):
    args = ["fit", "--model", "gpt2-small", "--seq-len", "1024", "--budget", "16GiB"]
    rec = json.loads(run(capsys, *args, "--json")[1])
    best = rec["max_batch_size"]
    assert best > 0 and rec["run"]["batch_size"] == best and rec["fits"] and rec["advice"] == []
    assert all(isinstance(rec[k], int) for k in ("budget_bytes", "peak_bytes"))
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert f"largest batch that fits at seq 1024: {best}," in out and "GiB" in out
    assert "does not fit" not in out and f"batch {2 * best}" not in out
    assert not re.search(r"\d,\d\d\d", out), "a raw byte count in the text"
    code, out, err = run(capsys, "fit", "--model", "gpt2-xl", "--seq-len", "1024", "--budget", "16GiB")
    assert "no batch fits at seq 1024" in out and "options for batch 1 x seq 1024" in out


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_help_explains_every_option_and_its_default(capsys):
    for parser in _parsers(cli.build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):  # each subcommand gets a sentence
                assert all(c.help and c.help.endswith(".") for c in action._choices_actions), parser.prog
                continue
            text = formatter._expand_help(action)
            assert text, f"{parser.prog} {action.dest}: no help"
            has_default = action.option_strings and action.nargs != 0 and not action.required
            if has_default and action.dest not in ("model", "config"):  # --model or --config: one is required
                assert "default" in text, f"{parser.prog} {action.dest}: {text}"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["measure", "train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0 and "(default: 600.0)" in out and "(default: adamw)" in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(re.search(rf"^ +{c} +[A-Z]\w+ .*", out, re.M) for c in ("estimate", "measure", "fit", "bench")), out


def test_a_closed_stdout_is_quiet():
    """`python -m planner ... | head -1`: the reader goes away early; no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "planner", "estimate", "train", "--model", "gpt2-small",
                             "--batch-size", "1", "--seq-len", "8"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before the command has written anything
    assert proc.stderr.read() == "" and proc.wait(timeout=60) == 128 + signal.SIGPIPE


def test_measure_load_progress_on_stderr_and_clean_json_on_stdout(capsys, monkeypatch, tiny_config, tmp_path):
    result = {"event": "result", "peak_device_bytes": 1, "peak_cpu_bytes": 1, "load_time_s": 0.1, "weights_match": True}
    monkeypatch.setattr(runner, "checkpoint_folder", lambda cfg, cache: tmp_path)
    monkeypatch.setattr(runner, "measure_load", lambda *a, **kw: runner.WorkerOutcome(0, dict(result)))
    args = ["measure", "load", "--config", tiny_config, "--method", "all", "--device", "cpu",
            "--cache", str(tmp_path / "cache")]
    code, out, err = run(capsys, *args)
    steps = err.splitlines()
    assert code == 0 and len(steps) == len(METHODS) + 1 and steps[0].startswith("planner: writing checkpoints")
    assert all(line == f"planner: measuring {m} ({i}/{len(METHODS)})"
               for i, (m, line) in enumerate(zip(METHODS, steps[1:]), start=1))
    code, out, err = run(capsys, *args, "--json")
    assert err == "" and [r["method"] for r in json.loads(out)["results"]] == list(METHODS)
    code, out, err = run(capsys, *args, "--json", "--progress")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [e.get("event") for e in lines[:-1]] == ["progress"] * 8 and len(lines[-1]["results"]) == 7


def test_fit_measure_costs_progress_on_stderr(capsys, monkeypatch, tiny_config):
    monkeypatch.setattr(runner, "run_worker", lambda *a, **kw: runner.WorkerOutcome(0, {"step_time_s": 1.0}))
    args = ["fit", "--config", tiny_config, "--seq-len", "64", "--batch-size", "4", "--budget", "1MiB",
            "--measure-costs"]
    code, out, err = run(capsys, *args)
    assert code == 0 and len(err.splitlines()) == 3 and all("2-block proxy" in line for line in err.splitlines())
    code, out, err = run(capsys, *args, "--json")
    assert err == "" and json.loads(out)["measured_costs"] == {"checkpointing": 1.0, "grad-accum": 1.0}


@pytest.mark.parametrize("argv", [["bench", "accuracy", "--family", "llama"], ["bench", "finetune", "--family", "llama"],
                                  ["bench", "families", "--family", "nosuch"], ["bench", "finetune-amp", "--family", "llama"]])
def test_bench_family_refused_where_it_does_not_apply_in_one_line(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "family" in err[0], err


def test_the_ram_guard_refuses_a_cpu_run_in_one_line():
    """One guard for measure train, measure train --module and measure load (planner.api.check_ram_guard)."""
    import psutil

    from planner.api import check_ram_guard
    from planner.config import ConfigError

    available = psutil.virtual_memory().available
    check_ram_guard(available // 4, "the estimated peak")  # fits: no error
    with pytest.raises(ConfigError, match=r"^refused: the estimated peak .+ exceeds 80% of the .+ of RAM available now$"):
        check_ram_guard(2 * available, "the estimated peak")
