"""The Planner page's computation (planner.plan): one call, its figures and its curves' ranges."""
import dataclasses

from planner.config import PRESETS, GPT2Config
from planner.estimate.training import CUDA_CONTEXT_BYTES, estimate_training
from planner.fit import max_batch_size, max_seq_len
from planner.plan import curve_end, nice_ceil, plan
from planner.spec import TrainSpec

GPT = GPT2Config(vocab_size=1000, context_length=128, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.1)


def test_plan_agrees_with_the_solvers_and_the_estimate():
    spec, budget = TrainSpec(4, 64), 30 * 2**20
    p = plan(GPT, spec, budget)
    assert p.estimate.peak_bytes == estimate_training(GPT, spec).peak_bytes
    assert (p.max_batch, p.max_batch_reason) == max_batch_size(GPT, spec, budget)
    assert (p.max_seq, p.max_seq_reason) == max_seq_len(GPT, spec, budget)
    assert p.tensor_budget_bytes == budget and p.cuda_context_bytes == 0
    at_peak = [r for r in p.breakdown if r["scenario"].startswith("at the peak")]
    assert sum(r["bytes"] for r in at_peak) == p.estimate.peak_bytes
    for row in p.batch_curve:
        assert row["peak_bytes"] == estimate_training(GPT, dataclasses.replace(spec, batch_size=row["batch"])).peak_bytes


def test_on_cuda_the_context_is_its_own_line():
    from planner.fit import ALLOCATOR_RESERVE

    spec = TrainSpec(4, 64, device="cuda")
    p = plan(GPT, spec, 2**30)
    # less the context and the allocator's reserve (the worst share of a peak measured on an H200: planner/fit.py)
    usable = int((2**30 - CUDA_CONTEXT_BYTES) / (1 + ALLOCATOR_RESERVE[False]))
    assert p.cuda_context_bytes == CUDA_CONTEXT_BYTES and p.tensor_budget_bytes == usable
    assert p.max_batch == max_batch_size(GPT, spec, usable)[0]


def test_curves_are_integer_and_end_where_the_budget_stays_readable():
    assert [nice_ceil(x) for x in (1, 3, 11, 24, 26, 240, 1300)] == [1, 5, 20, 25, 50, 250, 2000]
    assert curve_end(1024, 512, 1024) == 1024          # the full context fits: the curve ends at the context
    assert curve_end(300, 100, 131072) == 1000         # a long context: twice the crossing, rounded up
    assert curve_end(300, 4000, 131072) == 4000        # never before the current setting
    cfg, spec = PRESETS["llama-3.2-1b"], TrainSpec(1, 2048)
    p = plan(cfg, spec, 24 * 2**30)
    seqs = [r["seq"] for r in p.seq_curve]
    assert all(isinstance(s, int) for s in seqs) and seqs == sorted(set(seqs))
    assert p.max_seq < seqs[-1] <= 2.5 * p.max_seq < cfg.max_seq_len  # the crossing is in view
    assert p.seq_curve[-1]["peak_bytes"] < 4 * p.tensor_budget_bytes   # so the budget line is not squashed
