"""LoRA on down_proj under checkpointing, the points after block 0's recompute (planner/estimate/finetune.py
recompute_points), against recorded measurements (tests/data/measured/*.jsonl: real steps, tests/test_recorded.py
measures one row of each grid again in a child)."""
from __future__ import annotations

import pytest

from planner.estimate.training import estimate_training
from planner.spec import TrainSpec

SLACK = 8  # the loss's two 4-byte 0-d tensors, alive through the backward, are left out of the sweep



@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_down_adapter_backward_point_with_a_large_rank(family):
    """LoRA r64 on a 32-wide model under checkpointing: the step's peak is lora_B's backward right after block 0's
    recompute (planner/estimate/finetune.py recompute_points: its weight grad and the b*s*r grad of lora_A's
    output), 49,160 B under the recorded measurement before (tests/data/measured/8bit.jsonl)."""
    from bench.recorded import RECORD_DIR, load
    from planner.config import config_from_dict

    label = f"{family} V97 h32 a4 kv2 tied b2 s256 lora r64 all-linear sdpa fp32 ckpt adamw-8bit"
    row = next(r for r in load(RECORD_DIR / "8bit.jsonl")[1] if r["label"] == label)
    est = estimate_training(config_from_dict(row["config"]), TrainSpec(**row["spec"]))
    assert max(est.backward_points, key=est.backward_points.get) == "block 0 down adapter backward"
    assert -SLACK <= est.peak_bytes - row["peak_bytes"] <= 0, (est.peak_bytes, row["peak_bytes"])
