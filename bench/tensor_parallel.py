"""Tensor parallel and FSDP2 + TP rows of `python -m planner bench distributed` (issue #23, no torch here).

Tiny Llama and Qwen2 configs under torchtitan's TP plan (planner/measure/tensor_parallel.py) on 2 and 4 real
gloo ranks and on the fake process group, against the formula (planner/estimate/distributed.py estimate_tp,
estimate_fsdp_tp; the shard arithmetic in planner/estimate/tensor_parallel.py); and the
published shapes (llama-3-8b, Llama-2-70B) at FSDP 8 x TP 8 and FSDP 128 x TP 8, formula against simulation.
"""
from __future__ import annotations

from planner.arch.llama import LlamaConfig
from planner.arch.qwen2 import Qwen2Config
from planner.config import ModelConfig
from planner.parallel import ParallelSpec
from planner.spec import TrainSpec

# GQA Llama (8 query heads over 4 KV heads: 4 divides both) and an MHA Qwen2 with its q/k/v biases; every width
# divides by 4 (TP shards heads, the MLP's intermediate width and the vocabulary evenly: planner.parallel).
TP_LLAMA = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64)
TP_QWEN = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)


def tp_grid(quick: bool = False) -> list[tuple[str, ModelConfig, TrainSpec, ParallelSpec]]:
    """{llama, qwen2} x {fp32 AdamW, bf16-AMP} x {checkpointing or not} over TP 2 / TP 4 / FSDP 2 x TP 2,
    and loss parallel on two rows."""
    rows = []
    for name, cfg, b, s in (("llama V320 h64 GQA", TP_LLAMA, 2, 16), ("qwen2 V512 h64", TP_QWEN, 2, 24)):
        for prec, opt, ckpt, pspec in (
                ("fp32", "adamw", False, ParallelSpec(2, "tp")),
                ("bf16-amp", "adamw", True, ParallelSpec(4, "tp")),
                ("fp32", "sgd", True, ParallelSpec(4, "fsdp+tp", tp=2)),
                ("bf16-amp", "adamw", False, ParallelSpec(4, "fsdp+tp", tp=2)),
                ("fp32", "adamw", False, ParallelSpec(2, "tp", loss_parallel=True)),
                ("bf16-amp", "sgd", True, ParallelSpec(4, "tp")),
        ):
            spec = TrainSpec(b, s, prec, opt, checkpointing=ckpt)
            label = f"{name} {pspec.label} {prec} {opt}{' ckpt' if ckpt else ''}"
            rows.append((label, cfg, spec, pspec))
    # torchtitan's SequenceParallel on the norms (--sequence-parallel; appended so the rows above keep their places)
    for name, cfg, b, s in (("llama V320 h64 GQA", TP_LLAMA, 2, 16), ("qwen2 V512 h64", TP_QWEN, 2, 24)):
        for prec, opt, ckpt, pspec in (
                ("fp32", "adamw", False, ParallelSpec(2, "tp", sequence_parallel=True)),
                ("bf16-amp", "adamw", True, ParallelSpec(4, "tp", sequence_parallel=True)),
                ("bf16-amp", "sgd", False, ParallelSpec(2, "tp", loss_parallel=True, sequence_parallel=True)),
        ):
            spec = TrainSpec(b, s, prec, opt, checkpointing=ckpt)
            rows.append((f"{name} {pspec.label} {prec} {opt}{' ckpt' if ckpt else ''}", cfg, spec, pspec))
    if quick:
        return [rows[0], rows[9]]
    return rows
