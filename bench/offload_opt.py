"""Issue #24: `--offload-optimizer` measured, simulated and estimated on small configs (Llama, Gemma 2, HF GPT-2 and
the book's GPT-2; fp32 and bf16-AMP; checkpointing on and off). The step runs the plain-torch equivalent of torchao's
CPUOffloadOptimizer (planner/routines/offload_optim.py); the tracker counts its host copies and host AdamW states apart
(planner/measure/tracker.py host_scope), so each row has two figures: the device figure (for the CUDA check) and the
host bytes. Regenerate: `python -m planner bench offload --out docs/accuracy.md`."""
from __future__ import annotations

from planner.config import LlamaConfig
from planner.spec import TrainSpec


def grid() -> list[tuple[str, object, int, int]]:
    import importlib

    from planner.config import GPT2Config

    rows = [("llama V300 h48 a6 kv2 f96 L2", LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96,
                                                          num_hidden_layers=2, num_attention_heads=6,
                                                          num_key_value_heads=2, max_position_embeddings=128), 2, 32)]
    for arch, shown in (("gemma2", "gemma2"), ("gpt2", "gpt2-hf")):  # each family's first grid shape
        label, cfg, b, s = importlib.import_module(f"planner.arch.{arch}").FAMILY.grid_configs()[0]
        rows.append((f"{shown} {label.rsplit(' b', 1)[0]}", cfg, b, s))
    # the book's GPT-2 (bench/main.py FINETUNE_BOOK_SHAPES' second shape)
    rows.append(("gpt2 (book) V1000 h64 a4", GPT2Config(vocab_size=1000, context_length=64, emb_dim=64, n_heads=4,
                                                        n_layers=2), 2, 64))
    return rows


def rows() -> list[dict]:
    """One dict per run: estimate, measure and simulate, device and host, beside the fused AdamW step it replaces."""
    from .offload_act import offload_row

    out = []
    for label, cfg, b, s in grid():
        for prec in ("fp32", "bf16-amp"):
            for ckpt in (False, True):
                spec = TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_optimizer=True)
                got = offload_row(label, cfg, spec, TrainSpec(b, s, prec, "adamw", checkpointing=ckpt,
                                                              optimizer_impl="fused"), "host_optimizer_offload")
                if got is None:
                    continue
                row, est, m = got
                out.append({**row, "est_opt": est.phase_peak_bytes["optimizer"],
                            "meas_opt": m["measured"]["phase_peak_bytes"]["optimizer"],
                            "plain_opt": m["plain"]["phase_peak_bytes"]["optimizer"]})
    return out


def measured_lines() -> list[str]:
    rs = rows()
    from .offload_act import summary

    worst, worst_host, sim_equal = summary(rs)
    lines = ["## The mechanism measured on the CPU (a plain-torch equivalent)", "",
             "torchao cannot run on this CPU-only build, so `measure` / `simulate train --offload-optimizer --device "
             "cpu` run its plain-torch equivalent (planner/routines/offload_optim.py): the same tensors in the same "
             "order, per parameter of >= 4,096 elements a host copy and a host grad buffer made at construction, a "
             "post-accumulate-grad hook that copies each grad into its host buffer during backward, then per "
             "parameter the host AdamW(fused=True) step and `p.copy_(p_host)`; the smaller parameters keep one fused "
             "AdamW on the device. pin_memory is False here (pinning needs CUDA), so the host holds each copy at its "
             "own size: the pinned power-of-two rounding, the device's 512 B blocks and the side stream are CUDA-check "
             "terms. The tracker counts the host tensors apart: **device figure: for the CUDA check**. Estimate: "
             "planner/estimate/offload.py with `--device cpu`. \"Without\" is the same step with a fused AdamW on the "
             "device (torchao's kwargs), measured.", "",
             f"Worst device-peak error {worst:.2%}; worst host error {worst_host:.2%}; simulate = measure to the byte "
             f"(device and host): {'yes' if sim_equal else 'NO'}. Bar: 1%.", "",
             "| model | run | peak without offload (measured) | device peak: estimate | measured | simulated | error | "
             "phase (est / meas) | optimizer phase: without | with (est / meas) | host: estimate | measured | "
             "simulated | host error |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        lines.append(
            f"| {r['model']} | {r['run']} | {r['plain_peak']:,} | {r['est_peak']:,} | {r['meas_peak']:,} | "
            f"{r['sim_peak']:,} | {r['est_peak'] / r['meas_peak'] - 1:+.3%} | {r['est_phase']} / {r['meas_phase']} | "
            f"{r['plain_opt']:,} | {r['est_opt']:,} / {r['meas_opt']:,} | {r['est_host']:,} | {r['meas_host']:,} | "
            f"{r['sim_host']:,} | {r['est_host'] / r['meas_host'] - 1:+.3%} |")
    return lines
