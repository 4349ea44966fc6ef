"""Issue #35: the compute model (planner/estimate/compute.py) against torch.utils.flop_counter.FlopCounterMode on the
real step (planner/measure/flops.py: TrainingStep / GenerationRun, transformers' models, peft's LoRA, bitsandbytes'
QLoRA), tiny configs of every family x technique, within the bar; the GPU catalog; price(); the CLI keys.

The grid: every family with formulas, plain fp32 training, full / every:2 / selective checkpointing, LoRA (peft's
default targets, or all-linear where peft has none) with and without checkpointing, the last block trained, a fused
loss (cce; chunked-ce on Llama), bf16-AMP with accumulation; Llama also with eager attention under LoRA (the partial
attention grads of a frozen prefix), LoRA on k_proj/o_proj only, QLoRA nf4; inference (generate) per family.
"""
import dataclasses
import json
import time

import pytest

from planner.arch import families
from planner.cli import main as cli
from planner.estimate.compute import infer_flops, price, train_flops
from planner.gpus import GPUS, gpu, peak_flops
from planner.infer_spec import InferSpec
from planner.measure.flops import tiny_config, train_grid
from planner.spec import TrainSpec, prepare
from planner.validation import ConfigError

BAR = 0.01  # the issue's: within 1% of FlopCounterMode
def _id(row) -> str:
    arch, kw = row
    return arch + "-" + ("-".join(f"{k}={v}" for k, v in kw.items()) or "fp32")


@pytest.mark.parametrize("row", train_grid(quick=True), ids=_id)
def test_train_flops_match_flop_counter(row):
    """The quick grid (planner/measure/flops.py train_grid; docs/plan.md has the whole one: 121 rows)."""
    from planner.measure.flops import row_check

    r = row_check(*row)
    assert r["counted"] > 0
    assert abs(r["error_pct"]) <= 100 * BAR, r


def test_qlora_flops_match_flop_counter():
    """QLoRA nf4 (bitsandbytes' gemm_4bit forward, its matmul backward) under checkpointing: LoRA's FLOPs."""
    pytest.importorskip("bitsandbytes")
    from planner.measure.flops import count_train_flops

    cfg, b, s = tiny_config("llama")
    spec = TrainSpec(batch_size=b, seq_len=s, precision="bf16", lora_r=4, quantize_base="nf4", checkpointing=True)
    cfg = prepare(cfg, spec)
    got = count_train_flops(cfg, spec)["flops_per_step"]
    assert abs(train_flops(cfg, spec)["flops_per_step"] - got) <= BAR * got


@pytest.mark.parametrize("arch", ["llama", "mixtral", "gpt2"])
def test_infer_flops_match_flop_counter(arch):
    from planner.measure.flops import count_infer_flops

    cfg, _, _ = tiny_config(arch)
    for attention in families()[arch].attention_kinds(cfg):
        c = dataclasses.replace(cfg, attention=attention)
        ispec = InferSpec(batch_size=2, prompt_len=16, new_tokens=5)
        got = count_infer_flops(c, ispec)["flops_per_step"]
        assert abs(infer_flops(c, ispec)["flops_per_step"] - got) <= BAR * got, (arch, attention)


# ---------------------------------------------------------------- no torch below


def test_gpu_catalog_rows_and_lookup():
    names = ("h200", "h100-sxm", "h100-pcie", "a100-40gb", "a100-80gb", "l40s", "a6000", "rtx-4090", "rtx-3090",
             "l4", "a10g", "t4")
    assert tuple(GPUS) == names
    for name in names:
        g = gpu(name.upper())
        assert g.name == name and g.source and g.memory_bytes > 0 and g.hbm_bytes_per_s > 0
        assert g.fp16_flops > g.fp32_flops and g.pcie_bytes_per_s > 0
    assert gpu("rtx-4090").memory_bytes == 24 * 2 ** 30
    assert peak_flops(gpu("t4"), "bfloat16") == gpu("t4").fp32_flops  # no BF16 tensor cores on Turing
    with pytest.raises(ConfigError, match="unknown GPU 'rtx-5090'; choose one of: h200, h100-sxm"):
        gpu("rtx-5090")


