"""Weight loading: every method measured in a child process against its estimate, and bad checkpoints."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from planner.config import GPT2Config, LlamaConfig, config_to_dict
from planner.estimate.loading import METHODS, cuda_block_bytes, estimate_loading, per_tensor_rss
from planner.runner import checkpoint_folder, measure_load

ROOT = Path(__file__).resolve().parent.parent
GPT = GPT2Config(vocab_size=2000, context_length=128, emb_dim=128, n_heads=4, n_layers=2)
LLAMA_TIED = LlamaConfig(vocab_size=2000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
BAR = (0.05, 32 * 2**20)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("cfg", [GPT, LLAMA_TIED], ids=["gpt2", "llama-tied"])
@pytest.mark.parametrize("method", METHODS)
def test_method_measured_matches_estimate(cfg, method, cache):
    folder = checkpoint_folder(config_to_dict(cfg), cache)
    out = measure_load(config_to_dict(cfg), method, "cpu", folder)
    assert out.exit_code == 0, out.record
    m, e = out.record, estimate_loading(cfg, method)
    assert m["weights_match"] is True
    assert m["peak_device_bytes"] == pytest.approx(e.peak_device_bytes, rel=0.01)
    assert abs(m["peak_cpu_bytes"] - e.peak_cpu_bytes) <= max(BAR[0] * m["peak_cpu_bytes"], BAR[1])


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
