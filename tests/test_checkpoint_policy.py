"""Issue #24: checkpointing policies every:K and selective (planner/checkpointing.py): the real step measured and
simulated (to the byte), between no checkpointing and full; `--checkpointing` alone unchanged; refusals."""
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli.args import EXIT_INVALID
from planner.config import GPT2Config, LlamaConfig, ConfigError
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
    for policy, extra, needle in (("every:x", (), "unknown checkpointing policy"),
                                  ("every:2", ("--offload-activations", "--precision", "fp16-amp"),
                                   "not fp16-amp"),
                                  ("selective", ("--train-layers", "last:2", "--grad-accum", "2"),
                                   "gradient accumulation is not modelled")):
        proc = _cli("estimate", "train", "--model", "gpt2-small", "--batch-size", "1", "--seq-len", "64",
                    "--checkpointing", policy, *extra)
        assert proc.returncode == EXIT_INVALID and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    sel = _cli("estimate", "train", "--model", "llama-3-8b", "--batch-size", "1", "--seq-len", "4096",
               "--checkpointing", "selective", "--json")
    assert sel.returncode == 0, sel.stderr
    rec = json.loads(sel.stdout)
    assert rec["run"]["checkpoint_policy"] == "selective"
    assert any("recompute" in n for n in rec["notes"])


# ---- the estimate of every:K and selective (planner/estimate/ckpt_policy.py) ------------------------------------
LLAMA4 = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=4,
                     num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)


def test_selective_rule_is_torchtitans():
    from planner.checkpointing import recompute_flops, selective_saved

    ops = [("q", "mm", 10, 100), ("k", "mm", 1, 100), ("v", "mm", 20, 100), ("att", "sdpa", 5, 50),
           ("o", "addmm", 7, 100), ("o2", "mm", 2, 100), ("gate", "mm", 40, 100), ("e", "grouped_mm", 9, 100)]
    # mm 1, 3 and 5 (q, v, gate) and the fused attention are kept; every second mm, addmm and grouped_mm are not
    assert selective_saved(ops) == 10 + 20 + 5 + 40
    assert recompute_flops("selective", ops, 3) == 3 * (750 - 350)
    assert recompute_flops("every:2", ops, 3) == 2 * 750 and recompute_flops("full", ops, 3) == 3 * 750


@pytest.mark.parametrize("cfg,policy,precision", [
    (LLAMA4, "every:3", "bf16-amp"), (LLAMA4, "selective", "fp32"),
    (GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3, n_layers=4, qkv_bias=False), "selective",
     "bf16"),
    (GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3, n_layers=4), "every:2", "fp32")])
def test_policy_estimate_within_one_percent_of_measure(cfg, policy, precision):
    from planner.estimate.training import estimate_training

    spec = TrainSpec(2, 32, precision, "adamw", checkpointing=True, checkpoint_policy=policy)
    est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= 0.01 * meas["peak_bytes"]
    assert est.peak_phase == meas["peak_phase"]
    full = estimate_training(cfg, TrainSpec(2, 32, precision, "adamw", checkpointing=True))
    none = estimate_training(cfg, TrainSpec(2, 32, precision, "adamw"))
    assert full.phase_peak_bytes["forward"] <= est.phase_peak_bytes["forward"] <= none.phase_peak_bytes["forward"]


def test_recompute_share_from_flops():
    from planner.config import resolve_model
    from planner.estimate.ckpt_policy import recompute_share

    cfg = resolve_model("llama-3-8b", None)
    share = {p: recompute_share(cfg, TrainSpec(1, 4096, "bf16-amp", "adamw", checkpointing=True, checkpoint_policy=p))
             for p in ("full", "every:2", "selective")}
    assert 0.28 < share["full"] < 1 / 3  # one more forward of the blocks; the head is not recomputed
    assert share["every:2"] == pytest.approx(share["full"] / 2)  # 16 of 32 blocks
    assert 0 < share["selective"] < share["every:2"]
    assert recompute_share(cfg, TrainSpec(1, 4096)) is None
    book = resolve_model("gpt2-small", None)  # biased Linears (addmm), eager attention: nothing saved
    assert recompute_share(book, TrainSpec(1, 64, checkpointing=True, checkpoint_policy="selective")) == \
        recompute_share(book, TrainSpec(1, 64, checkpointing=True))


# ---- the policies with fine-tuning (planner/estimate/finetune.py policy_terms / policy_kept / selective_tail) ------
def _gemma2_l4(vocab: int):
    import dataclasses

    from planner.arch import families

    fam = families()["gemma2"]
    _, cfg, _, _ = fam.grid_configs()[0]
    return dataclasses.replace(fam.with_layers(cfg, 4), vocab_size=vocab)