def test_price_is_a_memoised_roofline():
    from planner.config import preset

    cfg = preset("llama-3.1-8b")
    spec = TrainSpec(batch_size=2, seq_len=2048, precision="bf16", lora_r=16, lora_targets="all-linear",
                     checkpointing=True, device="cuda")
    first = price(cfg, spec, "rtx-4090")
    assert set(first) >= {"flops_per_step", "step_time_s", "tokens_per_s", "parts", "basis"}
    assert "roofline" in first["basis"] and "not a measurement" in first["basis"]
    assert first["tokens_per_s"] == pytest.approx(2 * 2048 / first["step_time_s"])
    assert first["step_time_s"] == pytest.approx(sum(p["time_s"] for p in first["parts"].values()))
    t = time.perf_counter()
    for _ in range(100):
        assert price(cfg, spec, "rtx-4090") is first
    assert time.perf_counter() - t < 0.05  # memoised: a dictionary hit (the plan search calls it per candidate)
    # a faster GPU is faster; QLoRA's dequantization costs HBM time LoRA does not
    assert price(cfg, spec, "h100-sxm")["step_time_s"] < first["step_time_s"]
    q = price(cfg, dataclasses.replace(spec, quantize_base="nf4"), "rtx-4090")
    assert q["parts"]["dequantize"]["hbm_bytes"] > 0 and q["step_time_s"] > first["step_time_s"]


def test_cli_estimate_gains_flops_and_gpu(capsys):
    code = cli.main(["estimate", "train", "--model", "llama-3.2-1b", "--batch-size", "1", "--seq-len", "512",
                     "--precision", "bf16", "--json"])
    rec = json.loads(capsys.readouterr().out)
    assert code == 0 and rec["flops_per_step"] > 0 and "step_time_s" not in rec and "peak_bytes" in rec
    code = cli.main(["estimate", "train", "--model", "llama-3.2-1b", "--batch-size", "1", "--seq-len", "512",
                     "--precision", "bf16", "--gpu", "h200", "--json"])
    rec = json.loads(capsys.readouterr().out)
    assert code == 0 and rec["gpu"] == "h200" and rec["step_time_s"] > 0
    assert rec["tokens_per_s"] == pytest.approx(512 / rec["step_time_s"])
    code = cli.main(["estimate", "infer", "--model", "llama-3.2-1b", "--batch-size", "1", "--prompt-len", "64",
                     "--new-tokens", "8", "--gpu", "l4", "--json"])
    rec = json.loads(capsys.readouterr().out)
    assert code == 0 and rec["flops_per_step"] > 0 and rec["tokens_per_s"] > 0
    code = cli.main(["estimate", "train", "--model", "llama-3.2-1b", "--batch-size", "1", "--seq-len", "512",
                     "--gpu", "rtx-409", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "unknown GPU 'rtx-409'" in err and len(err.strip().splitlines()) == 1


def test_two_point_walk_is_exact():
    """train_flops scales two unit walks (b*s*X + b*s^2*Y terms): equal to the walk at each point itself."""
    from planner.config import preset
    from planner.estimate.compute import _train_flops

    for name, kw in (("llama-3-8b", dict(precision="bf16", lora_r=16, checkpointing=True)),
                     ("qwen3-30b-a3b", dict(precision="bf16", checkpointing=True, checkpoint_policy="selective")),
                     ("gpt2-small", dict(loss="chunked-ce", train_layers="all"))):
        cfg = preset(name)
        for b, s, k in ((1, 512, 1), (3, 1000, 2), (8, 64, 4)):
            spec = TrainSpec(batch_size=b, seq_len=s, grad_accum=k, **kw)
            assert train_flops(cfg, spec) == _train_flops(cfg, spec), (name, b, s, k)


def test_estimate_side_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, planner.estimate.compute, planner.gpus; "
            "sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
