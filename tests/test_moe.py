"""Mixture-of-Experts (transformers' Mixtral, Qwen2-MoE, Qwen3-MoE): the fake step equals the real one to the byte.

transformers 5.23 runs the experts with `aten._grouped_mm` on the CPU; its fake kernel refuses non-bf16 inputs
where the real CPU kernel runs them (planner/measure/simulate.py, "Grouped GEMM on the CPU")."""
import pytest

from planner.measure.simulate import simulate_training
from planner.spec import TrainSpec
from test_simulate import _measure_module

MOE_MODULES = '''
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

def mixtral():
    return AutoModelForCausalLM.from_config(MixtralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256))

def qwen2_moe():
    return AutoModelForCausalLM.from_config(Qwen2MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=256))

def qwen3_moe():
    return AutoModelForCausalLM.from_config(Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=256))
'''


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "moe_modules.py"
    path.write_text(MOE_MODULES)
    return path


@pytest.mark.parametrize("func,precision", [("mixtral", "fp32"), ("mixtral", "bf16-amp"),
                                            ("qwen2_moe", "bf16-amp"), ("qwen3_moe", "fp32")])
def test_moe_step_simulated_equals_measured(moe_file, func, precision):
    """The issue's case: fp32 and bf16-AMP exited 2 ("Expected inputs of BF16 type") before; now equal to the byte."""
    import torch._meta_registrations as meta

    original = meta._meta_grouped_mm_common
    spec = TrainSpec(2, 16, precision, "adamw")
    sim = simulate_training(None, spec, module=(str(moe_file), func))
    assert meta._meta_grouped_mm_common is original  # the CPU meta is only in place while the steps run
    meas = _measure_module(moe_file, func, spec)
    assert sim["peak_bytes"] == meas["peak_bytes"]
    assert sim["persistent_bytes"] == meas["persistent_bytes"]
    assert sim["phase_peak_bytes"] == {p: meas["phase_peak_bytes"].get(p, 0) for p in sim["phase_peak_bytes"]}
