"""The command line with the Hugging Face families: published config.json files, --loss, one-line errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def planner(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_estimate_each_published_config_and_the_loss_option():
    # One process per config would be slow; the estimate of every file is checked in one call each for two,
    # and the loss option's effect (pure bf16: transformers' fp32 logits) on one.
    rec = {}
    for loss in ("default", "cross-entropy"):
        r = planner("estimate", "train", "--config", str(ROOT / "tests/data/Qwen2.5-0.5B.config.json"),
                    "--batch-size", "1", "--seq-len", "512", "--precision", "bf16", "--loss", loss, "--json")
        assert r.returncode == 0, r.stderr
        rec[loss] = json.loads(r.stdout)
    assert rec["default"]["model"]["arch"] == "qwen2" and rec["default"]["run"]["loss"] == "default"
    bsV = 512 * 151936
    # transformers' loss runs on an fp32 copy of the bf16 logits: fp32 gradients and the copy itself
    assert rec["default"]["transients"]["cross_entropy_grads"] == 2 * 4 * bsV
    assert rec["cross-entropy"]["transients"]["cross_entropy_grads"] == 2 * 2 * bsV
    assert rec["default"]["transients"]["logits_fp32_copy"] == 4 * bsV
    assert rec["cross-entropy"]["transients"]["logits_fp32_copy"] == 0
    r = planner("estimate", "train", "--config", str(ROOT / "tests/data/gemma-2-2b.config.json"),
                "--batch-size", "1", "--seq-len", "1024", "--precision", "bf16-amp", "--checkpointing")
    assert r.returncode == 0, r.stderr
    assert "peak_bytes" in r.stdout


@pytest.mark.parametrize("config, extra, message", [
    # t5 is no causal LM transformers' AutoModelForCausalLM builds (issue #20: those are accepted, fitted)
    ({"model_type": "t5", "hidden_size": 8}, [], "unsupported model_type 't5'; supported: gemma, gemma2"),
    ({"model_type": "bert", "hidden_size": 8}, [], "bert config has no positive number of layers"),
    ({"model_type": "gemma2", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}, ["--attention", "sdpa"], "does not run SDPA"),
    ({"model_type": "gpt2", "vocab_size": 10, "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 64},
     ["--loss", "labels", "--seq-len", "128"], "longer than the model's context"),
])
def test_family_errors_exit_2_with_one_line(tmp_path, config, extra, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    args = ["estimate", "train", "--config", str(path), "--batch-size", "1"]
    if "--seq-len" not in extra:
        args += ["--seq-len", "8"]
    r = planner(*args, *extra)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_book_gpt2_refuses_the_labels_loss():
    r = planner("estimate", "train", "--model", "gpt2-small", "--batch-size", "1", "--seq-len", "8", "--loss", "labels")
    assert r.returncode == 2 and "no labels= loss" in r.stderr


def test_measure_transformers_model_in_a_child(tmp_path):
    """The child builds transformers' model from a config.json (a tiny Qwen 3) and trains it with labels=."""
    data = json.loads((ROOT / "tests/data/Qwen3-0.6B.config.json").read_text())
    data.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=512)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    r = planner("measure", "train", "--config", str(path), "--batch-size", "2", "--seq-len", "16",
                "--precision", "bf16", "--device", "cpu", "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads(r.stdout)
    assert abs(rec["error_pct"]) <= 1.0