def test_with_adapters_counts_loras_matmuls():
    from planner.checkpointing import selective_saved, with_adapters

    ops = [("q_proj", "mm", 10, 0), ("k_proj", "mm", 1, 0), ("v_proj", "mm", 20, 0), ("o_proj", "mm", 2, 0)]
    out = with_adapters(ops, {"q_proj": (4, 8), "v_proj": (4, 6)}, n=3, r=2, e_out=4)
    assert [o[0] for o in out] == ["q_proj", "q_proj lora_A", "q_proj lora_B", "k_proj", "v_proj", "v_proj lora_A",
                                   "v_proj lora_B", "o_proj"]
    # mm 1, 3, 5, 7: q, q's lora_B (3*8*4), v, v's lora_B (3*6*4); lora_A and k and o are recomputed
    assert selective_saved(out) == 10 + 96 + 20 + 72


@pytest.mark.parametrize("cfg,kw,policy,precision,b,s", [
    # a small vocabulary: the backward sweep's in-block points decide, not the loss
    (LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=6,
                 num_key_value_heads=2, max_position_embeddings=128), {"lora_r": 8}, "selective", "fp32", 2, 96),
    (LLAMA4, {"train_layers": "last:1"}, "every:2", "bf16-amp", 2, 32),
    (_gemma2_l4(97), {"lora_r": 8}, "every:2", "bf16-amp", 2, 64),
    (LLAMA4, {"lora_r": 8, "grad_accum": 2}, "every:2", "fp32", 2, 32)])  # a later micro-batch's sweep
def test_policy_with_finetuning_estimate_within_one_percent(cfg, kw, policy, precision, b, s):
    from planner.estimate.training import estimate_training

    spec = TrainSpec(b, s, precision, "adamw", checkpointing=True, checkpoint_policy=policy, **kw)
    est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= 0.01 * meas["peak_bytes"], (est.peak_bytes, meas["peak_bytes"])
    assert est.peak_phase == meas["peak_phase"]
    full = estimate_training(cfg, TrainSpec(b, s, precision, "adamw", checkpointing=True, **kw))
    assert full.peak_bytes < est.peak_bytes  # the policy keeps more than full checkpointing


@pytest.mark.parametrize("policy,precision,accum", [("every:2", "fp32", 2), ("selective", "bf16-amp", 3)])
def test_policy_with_grad_accum_in_full_training(policy, precision, accum):
    """A later micro-batch's sweep runs with every .grad alive (planner/estimate/ckpt_policy.py): its backward phase
    to the byte but the tracker's 4 B (a small vocabulary: the sweep decides it), above one micro-batch's."""
    from planner.estimate.training import estimate_training

    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    spec = TrainSpec(2, 64, precision, "adamw", checkpointing=True, checkpoint_policy=policy, grad_accum=accum)
    est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= 0.01 * meas["peak_bytes"], (est.peak_bytes, meas["peak_bytes"])
    assert est.peak_phase == meas["peak_phase"]
    assert abs(est.phase_peak_bytes["backward"] - meas["phase_peak_bytes"]["backward"]) <= 16
    one = estimate_training(cfg, TrainSpec(2, 64, precision, "adamw", checkpointing=True, checkpoint_policy=policy))
    assert est.phase_peak_bytes["backward"] > one.phase_peak_bytes["backward"]
    assert any(k.startswith("later micro-batch: ") for k in est.backward_points)


@pytest.mark.parametrize("policy,targets", [("selective", None), ("every:2", "all-linear")])
def test_policy_on_a_quantized_base(policy, targets):
    """QLoRA under a policy (planner/estimate/quantized.py): the quantized Linears' forward is bitsandbytes'
    gemm_4bit custom op, which torchtitan's policy neither saves nor counts among the mms (only the adapters' are)."""
    pytest.importorskip("bitsandbytes")
    from planner.estimate.training import estimate_training

    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    kw = dict(lora_r=8, quantize_base="nf4", **({"lora_targets": targets} if targets else {}))
    spec = TrainSpec(2, 64, "bf16", "adamw", checkpointing=True, checkpoint_policy=policy, **kw)
    est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
    assert abs(est.peak_bytes - meas["peak_bytes"]) <= 0.01 * meas["peak_bytes"], (est.peak_bytes, meas["peak_bytes"])
    assert est.peak_phase == meas["peak_phase"]
    for phase in ("loss", "backward"):
        assert abs(est.phase_peak_bytes[phase] - meas["phase_peak_bytes"][phase]) <= 16, phase
    assert simulate_training(cfg, spec)["peak_bytes"] == meas["peak_bytes"]


BOOK4 = GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3, n_layers=4, drop_rate=0.0, qkv_bias=False)


