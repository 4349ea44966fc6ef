"""The one step model (issue #19 item 1): every mode's phases come from planner/estimate/step.py, and a family's
fine-tuning walk lives in its own planner/arch file (the book's GPT-2 has no file of its own in estimate/)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from planner.estimate import step

ROOT = Path(__file__).resolve().parent.parent


def test_phases_are_the_base_plus_each_phase_terms():
    s = step.Step(base=1000, grads=100, forward=50, loss=70, backward=[30, 200, 100], optimizer_tmp=40, every_phase=1)
    phase = step.phases(s)
    assert list(phase) == list(step.PHASES)
    assert phase == {"forward": 1000 + 50 + 1, "loss": 1000 + 70 + 1, "backward": 1000 + 200 + 1,
                     "optimizer": 1000 + 100 + 40 + 1, "zero_grad": 1000 + 100 + 1}
    assert step.peak(phase) == ("backward", 1201)
    # the first of equal phases wins (the tracker's order)
    assert step.peak({"forward": 5, "loss": 5, "backward": 4, "optimizer": 5, "zero_grad": 1}) == ("forward", 5)


def test_shifted_adds_each_mode_term_where_it_lives():
    phase = {"forward": 10, "loss": 20, "backward": 30, "optimizer": 40, "zero_grad": 35}
    out = step.shifted(phase, every=1, forward=2, loss=3, after_backward=-5, backward_at_least=(25, 50))
    assert out == {"forward": 13, "loss": 24, "backward": 50, "optimizer": 36, "zero_grad": 31}
    assert phase["backward"] == 30  # the other step's phases are left as they were
    assert step.shifted(phase, backward_at_least=(25,))["backward"] == 30


def _phase_dict_literals(path: Path) -> list[int]:
    """Lines of dict literals that spell out a step's five phases (a phase dict built by hand)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if set(step.PHASES) <= keys:
                out.append(node.lineno)
    return out


# Still built by hand, and why: none (offload_act.py's device phases go through step.py since the merge)
NOT_YET: set[str] = set()


def test_no_estimator_builds_the_phase_dict_itself():
    found = {p.name: _phase_dict_literals(p) for p in (ROOT / "planner" / "estimate").glob("*.py")
             if p.name != "step.py"}
    by_hand = {name: lines for name, lines in found.items() if lines and name not in NOT_YET}
    assert not by_hand, f"phase dicts built outside planner/estimate/step.py: {by_hand}"


def test_the_book_gpt2_fine_tunes_from_its_family_file():
    from planner.arch import family_of
    from planner.config import preset

    assert not [p.name for p in (ROOT / "planner" / "estimate").glob("*.py") if "book" in p.name]
    family = family_of(preset("gpt2-small"))
    from planner.arch.base import Family

    assert family.own_finetune_step and type(family).finetune_step is not Family.finetune_step
    # no family file imports an estimator (the family is below the estimate)
    for path in (ROOT / "planner" / "arch").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith(("estimate", "planner.estimate")), path.name


@pytest.mark.parametrize("label, overrides", [
    ("full training", {}),
    ("LoRA on a decoder", dict(lora_r=4)),
    ("LoRA on the book's GPT-2", dict(lora_r=4, lora_targets="W_query,W_value")),
    ("frozen layers on the book's GPT-2, checkpointing", dict(train_layers="last:1", checkpointing=True)),
])
def test_every_mode_reports_the_largest_phase(label, overrides):
    from planner.arch.gpt2_book import GPT2Config
    from planner.arch.llama import LlamaConfig
    from planner.estimate.training import estimate_training
    from planner.spec import TrainSpec

    book = "book" in label
    cfg = (GPT2Config(vocab_size=97, context_length=32, emb_dim=96, n_heads=3, n_layers=2) if book else
           LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    est = estimate_training(cfg, TrainSpec(batch_size=2, seq_len=16, precision="fp32", optimizer="adamw", **overrides))
    assert list(est.phase_peak_bytes) == list(step.PHASES)
    assert (est.peak_phase, est.peak_bytes) == step.peak(est.phase_peak_bytes)
    # the phases after the backward hold the weights, buffers, batch, optimizer state and the grads
    persistent = est.params_bytes + est.buffers_bytes + est.inputs_bytes + est.optimizer_bytes
    assert est.phase_peak_bytes["zero_grad"] == persistent + est.grads_bytes
    assert est.phase_peak_bytes["forward"] > persistent
