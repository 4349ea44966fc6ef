"""GPT-2's Conv1D under bitsandbytes (transformers' replace_with_bnb_linear takes Conv1D as a linear of
in, out = weight.shape): the simulated nf4 model quantizes it as the real load does, and int8's one fp32 scale
per output row counts the Conv1D's outputs (weight (in, out)), not its inputs."""
import dataclasses

import pytest

from planner.arch import families
from planner.estimate.inference import estimate_inference
from planner.infer_spec import InferSpec

pytest.importorskip("bitsandbytes")


def _gpt2_hf():
    # widths bitsandbytes' CPU 4-bit kernel takes (out % 32, in % 64), c_attn 64 -> 192 and c_fc 64 -> 256 not square
    cfg = families()["gpt2-hf"].grid_configs()[0][1]
    return dataclasses.replace(cfg, n_embd=64, n_head=4, n_inner=None, vocab_size=128, n_layer=1)


def test_conv1d_linears_read_in_and_out_from_the_weight():
    from planner.estimate.quantized import quantized_linears

    lin = {x.module.split(".")[-2] + "." + x.module.split(".")[-1]: x for x in quantized_linears(_gpt2_hf())}
    assert (lin["attn.c_attn"].n_in, lin["attn.c_attn"].n_out) == (64, 192)
    assert (lin["mlp.c_fc"].n_in, lin["mlp.c_fc"].n_out) == (64, 256)
    assert (lin["mlp.c_proj"].n_in, lin["mlp.c_proj"].n_out) == (256, 64)


def test_nf4_simulated_and_int8_estimated_equal_the_measurement():
    from planner.measure.inference import measure_inference
    from planner.measure.simulate_infer import simulate_inference

    cfg = _gpt2_hf()
    nf4 = InferSpec(2, 16, 2, precision="fp32", quantize_weights="nf4")
    m, s, est = measure_inference(cfg, nf4), simulate_inference(cfg, nf4), estimate_inference(cfg, nf4)
    assert m["persistent_bytes"] == s["persistent_bytes"] == est["persistent_bytes"]
    assert s["peak_bytes"] == m["peak_bytes"]  # the Conv1Ds quantized in the fake model too
    i8 = InferSpec(2, 16, 2, precision="fp32", quantize_weights="int8")
    m8, e8 = measure_inference(cfg, i8), estimate_inference(cfg, i8)
    assert m8["persistent_bytes"] == e8["persistent_bytes"]