@pytest.mark.parametrize("cfg,kw,policy,precision", [
    (BOOK4, {"lora_r": 8, "lora_targets": "W_query,W_value"}, "every:2", "fp32"),  # the last block not checkpointed
    (GPT2Config(vocab_size=300, context_length=64, emb_dim=32, n_heads=2, n_layers=5, drop_rate=0.1),
     {"lora_r": 4, "lora_targets": "all-linear"}, "every:4", "bf16"),  # the last block checkpointed
    (BOOK4, {"train_layers": "last:2"}, "every:3", "bf16")])
def test_book_gpt2_every_k_with_finetuning(cfg, kw, policy, precision):
    """The book's own fine-tuning walk under every:K (planner/arch/gpt2_book.py _checkpointed): checkpointed
    blocks keep their input, the others their saved set and their points as without checkpointing; every phase to
    the byte."""
    from planner.estimate.training import estimate_training

    spec = TrainSpec(2, 48, precision, "adamw", checkpointing=True, checkpoint_policy=policy, **kw)
    est, meas = estimate_training(cfg, spec), measure_training(cfg, spec)
    assert est.phase_peak_bytes == meas["phase_peak_bytes"]
    assert est.peak_phase == meas["peak_phase"]


def test_book_gpt2_selective_with_finetuning():
    """The book's own walk under selective (planner/arch/gpt2_book.py _checkpointed): each block with a graph keeps
    the outputs torchtitan's policy saves, counted in the book's op order (W_key first), with LoRA's adapter
    matmuls; a frozen block without a graph keeps none (last:1 = full checkpointing's peak); every phase to the
    byte."""
    from planner.estimate.training import estimate_training

    for kw in ({"lora_r": 8, "lora_targets": "W_query,W_value"}, {"train_layers": "last:1"}):
        spec = TrainSpec(2, 32, "fp32", "adamw", checkpointing=True, checkpoint_policy="selective", **kw)
        est, meas = estimate_training(BOOK4, spec), measure_training(BOOK4, spec)
        assert est.phase_peak_bytes == meas["phase_peak_bytes"], kw
        full = estimate_training(BOOK4, TrainSpec(2, 32, "fp32", "adamw", checkpointing=True, **kw))
        assert (est.peak_bytes > full.peak_bytes) == ("lora_r" in kw)


@pytest.mark.parametrize("policy,precision", [("every:2", "fp32"), ("selective", "fp32"), ("selective", "bf16-amp")])
def test_book_gpt2_policy_with_grad_accum(policy, precision):
    """The book's GPT-2 under a policy with --grad-accum 2 (planner/estimate/ckpt_policy.py over the book's own
    later-micro-batch points, planner/arch/gpt2_book.py block_points): the measured step's backward to the tracker's
    8 B, the peak's phase the same (selective fp32 was +1.11% before: ff.layers.2's grads counted at the GELU)."""
    from planner.estimate.training import estimate_training

    spec = TrainSpec(2, 32, precision, "adamw", checkpointing=True, checkpoint_policy=policy, grad_accum=2)
    est, meas = estimate_training(BOOK4, spec), measure_training(BOOK4, spec)
    assert est.peak_phase == meas["peak_phase"]
    assert 0 <= meas["phase_peak_bytes"]["backward"] - est.phase_peak_bytes["backward"] <= 8
    assert 0 <= meas["peak_bytes"] - est.peak_bytes <= 8
    assert any(k.startswith("later micro-batch: ") for k in est.backward_points)


def test_new_rows_keeps_the_sections_measured_rows(tmp_path):
    """`bench checkpoint-policies --new-rows` (bench/techniques.py kept_policy_rows): the section's rows keep
    their measured and simulated bytes and measured phase, its full-size table is kept, other sections are not read."""
    from bench.techniques import CKPT_HEADING, kept_policy_rows

    doc = tmp_path / "acc.md"
    doc.write_text("# Other\n\n| a | every:2 | 1 | 2 | +0% | +0 | x / y | 1% |\n\n" + CKPT_HEADING + "\n\ntext\n\n"
                   "| config | policy | estimate | measured | error | simulated - measured (B) | phase est / meas | recompute |\n"
                   "|---|---|---:|---:|---:|---:|---|---:|\n"
                   "| llama L4 b2 s64 fp32 | every:2 | 6,569,952 | 6,569,956 | -0.000% | +4 | backward / loss | 13% |\n\n"
                   "Full size, one preset per family, b1 bf16-AMP AdamW (formula vs the simulated step):\n\n| m |\n\n"
                   "Worst full-size |formula - simulation| 0.000%.\n\n# Next\n\nbody\n")
    kept, full = kept_policy_rows(doc)
    assert kept == {("llama L4 b2 s64 fp32", "every:2"): {"measured_bytes": 6569956, "simulated_bytes": 6569960,
                                                         "measured_phase": "loss"}}
    assert full[0].startswith("Full size") and full[-1].startswith("Worst full-size")
    assert kept_policy_rows(tmp_path / "missing.md") == ({}, [])
