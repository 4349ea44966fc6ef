"""Weight loading: every method measured in a child process against its estimate, in the checkpoint's dtype;
the disk the checkpoint cache takes; bad checkpoints."""
import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from planner.cli.main import main
from planner.config import PRESETS, ConfigError, GPT2Config, LlamaConfig, config_from_dict, config_to_dict
from planner.estimate.loading import (METHODS, cache_plan, check_cache_disk, cuda_block_bytes, estimate_loading,
                                      measure_refusal, per_tensor_rss, recommend)
from planner.runner import checkpoint_folder, measure_load

ROOT = Path(__file__).resolve().parent.parent
GPT = GPT2Config(vocab_size=2000, context_length=128, emb_dim=128, n_heads=4, n_layers=2)
LLAMA_TIED = LlamaConfig(vocab_size=2000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
LLAMA_BF16 = dataclasses.replace(LLAMA_TIED, torch_dtype="bfloat16")
GPT_FP16 = dataclasses.replace(GPT, torch_dtype="float16")
BAR = (0.05, 32 * 2**20)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def check_measured(cfg, method, cache):
    folder = checkpoint_folder(config_to_dict(cfg), cache)
    out = measure_load(config_to_dict(cfg), method, "cpu", folder)
    assert out.exit_code == 0, out.record
    m, e = out.record, estimate_loading(cfg, method)
    assert m["weights_match"] is True and m["dtype"] == e.dtype
    assert m["peak_device_bytes"] == pytest.approx(e.peak_device_bytes, rel=0.01)
    assert abs(m["peak_cpu_bytes"] - e.peak_cpu_bytes) <= max(BAR[0] * m["peak_cpu_bytes"], BAR[1])


@pytest.mark.parametrize("cfg", [GPT, LLAMA_TIED], ids=["gpt2", "llama-tied"])
@pytest.mark.parametrize("method", METHODS)
def test_method_measured_matches_estimate(cfg, method, cache):
    check_measured(cfg, method, cache)


@pytest.mark.parametrize("cfg, method", [(LLAMA_BF16, "baseline"), (LLAMA_BF16, "mmap"), (LLAMA_BF16, "per-tensor"),
                                         (LLAMA_BF16, "safetensors-copy"), (GPT_FP16, "sequential")],
                         ids=["bf16-baseline", "bf16-mmap", "bf16-per-tensor", "bf16-safetensors-copy",
                              "fp16-sequential"])
def test_half_precision_checkpoint_measured_matches_estimate(cfg, method, cache):
    check_measured(cfg, method, cache)


def test_checkpoints_are_written_in_their_dtype(cache):
    from planner.accounting import checkpoint_numel
    from planner.routines.loading import checkpoint_info

    bf16, fp32 = (checkpoint_folder(config_to_dict(c), cache) for c in (LLAMA_BF16, LLAMA_TIED))
    assert bf16 != fp32 and bf16.name.endswith("-bfloat16")  # the cache key holds the dtype
    for name in ("model.pth", "model.safetensors"):
        assert checkpoint_info(bf16 / name)["bytes"] == 2 * checkpoint_numel(LLAMA_BF16)
    state = torch.load(bf16 / "model.pth", map_location="cpu", mmap=True, weights_only=True)
    assert {t.dtype for t in state.values()} == {torch.bfloat16}


def test_estimates_take_the_checkpoint_dtype():
    llama1b, llama8b = PRESETS["llama-3.2-1b"], PRESETS["llama-3-8b"]
    assert estimate_loading(llama1b, "mmap").dtype == "bfloat16"  # the published torch_dtype
    assert estimate_loading(llama1b, "mmap").checkpoint_bytes == 2 * 1_235_814_400  # ~2.5 GB, not 4.9
    assert 16.0e9 < estimate_loading(llama8b, "mmap", "cuda").peak_device_bytes < 16.2e9
    fp32 = estimate_loading(llama8b, "baseline", "cuda", dtype="float32")
    assert fp32.peak_device_bytes == pytest.approx(2 * estimate_loading(llama8b, "baseline", "cuda").peak_device_bytes, rel=1e-3)
    room = estimate_loading(llama1b, "mmap").peak_device_bytes + 2**20
    assert recommend(llama1b, "cpu", room, room)[0] == "mmap"
    assert recommend(llama1b, "cpu", room, room, dtype="float32")[0] == "none"
    with pytest.raises(ConfigError, match="unknown dtype"):
        estimate_loading(llama1b, "mmap", dtype="int8")


def test_config_keeps_its_torch_dtype():
    data = {"arch": "gpt2", "vocab_size": 10, "context_length": 8, "emb_dim": 8, "n_heads": 2, "n_layers": 1}
    assert config_from_dict(data).torch_dtype is None
    assert config_from_dict({**data, "dtype": "bfloat16"}).torch_dtype == "bfloat16"  # newer HF files' key
    assert config_from_dict(config_to_dict(LLAMA_BF16)) == LLAMA_BF16
    with pytest.raises(ConfigError, match="torch_dtype must be one of"):
        config_from_dict({**data, "torch_dtype": "float64"})


def test_estimate_load_cli_dtype(capsys):
    assert main(["estimate", "load", "--model", "llama-3.2-1b", "--method", "mmap", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["dtype"] == "bfloat16" and rec["checkpoint_bytes"] == 2 * 1_235_814_400
    assert main(["estimate", "load", "--model", "llama-3.2-1b", "--method", "mmap", "--dtype", "float32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_bytes"] == 4 * 1_235_814_400
    assert main(["estimate", "load", "--model", "gpt2-small", "--method", "mmap", "--dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--dtype" in err


def test_cache_size_is_said_before_writing_and_matches_the_files(cache):
    for cfg in (GPT, LLAMA_BF16):
        plan = cache_plan(cfg, cache)
        folder = checkpoint_folder(config_to_dict(cfg), cache)
        assert str(folder) == plan["folder"]
        on_disk = sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file() and p.suffix != ".json")
        assert on_disk <= plan["total_bytes"] <= on_disk * 1.02 + 64 * 2**10
        assert cache_plan(cfg, cache)["cached"]


def _full_disk(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(2**40, 2**40 - 2**20, 2**20))


def test_a_disk_that_cannot_hold_the_checkpoints_is_refused(monkeypatch, tmp_path, capsys):
    _full_disk(monkeypatch)
    with pytest.raises(ConfigError, match="of disk"):
        check_cache_disk(GPT, tmp_path / "c")
    code = main(["measure", "load", "--config", gpt_config_file(tmp_path), "--method", "all", "--device", "cpu",
                 "--cache", str(tmp_path / "c"), "--json"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "only 1.00 MiB is free" in err
    assert not (tmp_path / "c").exists()  # refused before anything was written


def test_measure_refusal_says_why():
    plan = {"problem": None}
    assert "no GPU" in measure_refusal(GPT, "cuda", False, 2**40, plan)
    assert measure_refusal(GPT, "cuda", True, 2**40, plan) is None
    assert "of RAM" in measure_refusal(PRESETS["llama-3-8b"], "cpu", False, 2**30, plan)
    assert measure_refusal(GPT, "cpu", False, 2**40, {"problem": "full disk"}) == "full disk"


def test_measure_load_progress_per_method(tmp_path, cache, capsys):
    checkpoint_folder(config_to_dict(GPT), cache)
    assert main(["measure", "load", "--config", gpt_config_file(tmp_path), "--method", "mmap", "--device", "cpu",
                 "--cache", str(cache), "--json", "--progress"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["stage"] for e in lines[:-1]] == ["checkpoints cached", "measuring mmap (1/1)"]
    assert lines[-1]["weights_match"] is True and lines[-1]["dtype"] == "float32"


def test_checkpoints_are_reused(cache):
    first = checkpoint_folder(config_to_dict(GPT), cache)
    stamp = (first / "model.pth").stat().st_mtime_ns
    assert checkpoint_folder(config_to_dict(GPT), cache) == first
    assert (first / "model.pth").stat().st_mtime_ns == stamp


def test_estimate_formulas():
    assert per_tensor_rss([10, 100, 5]) == 210  # after the 100: 110 written + 100 loaded
    # GPT-2 XL's 6.29 GiB of tensors read as 6.4 GiB on CUDA: large blocks keep un-split slack.
    from planner.config import PRESETS
    xl = estimate_loading(PRESETS["gpt2-xl"], "mmap", "cuda")
    assert 6.3 * 2**30 < xl.peak_device_bytes < 6.45 * 2**30 and xl.checkpoint_bytes < 6.3 * 2**30
    assert cuda_block_bytes(1) == 512 and cuda_block_bytes(11 * 2**20 + 1) == 12 * 2**20
    base = estimate_loading(PRESETS["gpt2-xl"], "baseline", "cuda")
    assert base.peak_device_bytes == 2 * xl.peak_device_bytes


def planner(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def gpt_config_file(tmp_path, cfg=GPT):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    return str(path)


def test_estimate_load_cli_json(tmp_path):
    r = planner("estimate", "load", "--config", gpt_config_file(tmp_path), "--method", "per-tensor", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    for key in ("peak_device_bytes", "peak_cpu_bytes", "peak_cpu_anon_bytes", "peak_cpu_file_bytes"):
        assert isinstance(rec[key], int)


def test_measure_user_pth_checkpoint(tmp_path, cache):
    folder = checkpoint_folder(config_to_dict(GPT), cache)
    user = tmp_path / "mine.pth"
    user.write_bytes((folder / "model.pth").read_bytes())
    r = planner("measure", "load", "--config", gpt_config_file(tmp_path), "--method", "mmap", "--device", "cpu",
                "--checkpoint", str(user), "--cache", str(tmp_path / "c"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["weights_match"] is True


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _bad(tmp_path, checkpoint, method="baseline", cfg=GPT):
    before = _sha(checkpoint) if Path(checkpoint).exists() else None
    r = planner("measure", "load", "--config", gpt_config_file(tmp_path, cfg), "--method", method, "--device", "cpu",
                "--checkpoint", str(checkpoint), "--cache", str(tmp_path / "c"), "--json")
    if before:
        assert _sha(checkpoint) == before  # nothing written over the user's file
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    return r.stderr


def test_missing_checkpoint(tmp_path):
    assert "not found" in _bad(tmp_path, tmp_path / "nope.pth")


def test_truncated_checkpoint(tmp_path, cache):
    data = (checkpoint_folder(config_to_dict(GPT), cache) / "model.pth").read_bytes()
    path = tmp_path / "half.pth"
    path.write_bytes(data[: len(data) // 2])
    assert "truncated" in _bad(tmp_path, path)


def test_mismatched_checkpoint_lists_keys(tmp_path, cache):
    other = GPT2Config(vocab_size=2000, context_length=128, emb_dim=64, n_heads=4, n_layers=3)
    path = checkpoint_folder(config_to_dict(other), cache) / "model.pth"
    msg = _bad(tmp_path, path)
    assert "does not match" in msg and "trf_blocks.2" in msg and "shape mismatch" in msg


def test_checkpoint_in_another_dtype_is_named(tmp_path, cache):
    path = tmp_path / "fp32.pth"
    path.write_bytes((checkpoint_folder(config_to_dict(GPT), cache) / "model.pth").read_bytes())
    msg = _bad(tmp_path, path, cfg=dataclasses.replace(GPT, torch_dtype="bfloat16"))
    assert "its tensors are float32 but the model is built in bfloat16" in msg and "--dtype" in msg


class _Evil:
    def __reduce__(self):
        import os
        return (os.system, ("touch /tmp/planner-pwned",))


def test_pickle_that_runs_code_is_refused(tmp_path):
    Path("/tmp/planner-pwned").unlink(missing_ok=True)
    path = tmp_path / "evil.pth"
    torch.save({"tok_emb.weight": _Evil()}, path)
    assert "refused" in _bad(tmp_path, path, method="meta")
    assert not Path("/tmp/planner-pwned").exists()


def test_corrupt_safetensors(tmp_path):
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    assert "cannot read" in _bad(tmp_path, path, method="safetensors")


def test_method_that_cannot_read_the_format(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"")
    assert "cannot read a .safetensors" in _bad(tmp_path, path, method="mmap")


@pytest.mark.parametrize("method", METHODS)
def test_tied_head_stays_tied(method, cache):
    from planner.routines.loading import LOADERS
    folder = checkpoint_folder(config_to_dict(LLAMA_TIED), cache)
    model = LOADERS[method](LLAMA_TIED, folder, torch.device("cpu"))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_checkpoint_sized_without_loading(cache):
    from planner.accounting import checkpoint_numel
    from planner.estimate.loading import safetensors_header_sizes
    from planner.routines.loading import checkpoint_info
    folder = checkpoint_folder(config_to_dict(GPT), cache)
    expected = checkpoint_numel(GPT) * 4
    assert sum(safetensors_header_sizes(folder / "model.safetensors").values()) == expected
    assert checkpoint_info(folder / "model.pth")["bytes"] == expected
    info = checkpoint_info(folder / "model.safetensors")
    assert info["bytes"] == expected and info["largest"][0] in ("tok_emb.weight", "out_head.weight")
