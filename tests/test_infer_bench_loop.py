"""The inference grids' child loop is one (bench/inference.py _run_rows), shared by bench inference and
bench inference-caches: each row's measure and simulate records, and the caches grid's figures made from them
exactly as its own loop made them (the dicts below are what that loop printed for these fake runs)."""
import json

from bench import infer_caches, inference
from planner.config import LlamaConfig, config_to_dict
from planner.infer_spec import InferSpec

ERR = "x" * 300  # the child keeps 200 characters of an exception's text


def fake(kind):
    def run(cfg, ispec):  # batch 2: the measurement fails; batch 3: both fail
        if (kind == "m" and ispec.batch_size == 2) or ispec.batch_size == 3:
            raise RuntimeError(f"{kind} failed at b{ispec.batch_size} {ERR}")
        peak = 1000 * ispec.batch_size + (7 if kind == "s" else 0)
        return {"peak_bytes": peak, "peak_phase": "prefill" if kind == "m" else "decode",
                "phase_peak_bytes": {"prefill": peak, "decode": peak - 1}, "other": 1}
    return run


def test_one_child_loop_feeds_both_grids(monkeypatch, capsys):
    import planner.measure.inference as measure
    import planner.measure.simulate_infer as simulate

    monkeypatch.setattr(measure, "measure_inference", fake("m"))
    monkeypatch.setattr(simulate, "simulate_inference", fake("s"))
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    inference._run_rows([{"config": config_to_dict(cfg), "spec": InferSpec(b, 8, 2).to_dict()} for b in (1, 2, 3)])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    m_err, s_err = f"RuntimeError: m failed at b2 {ERR}"[:214], f"RuntimeError: s failed at b3 {ERR}"[:214]
    assert records[0] == {"measure": {"peak_bytes": 1000, "peak_phase": "prefill",
                                      "phase_peak_bytes": {"prefill": 1000, "decode": 999}},
                          "simulate": {"peak_bytes": 1007, "peak_phase": "decode",
                                       "phase_peak_bytes": {"prefill": 1007, "decode": 1006}}}
    assert records[1]["measure"] == {"error": m_err} and records[2]["simulate"]["error"].startswith("RuntimeError: s")
    caches = [infer_caches._record(r["measure"], r["simulate"]) for r in records]
    assert caches == [
        {"measured": 1000, "measured_phases": {"prefill": 1000, "decode": 999}, "phase": "prefill", "simulated": 1007,
         "simulated_phases": {"prefill": 1007, "decode": 1006}},
        {"error": "measured: " + m_err, "simulated": 2007, "simulated_phases": {"prefill": 2007, "decode": 2006},
         "phase": "decode"},
        {"error": "simulated: " + s_err}]
