"""The book's generate_text_simple (no cache, the whole context recomputed per token): the estimate
(planner/arch/gpt2_book.py estimate_generate_text_simple) against the live-bytes measurement, to the byte, in
both phases."""
import pytest

from planner.arch import families
from planner.estimate.inference import estimate_inference
from planner.infer_spec import InferSpec

# (vocab, emb, heads, layers, ctx, b, p, n, attention, precision, the high point that decides the peak): the MLP's
# GELU, eager attention's scores, the head's logits and the token selection's cat each decide one
CASES = [(97, 32, 2, 2, 64, 2, 16, 4, "eager", "fp32", "MLP (GELU)"),
         (97, 32, 2, 1, 64, 1, 1, 1, "eager", "bf16", "attention"),
         (500, 16, 4, 3, 128, 3, 60, 5, "eager", "fp32", "attention"),
         (500, 16, 4, 3, 128, 3, 60, 5, "sdpa", "bf16", "head (logits)"),
         (2000, 16, 2, 1, 32, 1, 1, 1, "sdpa", "fp32", "cat (idx)")]


def _run(case):
    V, h, a, L, ctx, b, p, n, attention, precision, _ = case
    cfg = families()["gpt2"].config_cls(vocab_size=V, context_length=ctx, emb_dim=h, n_heads=a, n_layers=L,
                                        attention=attention)
    return cfg, InferSpec(b, p, n, precision=precision, cache="none")


@pytest.mark.parametrize("case", CASES, ids=[f"{c[-1]}-{c[8]}-{c[9]}" for c in CASES])
def test_estimate_equals_measurement(case):
    from planner.measure.inference import measure_inference

    cfg, ispec = _run(case)
    est, m = estimate_inference(cfg, ispec), measure_inference(cfg, ispec)
    assert est["phase_peak_bytes"] == {k: v for k, v in m["phase_peak_bytes"].items() if v}  # n = 1: no decode
    assert est["peak_bytes"] == m["peak_bytes"] and est["peak_phase"] == m["peak_phase"]
    assert est["persistent_bytes"] == m["persistent_bytes"]


def test_each_case_peaks_where_it_says():
    """The cases above are not one point repeated: each one's peak is at its named high point (the note says
    where), and that point's term is the peak above what is kept."""
    for case in CASES:
        cfg, ispec = _run(case)
        est = estimate_inference(cfg, ispec)
        ph = est["peak_phase"]
        assert f"the peak is at its {case[-1]} ({ph})" in est["notes"][0]
        term = next(t for t in est["terms"] if t["where"] == ph and t["name"].endswith(f": {case[-1]}"))
        assert est["persistent_bytes"] + term["bytes"] == est["peak_bytes"]
