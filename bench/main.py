"""Benchmarks: estimate against measurement over a grid of configs, and the planner's own speed.

    python -m planner bench accuracy [--quick] [--out docs/accuracy.md]
    python -m planner bench speed
    python -m planner bench simulate [--quick] [--out docs/accuracy.md]   (bench/simulate.py)

Each accuracy row is a real training step measured in a fresh child process (planner.runner), so
the numbers are the ones `python -m planner measure train` prints.
"""
from __future__ import annotations

import datetime
import itertools
import platform
import time
from dataclasses import fields, replace

from .common import FINETUNE_GAP_BAR_PCT, _cpu_count, _torch_version, _version, finetune_gap, write_section  # noqa: F401 (re-exported)
from planner.config import GPT2Config, LlamaConfig, ModelConfig
from planner.estimate.training import estimate_training
from planner.reference import NOTEBOOK_GPT2_XL
from planner.spec import PRECISIONS, TORCH_OPTIMIZERS, TrainSpec

ACCURACY_BAR_PCT = 2.0  # issue #3: worst |error| on CPU


def _gpt(**kw) -> GPT2Config:
    base = dict(vocab_size=50257, context_length=256, emb_dim=128, n_heads=4, n_layers=2, drop_rate=0.0,
                qkv_bias=True)
    return GPT2Config(**{**base, **kw})


def _llama(**kw) -> LlamaConfig:
    base = dict(vocab_size=32000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaConfig(**{**base, **kw})


# The accuracy grids' shapes (label, book GPT-2 kwargs, Llama kwargs, batch, seq): odd head counts, short and
# long sequences, tiny and GPT-2-sized vocabularies (the CPU grid here, the CUDA grid in bench/gpu.py).
GRID_SHAPES = [
    ("V50257 h128 a4", {}, {}, 2, 128),
    ("V97 h96 a3 s8", dict(vocab_size=97, emb_dim=96, n_heads=3), dict(vocab_size=97, hidden_size=96,
                                                                        num_attention_heads=3,
                                                                        num_key_value_heads=1), 4, 8),
    ("V1000 h120 a5 s200", dict(vocab_size=1000, emb_dim=120, n_heads=5, n_layers=3),
     dict(vocab_size=1000, hidden_size=120, num_attention_heads=5, num_key_value_heads=5,
          intermediate_size=320, num_hidden_layers=3), 3, 200),
    ("V50257 h112 a7 s256", dict(emb_dim=112, n_heads=7), dict(hidden_size=112, num_attention_heads=7,
                                                                num_key_value_heads=1), 1, 256),
]


def accuracy_grid(quick: bool = False) -> list[tuple[str, ModelConfig, TrainSpec]]:
    """Both architectures x attention x precision x checkpointing, cycling optimizers, dropout and
    shapes (odd head counts, short and long sequences, tiny and GPT-2-sized vocabularies)."""
    rows = []
    cycle = itertools.count()
    for (label, gkw, lkw, b, s), arch, attention, precision, ckpt in itertools.product(
            GRID_SHAPES, ("gpt2", "llama"), ("eager", "sdpa"), PRECISIONS, (False, True)):
        i = next(cycle)
        if i % 3:  # a third of the full product keeps the grid under ~5 minutes on 2 cores
            continue
        optimizer = TORCH_OPTIMIZERS[(i // 3) % len(TORCH_OPTIMIZERS)]
        if arch == "gpt2":
            cfg = _gpt(**gkw, attention=attention, drop_rate=0.1 if (i // 3) % 2 else 0.0)
        else:
            cfg = _llama(**lkw, attention=attention)
        spec = TrainSpec(batch_size=b, seq_len=s, precision=precision, optimizer=optimizer, checkpointing=ckpt,
                         grad_accum=2 if i % 7 == 0 else 1)
        drop = f" p{cfg.drop_rate}" if arch == "gpt2" else ""
        rows.append((f"{arch} {label}{drop} {attention} {precision}{' ckpt' if ckpt else ''} {optimizer}"
                     f"{' accum2' if spec.grad_accum > 1 else ''}", cfg, spec))
    if quick:
        return rows[::6]
    return rows


FAMILY_BAR_PCT = 1.0  # issue #10: every family within 1% of transformers' measured model


def family_grid(family: str, quick: bool = False) -> list[tuple[str, ModelConfig, TrainSpec]]:
    """One family's tiny configs (planner/arch/<family>.py grid_configs) x the four precisions x its
    attention kernels x checkpointing off/on, alternating AdamW and SGD (every 7th with two micro-batches).
    quick: one row per shape and precision, for the tests."""
    from planner.arch import families

    fam = families()[family]
    rows = []
    i = 0
    for shape_i, (label, cfg, b, s) in enumerate(fam.grid_configs()):
        kernels = [k for k in ("eager", "sdpa") if k in fam.attention_kinds(cfg)]
        for prec_i, precision in enumerate(PRECISIONS):
            combos = list(itertools.product(kernels, (False, True)))
            for combo_i, (attention, ckpt) in enumerate(combos):
                i += 1
                if quick and combo_i != (shape_i + prec_i) % len(combos):
                    continue
                optimizer = ("adamw", "sgd")[i % 2]
                spec = TrainSpec(batch_size=b, seq_len=s, precision=precision, optimizer=optimizer,
                                 checkpointing=ckpt, grad_accum=2 if i % 7 == 0 else 1)
                rows.append((f"{family} {label} {attention} {precision}{' ckpt' if ckpt else ''} {optimizer}"
                             f"{' accum2' if spec.grad_accum > 1 else ''}", replace(cfg, attention=attention), spec))
    return rows


FINETUNE_BAR_PCT = 1.0  # issue #12: fine-tuning estimates within 1% of the measured step
FINETUNE_FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "gemma", "gemma2")  # the families whose fine-tuning terms are measured (lora_supported)
FINETUNE_QLORA_FAMILIES = ("llama", "qwen2", "mistral", "qwen3")  # QLoRA measured on these (qlora_supported)
# (label, TrainSpec fine-tuning fields): trainable subsets, and peft LoRA on attention only (peft's default
# q_proj/v_proj, or all four projections) and on every linear layer, with lora_dropout 0 and 0.1
FINETUNE_MODES = [
    ("last:1", dict(train_layers="last:1")),
    ("head", dict(train_layers="head")),
    ("lora r4 q,v", dict(lora_r=4)),
    ("lora r16 q,k,v,o p0.1", dict(lora_r=16, lora_targets="q_proj,k_proj,v_proj,o_proj", lora_dropout=0.1)),
    ("lora r4 all-linear p0.1", dict(lora_r=4, lora_targets="all-linear", lora_dropout=0.1)),
    ("lora r16 all-linear", dict(lora_r=16, lora_targets="all-linear")),
    # LoRA on the MLP only, no dropout: under checkpointing the recompute's high points
    # (planner/estimate/finetune.py recompute_points) decide, with nothing saved by attention adapters
    ("lora r8 mlp", dict(lora_r=8, lora_targets="gate_proj,up_proj,down_proj")),
    # gradient accumulation: the second micro-batch runs with the first one's trainable grads alive
    ("accum2 last:1", dict(train_layers="last:1", grad_accum=2)),
    ("accum2 lora r8 all-linear", dict(lora_r=8, lora_targets="all-linear", grad_accum=2)),
]


# Fine-tuning measured later (issue #19): Phi-3's fused qkv_proj / gate_up_proj and the MoE families' sparse blocks
# (router, experts, Qwen2-MoE's shared expert), walked by planner/arch/saved.py (moe.py saved_mlp), on a smaller
# grid: each family's first two grid shapes x these modes. "lora r8 default" is peft's default targets
# (peft/utils/constants.py maps mixtral only; phi3, qwen2_moe and qwen3_moe have none: the row is left out),
# "lora r8 attention" every attention projection (planner/finetune.py target_choices: Phi-3's qkv_proj and o_proj);
# all-linear adapts every nn.Linear but the head: a MoE's router and experts are no Linears (moe.py lora_module),
# so it adds Qwen2-MoE's shared expert and shared_expert_gate and nothing more on Mixtral / Qwen3-MoE
FINETUNE_WALKED_FAMILIES = ("phi3", "qwen2_moe", "mixtral", "qwen3_moe")
FINETUNE_WALKED_MODES = [
    ("last:1", dict(train_layers="last:1")),
    ("lora r8 default", dict(lora_r=8)),
    ("lora r8 attention", dict(lora_r=8, lora_targets="attention")),
    ("lora r8 all-linear", dict(lora_r=8, lora_targets="all-linear")),
    ("lora r4 all-linear p0.1", dict(lora_r=4, lora_targets="all-linear", lora_dropout=0.1)),
]


def walked_modes(fam, cfg) -> list[tuple[str, dict]]:
    """FINETUNE_WALKED_MODES on this family: "attention" resolved to its attention projections, the default
    targets' row left out where peft maps none."""
    from planner.finetune import target_choices

    out = []
    for mode, kw in FINETUNE_WALKED_MODES:
        if kw.get("lora_r") and "lora_targets" not in kw and not fam.lora_default_targets:
            continue
        if kw.get("lora_targets") == "attention":
            kw = {**kw, "lora_targets": target_choices(cfg)["attention"]}
        out.append((mode, kw))
    return out


def finetune_grid(quick: bool = False, families_: tuple[str, ...] = FINETUNE_FAMILIES + FINETUNE_WALKED_FAMILIES
                  ) -> list[tuple[str, ModelConfig, TrainSpec]]:
    """Fine-tuning rows (issue #12): each family's tiny configs (planner/arch/<family>.py grid_configs) x
    FINETUNE_MODES x fp32 / a bf16 base (peft keeps the adapters fp32) x checkpointing off/on, attention
    kernels and AdamW/SGD alternating; the FINETUNE_WALKED_FAMILIES on their first two shapes x their
    walked_modes. A tied head is the input embedding, so "head" is skipped there.
    quick: every 23rd row (the tests; 23 rows over the four families' 9 modes)."""
    from planner.arch import families

    rows = []
    i = 0
    for family in families_:
        fam = families()[family]
        walked = family in FINETUNE_WALKED_FAMILIES
        for label, cfg, b, s in fam.grid_configs()[:2] if walked else fam.grid_configs():
            kernels = [k for k in ("eager", "sdpa") if k in fam.attention_kinds(cfg)]
            for mode, kw in walked_modes(fam, cfg) if walked else FINETUNE_MODES:
                if kw.get("train_layers") == "head" and fam.tied(cfg):
                    continue
                for precision, ckpt in itertools.product(("fp32", "bf16"), (False, True)):
                    i += 1
                    attention = kernels[(i // 2) % len(kernels)]
                    optimizer = ("adamw", "sgd")[i % 2]
                    spec = TrainSpec(batch_size=b, seq_len=s, precision=precision, optimizer=optimizer,
                                     checkpointing=ckpt, **kw)
                    rows.append((f"{family} {label} {mode} {attention} {precision}{' ckpt' if ckpt else ''} "
                                 f"{optimizer}", replace(cfg, attention=attention), spec))
    return rows[::23] if quick else rows  # 23: prime to the 4 precision x checkpointing rows of a mode


# The book's GPT-2 (issue #12 item 2; planner/arch/gpt2_book.py finetune_step): peft has no default targets for a
# custom module, so LoRA names the book's Linears (attention's W_query/W_value, or all-linear: every Linear
# but out_head, expanded by planner/finetune.py lora_target_names)
FINETUNE_BOOK_MODES = [
    ("last:1", dict(train_layers="last:1")),
    ("head", dict(train_layers="head")),
    ("lora r4 W_query,W_value", dict(lora_r=4, lora_targets="W_query,W_value")),
    ("lora r4 W_query,W_value p0.1", dict(lora_r=4, lora_targets="W_query,W_value", lora_dropout=0.1)),
    ("lora r16 all-linear", dict(lora_r=16, lora_targets="all-linear")),
    ("lora r16 all-linear p0.1", dict(lora_r=16, lora_targets="all-linear", lora_dropout=0.1)),
]
# (label, GPT2Config kwargs, batch, seq): one shape whose backward peaks inside a block (few tokens, a tiny
# vocabulary), one where the logits and the attention's s^2 tensors weigh alike, and one whose s^2 tensors
# decide it (a long sequence on a narrow model)
FINETUNE_BOOK_SHAPES = [
    ("V97 h96 a3 s8", dict(vocab_size=97, context_length=32, emb_dim=96, n_heads=3, n_layers=2), 4, 8),
    ("V1000 h64 a4 s64", dict(vocab_size=1000, context_length=64, emb_dim=64, n_heads=4, n_layers=2), 2, 64),
    ("V97 h32 a4 s128", dict(vocab_size=97, context_length=128, emb_dim=32, n_heads=4, n_layers=2), 2, 128),
]


def finetune_book_grid(quick: bool = False) -> list[tuple[str, ModelConfig, TrainSpec]]:
    """The book's GPT-2 rows: FINETUNE_BOOK_SHAPES x drop_rate 0 / 0.1 (qkv_bias alternating) x
    FINETUNE_BOOK_MODES x fp32 / a bf16 base x checkpointing off/on (GPTModel's per-block
    torch.utils.checkpoint), AdamW and SGD alternating; its own attention (eager; sdpa is not modelled yet
    for the book's fine-tuning). quick: every 7th row (the tests)."""
    rows = []
    i = 0
    for label, kw, b, s in FINETUNE_BOOK_SHAPES:
        for drop in (0.0, 0.1):
            for mode, fkw in FINETUNE_BOOK_MODES:
                for precision, ckpt in itertools.product(("fp32", "bf16"), (False, True)):
                    i += 1
                    qkv_bias = bool((i // 4) % 2)
                    optimizer = ("adamw", "sgd")[i % 2]
                    cfg = GPT2Config(**kw, drop_rate=drop, qkv_bias=qkv_bias, attention="eager")
                    spec = TrainSpec(batch_size=b, seq_len=s, precision=precision, optimizer=optimizer,
                                     checkpointing=ckpt, **fkw)
                    rows.append((f"gpt2 {label} p{drop}{' qkv_bias' if qkv_bias else ''} {mode} {precision}"
                                 f"{' ckpt' if ckpt else ''} {optimizer}", cfg, spec))
    return rows[::7] if quick else rows


FINETUNE_QUANT_BAR_PCT = 2.0  # issue #12: QLoRA (a bitsandbytes-quantized base) within 2% of the measured step
# (label, TrainSpec fields) of the QLoRA rows (planner/estimate/quantized.py): peft's recipe on a base that
# bitsandbytes quantized (nf4 / fp4, with and without double quantization), LoRA on attention (peft's default
# q_proj/v_proj, or all four projections) and on every linear layer, with lora_dropout 0 and 0.1
FINETUNE_QLORA_VARIANTS = [
    ("qlora nf4 r4 q,v", dict(quantize_base="nf4", lora_r=4)),
    ("qlora nf4 r16 all-linear", dict(quantize_base="nf4", lora_r=16, lora_targets="all-linear")),
    ("qlora nf4 dq r4 all-linear p0.1", dict(quantize_base="nf4", double_quant=True, lora_r=4,
                                             lora_targets="all-linear", lora_dropout=0.1)),
    ("qlora fp4 r16 q,k,v,o", dict(quantize_base="fp4", lora_r=16, lora_targets="q_proj,k_proj,v_proj,o_proj")),
]


def finetune_qlora_grid(quick: bool = False, families_: tuple[str, ...] = FINETUNE_QLORA_FAMILIES) -> list[tuple[str, ModelConfig, TrainSpec]]:
    """QLoRA rows: each family's tiny configs x FINETUNE_QLORA_VARIANTS x checkpointing off/on, attention kernels
    and AdamW/SGD alternating; bf16 compute (the recipe's). quick: every 5th row (the tests)."""
    from planner.arch import families

    rows = []
    i = 0
    for family in families_:
        fam = families()[family]
        shapes = list(fam.grid_configs())
        # one shape whose peak is a dequantized weight in the backward (planner/estimate/quantized.py
        # dequant_points): few tokens beside wide linears and a small vocabulary
        cfg0 = shapes[0][1]
        wide = dict(vocab_size=97, hidden_size=128, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                    tie_word_embeddings=False)
        if "head_dim" in {f.name for f in fields(cfg0)}:
            wide["head_dim"] = 32
        shapes.append(("V97 h128 f512 a4 kv2 untied b1 s4", replace(cfg0, **wide), 1, 4))
        for label, cfg, b, s in shapes:
            kernels = [k for k in ("eager", "sdpa") if k in fam.attention_kinds(cfg)]
            for mode, kw in FINETUNE_QLORA_VARIANTS:
                for ckpt in (False, True):
                    i += 1
                    attention = kernels[(i // 2) % len(kernels)]
                    optimizer = ("adamw", "sgd")[(i // 3) % 2]
                    spec = TrainSpec(batch_size=b, seq_len=s, precision="bf16", optimizer=optimizer,
                                     checkpointing=ckpt, **kw)
                    rows.append((f"{family} {label} {mode} {attention}{' ckpt' if ckpt else ''} {optimizer}",
                                 replace(cfg, attention=attention), spec))
    return rows[::5] if quick else rows


def qlora_markdown(results: list[dict], device: str) -> str:
    """The `# QLoRA ...` section of docs/accuracy.md: the worst |error| per part of the grid, then every row."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        mode = next((m for m, _ in FINETUNE_QLORA_VARIANTS if f" {m} " in r["config"]), "?")
        groups.setdefault(mode, []).append(r)
        groups.setdefault("checkpointing" if " ckpt" in r["config"] else "no checkpointing", []).append(r)
        groups.setdefault(r["config"].split(" ", 1)[0], []).append(r)
    worst = max(abs(r["error_pct"]) for r in results)
    lines = [f"# QLoRA: estimate vs measurement ({device})", "",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {_cpu_count()} cores, "
             f"Python {platform.python_version()}, torch {_torch_version()}, transformers {_version('transformers')}, "
             f"peft {_version('peft')}, bitsandbytes {_version('bitsandbytes')}.",
             "Command: `python -m planner bench finetune` (after the fine-tuning grid). Each row runs peft's QLoRA "
             "recipe (planner/routines/quantized.py): the family's tiny model built in bf16 and written with "
             "`save_pretrained`, loaded with `from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True, "
             "bnb_4bit_quant_type, bnb_4bit_compute_dtype=bf16, bnb_4bit_use_double_quant))`, "
             "`prepare_model_for_kbit_training(use_gradient_checkpointing=...)` and `get_peft_model`, and measures "
             "the exact peak of live tensor storage bytes of a steady-state step (step 3), the packed weights and "
             "their quantization statistics (absmax, codes, nested absmax) included.", "",
             f"**{len(results)} rows, worst |error| {worst:.3f}%** (bar: {FINETUNE_QUANT_BAR_PCT}%).", "",
             "| part of the grid | rows | worst \\|error\\| % |", "|---|---:|---:|"]
    for name, rows in groups.items():
        lines.append(f"| {name} | {len(rows)} | {max(abs(r['error_pct']) for r in rows):.3f} |")
    from planner.config import PRESETS
    from planner.estimate.training import estimate_training

    big = []
    for s in (2048, 8192):
        spec = TrainSpec(1, s, "bf16", checkpointing=True, lora_r=32, lora_targets="all-linear", quantize_base="nf4")
        t0 = time.perf_counter()
        e = estimate_training(PRESETS["llama-3-8b"], spec)
        big.append(f"seq {s}: {e.peak_bytes / 2**30:.2f} GiB in {e.peak_phase} (weights {e.params_bytes / 2**30:.2f} GiB; "
                   f"estimated in {1000 * (time.perf_counter() - t0):.0f} ms)")
    lines += ["", "Not modelled (known gaps): `--quantize-base int8` (refused by the estimate: bitsandbytes' CPU "
              "training path MatMul8bitFp keeps each linear's fp32 input and dequantizes the weight to fp32); the "
              "dequantized-weight points of o_proj, k_proj and v_proj, and of up_proj when it has an adapter "
              "(measured below down_proj's or q_proj's on these shapes); the "
              "weight gemm_4bit dequantizes inside one custom op in the forward is not seen by a dispatch-level "
              "tracker (the measured figures are live tensors seen op by op; on CUDA the allocator would see an "
              "out*in bf16 transient there).",
              "", "llama-3-8b, nf4, LoRA r=32 on all linear layers, batch 1, checkpointing (`python -m planner "
              "estimate train --model llama-3-8b --quantize-base nf4 --lora-r 32 --lora-targets all-linear "
              "--batch-size 1 --checkpointing --seq-len S`): " + "; ".join(big) + ".",
              "", "| config | estimate (B) | measured (B) | error % | est. phase | meas. phase |",
              "|---|---:|---:|---:|---|---|"]
    for r in results:
        lines.append(f"| {r['config']} | {r['estimate_bytes']:,} | {r['measured_bytes']:,} | "
                     f"{r['error_pct']:+.3f} | {r['estimated_phase']} | {r['measured_phase']} |")
    return "\n".join(lines) + "\n"


def finetune_markdown(results: list[dict], device: str, gaps: list[bool] | None = None) -> str:
    """The `# Fine-tuning ...` section of docs/accuracy.md: the worst |error| per part of the grid, then
    every row."""
    def part(label: str) -> str:
        for mode, _ in sorted(FINETUNE_MODES + FINETUNE_BOOK_MODES + FINETUNE_WALKED_MODES, key=lambda m: -len(m[0])):  # "accum2 last:1" before "last:1"
            if f" {mode} " in label:
                return mode
        return "?"
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(part(r["config"]), []).append(r)
        groups.setdefault("bf16 base" if " bf16" in r["config"] else "fp32 base", []).append(r)
        groups.setdefault("checkpointing" if " ckpt" in r["config"] else "no checkpointing", []).append(r)
    gaps = gaps or [False] * len(results)
    modelled = [r for r, g in zip(results, gaps) if not g]
    worst = max(abs(r["error_pct"]) for r in modelled)
    gap_rows = [r for r, g in zip(results, gaps) if g]
    gap_line = (f" {len(gap_rows)} more rows (marked *gap*: a bf16 base, checkpointing and LoRA on the MLP "
                f"projections, whose recompute transients are not modelled yet) reach "
                f"{max(abs(r['error_pct']) for r in gap_rows):.3f}%." if gap_rows else "")
    lines = [f"# Fine-tuning: estimate vs measurement ({device})", "",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {_cpu_count()} cores, "
             f"Python {platform.python_version()}, torch {_torch_version()}, transformers {_version('transformers')}, "
             f"peft {_version('peft')}.",
             "Command: `python -m planner bench finetune`. Each row builds the family's tiny model with "
             "transformers, freezes it but the trainable subset (`--train-layers`) or wraps it with peft's "
             "`get_peft_model(model, LoraConfig(r, lora_alpha, lora_dropout, target_modules, bias=\"none\"))` "
             "(after `activation_checkpointing_enable`, so peft and transformers call `enable_input_require_grads`), "
             "and measures the exact peak of live tensor storage bytes of a steady-state step (step 3, in one "
             "process). A bf16 base keeps peft's fp32 adapters (`autocast_adapter_dtype=True`).", "",
             f"**{len(modelled)} rows, worst |error| {worst:.3f}%** (bar: {FINETUNE_BAR_PCT}%).{gap_line}", "",
             "| part of the grid | rows | worst \\|error\\| % |", "|---|---:|---:|"]
    for name, rows in groups.items():
        lines.append(f"| {name} | {len(rows)} | {max(abs(r['error_pct']) for r in rows):.3f} |")
    lines += ["", "| config | estimate (B) | measured (B) | error % | est. phase | meas. phase |",
              "|---|---:|---:|---:|---|---|"]
    for r, g in zip(results, gaps):
        lines.append(f"| {r['config']}{' *gap*' if g else ''} | {r['estimate_bytes']:,} | {r['measured_bytes']:,} | "
                     f"{r['error_pct']:+.3f} | {r['estimated_phase']} | {r['measured_phase']} |")
    return "\n".join(lines) + "\n"


def finetune_book_markdown(text: str) -> str:
    """finetune_markdown's section retitled and re-described for the book's GPT-2 rows."""
    text = text.replace("\n\n**", "\nNot modelled yet for the book's GPT-2 (refused, exit 2): its sdpa attention, "
                        "autocast, gradient accumulation, a quantized base.\n\n**", 1)
    text = text.replace("# Fine-tuning: estimate vs measurement", "# Fine-tuning the book's GPT-2: estimate vs measurement", 1)
    return text.replace(
        "Command: `python -m planner bench finetune`. Each row builds the family's tiny model with transformers,",
        "Command: `python -m planner bench finetune --family gpt2`. Each row builds the book's GPTModel "
        "(planner/models/gpt2.py, its own attention; with checkpointing its per-block "
        "`checkpoint(block, x, use_reentrant=False)`),", 1).replace(
        "(after `activation_checkpointing_enable`, so peft and transformers call `enable_input_require_grads`)",
        "(task_type None: a plain PeftModel on the book's nn.Module; targets by the book's names, all-linear "
        "expanded to every Linear but out_head)", 1)


def run_accuracy(rows, device: str = "cpu", in_process: bool = False, progress=print,
                 simulate: bool = False) -> list[dict]:
    """Estimate and measure each row; with `simulate`, also simulate it on fake tensors (planner.measure.simulate)."""
    from planner.config import config_to_dict
    from planner.runner import run_worker

    results = []
    for label, cfg, spec in rows:
        spec = replace(spec, device=device)
        est = estimate_training(cfg, spec)
        if in_process:
            from planner.measure.training import measure_training

            meas = measure_training(cfg, spec)
        else:
            from dataclasses import asdict

            outcome = run_worker({"config": config_to_dict(cfg), "spec": asdict(spec)}, timeout_s=600)
            if outcome.exit_code:
                raise RuntimeError(f"{label}: {outcome.record.get('error')}")
            meas = outcome.record
        err = 100.0 * (est.peak_bytes - meas["peak_bytes"]) / meas["peak_bytes"]
        row = {"config": label, "estimate_bytes": est.peak_bytes, "measured_bytes": meas["peak_bytes"],
               "error_pct": err, "estimated_phase": est.peak_phase, "measured_phase": meas["peak_phase"],
               "peak_rss_bytes": meas.get("peak_rss_bytes"), "step_time_s": meas.get("step_time_s"),
               "tracker_overhead": meas.get("tracker_overhead")}
        if simulate:
            sim = _simulate_row(label, cfg, spec, in_process)
            row.update(simulated_bytes=sim["peak_bytes"], simulated_phase=sim["peak_phase"],
                       sim_vs_measured_pct=100.0 * (sim["peak_bytes"] - meas["peak_bytes"]) / meas["peak_bytes"],
                       simulated_phase_peak_bytes=sim["phase_peak_bytes"],
                       measured_phase_peak_bytes=meas["phase_peak_bytes"], sim_time_s=sim["sim_time_s"])
        results.append(row)
        progress(f"{len(results):3d}/{len(rows)} {err:+7.3f}%  {label}"
                 + (f"  simulated {row['sim_vs_measured_pct']:+.4f}%" if simulate else ""))
    return results


def _simulate_row(label: str, cfg: ModelConfig, spec: TrainSpec, in_process: bool) -> dict:
    if in_process:
        from planner.measure.simulate import simulate_training

        return simulate_training(cfg, spec)
    from dataclasses import asdict

    from planner.config import config_to_dict
    from planner.runner import run_worker

    outcome = run_worker({"kind": "simulate", "config": config_to_dict(cfg), "spec": asdict(spec)}, timeout_s=600)
    if outcome.exit_code:
        raise RuntimeError(f"{label}: simulation failed: {outcome.record.get('error')}")
    return outcome.record


def families_markdown(results: dict[str, list[dict]], device: str) -> str:
    """One table per family (transformers' own models, and the book's GPT-2 where asked), with the worst
    |error| of each."""
    lines = [f"# Hugging Face families: estimate vs transformers' own model ({device})", "",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {_cpu_count()} cores, "
             f"Python {platform.python_version()}, torch {_torch_version()}, transformers {_version('transformers')}.",
             "Command: `python -m planner bench families`. Each row builds the family's model with "
             "`AutoModelForCausalLM.from_config` (eager or SDPA; pure bf16 = weights made in bf16), trains it as "
             "its users do (`model(input_ids=x, labels=y).loss`; checkpointing through "
             "`activation_checkpointing_enable(use_reentrant=False)`), and measures the exact peak of live tensor "
             "storage bytes of a steady-state step (step 3, in one process). The tiny configs come from each "
             "family's file (planner/arch/<family>.py `grid_configs`): grouped and plain K/V heads, tied and "
             "untied heads, the family's own options, and one few-token shape whose backward peaks inside a "
             "block. Optimizers alternate AdamW and SGD; every 7th row runs two micro-batches.", "",
             "| family | rows | worst \\|error\\| % |", "|---|---:|---:|"]
    for family, rows in results.items():
        lines.append(f"| {family} | {len(rows)} | {max(abs(r['error_pct']) for r in rows):.3f} |")
    for family, rows in results.items():
        lines += ["", f"## {family}", "", "| config | estimate (B) | measured (B) | error % | est. phase | meas. phase |",
                  "|---|---:|---:|---:|---|---|"]
        for r in rows:
            lines.append(f"| {r['config']} | {r['estimate_bytes']:,} | {r['measured_bytes']:,} | "
                         f"{r['error_pct']:+.3f} | {r['estimated_phase']} | {r['measured_phase']} |")
    return "\n".join(lines) + "\n"


def accuracy_markdown(results: list[dict], device: str) -> str:
    worst = max(abs(r["error_pct"]) for r in results)
    simulated = all("simulated_bytes" in r for r in results)
    summary = f"**{len(results)} configs, worst |error| {worst:.3f}%** (bar: {ACCURACY_BAR_PCT}%)."
    head, rule = "| config | estimate (B) | measured (B) |", "|---|---:|---:|"
    if simulated:
        exact = sum(r["simulated_bytes"] == r["measured_bytes"] for r in results)
        summary += (f" Simulated on fake tensors (`python -m planner simulate train`, a child per row): "
                    f"{exact}/{len(results)} equal to the measurement to the byte, worst |difference| "
                    f"{max(abs(r['sim_vs_measured_pct']) for r in results):.4f}% (bar: 0.01%).")
        head, rule = head + " simulated (B) |", rule + "---:|"
    lines = [f"# Training-step peak: estimate vs measurement ({device})", "",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {_cpu_count()} cores, "
             f"Python {platform.python_version()}, torch {_torch_version()}.",
             f"Command: `python -m planner bench accuracy --device {device}`. Measured = exact peak of live tensor "
             "storage bytes in a steady-state step (step 3 of a fresh child process).", "",
             summary, "", head + " error % | est. phase | meas. phase |", rule + "---:|---|---|"]
    for r in results:
        sim = f" {r['simulated_bytes']:,} |" if simulated else ""
        lines.append(f"| {r['config']} | {r['estimate_bytes']:,} | {r['measured_bytes']:,} |{sim} {r['error_pct']:+.3f} "
                     f"| {r['estimated_phase']} | {r['measured_phase']} |")
    return "\n".join(lines) + "\n"


def speed_report() -> str:
    """Time per estimate (goal < 0.2 ms) and the tracker's overhead (goal <= 1.3x)."""
    from planner.config import PRESETS

    lines = ["| what | value |", "|---|---:|"]
    for name in ("gpt2-small", "gpt2-xl", "llama-3-8b"):
        n = 200
        estimate_training(PRESETS[name], TrainSpec(1, 1024, "bf16-amp"))  # the per-config inventory, once
        t0 = time.perf_counter()
        for b in range(1, n + 1):  # a new batch each time, as a slider or the fit bisection asks
            estimate_training(PRESETS[name], TrainSpec(batch_size=b, seq_len=1024, precision="bf16-amp"))
        lines.append(f"| estimate_training({name}), new batch each call | {(time.perf_counter() - t0) / n * 1e3:.3f} ms |")
    lines += planner_page_rows()
    from .infer_speed import inference_speed_rows  # issue #21: estimate infer and the inference mode

    lines += inference_speed_rows()
    for label, cfg, spec in [
        ("tiny gpt2 (h64, L2, b2 s64)", _gpt(vocab_size=1000, emb_dim=64, context_length=128), TrainSpec(2, 64)),
        ("gpt2 h256 L4 V50257 b4 s256", _gpt(emb_dim=256, n_layers=4), TrainSpec(4, 256)),
        ("gpt2-small b2 s256", _gpt(emb_dim=768, n_heads=12, n_layers=12, context_length=1024), TrainSpec(2, 256)),
    ]:
        meas = run_accuracy([(label, cfg, spec)], progress=lambda *_: None)[0]
        lines.append(f"| tracker overhead, {label} | {meas['tracker_overhead']:.2f}x "
                     f"(untracked step {meas['step_time_s']:.3f} s) |")
    return "\n".join(lines) + "\n"


def planner_page_rows(n: int = 20) -> list[str]:
    """The Planner page's computation per slider move (planner.plan.plan: the estimate, both fit answers,
    the advice, both curves), each move a new batch then a new sequence; the browser's figure (script,
    transfer and drawing) is `python tests/e2e/bench_page.py`."""
    from planner.config import PRESETS
    from planner.plan import plan

    rows = []
    for name in ("gpt2-small", "llama-3-8b"):
        cfg, budget = PRESETS[name], 24 * 2**30
        plan(cfg, TrainSpec(4, 512), budget)
        t0 = time.perf_counter()
        for i in range(n):
            plan(cfg, TrainSpec(5 + i, 512), budget)
            plan(cfg, TrainSpec(5 + i, 300 + i), budget)
        rows.append(f"| Planner page computation (plan), {name}, per slider move | "
                    f"{(time.perf_counter() - t0) / (2 * n) * 1e3:.1f} ms |")
    return rows


LOADING_BAR = (0.05, 32 * 2**20)  # issue #4: each figure within 5% or 32 MiB of the measurement


def raw_read_gb_s(paths) -> float:
    """Bandwidth of reading the same files straight from the page cache (read twice, the second timed)."""
    total, t = 0, 0.0
    for _ in range(2):
        total, t0 = 0, time.perf_counter()
        for p in paths:
            with open(p, "rb", buffering=0) as fh:
                while chunk := fh.read(64 * 2**20):
                    total += len(chunk)
        t = time.perf_counter() - t0
    return total / t / 1e9


def run_loading(models=("gpt2-small", "gpt2-medium"), device: str = "cpu", progress=print) -> list[dict]:

    from planner.config import PRESETS, config_to_dict
    from planner.estimate.loading import METHODS, estimate_loading
    from planner.routines_paths import default_cache_dir
    from planner.runner import checkpoint_folder, measure_load

    rows = []
    for name in models:
        cfg = PRESETS[name]
        folder = checkpoint_folder(config_to_dict(cfg), default_cache_dir())
        raw = {"pth": raw_read_gb_s([folder / "model.pth"]),
               "safetensors": raw_read_gb_s([folder / "model.safetensors"]),
               "per-tensor": raw_read_gb_s(sorted((folder / "model_parameters").iterdir()))}
        for method in METHODS:
            est = estimate_loading(cfg, method, device)
            out = measure_load(config_to_dict(cfg), method, device, folder)
            if out.exit_code:
                raise RuntimeError(f"{name} {method}: {out.record.get('error')}")
            m = out.record
            fmt = "safetensors" if method.startswith("safetensors") else "per-tensor" if method == "per-tensor" else "pth"
            # Mapped methods: file-backed pages depend on the page cache's state (fault-around maps more of
            # a hot file) and are reclaimable, so the bar holds for the anonymous part; the pages are shown.
            mapped = method in ("mmap", "safetensors")
            row = {"model": name, "method": method,
                   "device_est": est.peak_device_bytes, "device_meas": m["peak_device_bytes"],
                   "cpu_est": est.peak_cpu_anon_bytes if mapped else est.peak_cpu_bytes,
                   "cpu_meas": m["peak_cpu_bytes"] - (m["cpu_file_delta_bytes"] if mapped else 0),
                   "anon_meas": m["cpu_anon_delta_bytes"], "file_meas": m["cpu_file_delta_bytes"],
                   "time_s": m["load_time_s"], "gb_s": m["throughput_gb_s"],
                   "raw_ratio": m["throughput_gb_s"] / raw[fmt], "match": m["weights_match"]}
            row["ok"] = all(abs(row[f"{k}_est"] - row[f"{k}_meas"]) <= max(LOADING_BAR[0] * row[f"{k}_meas"], LOADING_BAR[1])
                            for k in ("device", "cpu"))
            rows.append(row)
            progress(f"{name:12s} {method:17s} device {row['device_est']/2**20:9.1f}/{row['device_meas']/2**20:9.1f} MiB "
                     f"cpu {row['cpu_est']/2**20:9.1f}/{row['cpu_meas']/2**20:9.1f} MiB  {'ok' if row['ok'] else 'MISS'}")
    return rows


def loading_markdown(rows: list[dict], device: str) -> str:
    mib = lambda b: f"{b / 2**20:,.1f}"
    lines = [f"# Weight loading: estimate vs measurement ({device})", "",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {_cpu_count()} cores, "
             f"torch {_torch_version()}. Command: `python -m planner bench loading`.",
             "Each method runs in a fresh child process (glibc mmap threshold fixed at 128 KiB). Device = exact "
             "peak of live tensor bytes (on CPU the device is the CPU); CPU = peak RSS increase (VmHWM reset). "
             "For mmap and safetensors the CPU columns are the anonymous part (peak RSS minus the file-backed pages, which "
             "are reclaimable page cache and vary with the cache's state); the pages are in the anon / file column. "
             "Anon/file = RssAnon/RssFile change after the load. Throughput = file bytes over (load + first read "
             "of every weight; lazy methods read nothing before that), and its ratio to a raw read of the same "
             "file(s) from the page cache.", "",
             f"Bar: each figure within 5% or 32 MiB. **{sum(r['ok'] for r in rows)}/{len(rows)} rows meet it.**", "",
             "| model | method | device est (MiB) | device meas | CPU est (MiB) | CPU meas | anon / file after | time (s) | GB/s | vs raw read | weights equal |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['method']} | {mib(r['device_est'])} | {mib(r['device_meas'])} | "
                     f"{mib(r['cpu_est'])} | {mib(r['cpu_meas'])} | {mib(r['anon_meas'])} / {mib(r['file_meas'])} | "
                     f"{r['time_s']:.2f} | {r['gb_s']:.2f} | {r['raw_ratio']:.0%} | {r['match']} |")
    lines += ["", "The seed notebook's GPT-2 XL fp32 figures (Colab L4, GB = 1024**3) beside this planner's CUDA "
              "estimates (allocator model from PyTorch's source; not yet measured on a GPU):", "",
              "| method | notebook GPU | estimate GPU | notebook CPU | estimate CPU (anon + file) |", "|---|---:|---:|---:|---:|"]
    from planner.config import PRESETS
    from planner.estimate.loading import estimate_loading

    for method, (gpu, cpu) in NOTEBOOK_GPT2_XL.items():
        e = estimate_loading(PRESETS["gpt2-xl"], method, "cuda")
        lines.append(f"| {method} | {gpu} | {e.peak_device_bytes / 2**30:.2f} | {cpu} | "
                     f"{e.peak_cpu_anon_bytes / 2**30:.2f} + {e.peak_cpu_file_bytes / 2**30:.2f} |")
    lines.append("")
    lines.append("The notebook's CPU column sampled RSS every 0.1 s and includes CUDA initialisation's host memory "
                 "(hundreds of MB), which the planner measures separately; its baseline and sequential runs also "
                 "held a CPU copy of the model. These CPU rows are therefore not expected to agree.")
    return "\n".join(lines) + "\n"


def longest_context_markdown() -> str:
    """Llama-3.1-8B QLoRA r=32 on all linear layers, batch 1: the longest context this estimate fits at each GPU
    size (checkpointing on and off), beside Unsloth's published figures (planner/reference.py), theirs."""
    import dataclasses

    from planner.config import PRESETS
    from planner.plan import longest_context
    from planner.reference import UNSLOTH_LLAMA31_8B as ref
    from planner.spec import TrainSpec, prepare

    spec = TrainSpec(1, 1, "bf16", "adamw", device="cuda", lora_r=32, lora_targets="all-linear",
                     quantize_base="nf4", double_quant=True)
    ours = {}
    for ckpt in (True, False):
        run = dataclasses.replace(spec, checkpointing=ckpt)
        ours[ckpt] = longest_context(prepare(PRESETS[ref.model], run, "sdpa"), run, ref)
    theirs = list(ref.columns)
    fmt = lambda n: "OOM" if n is None else ("0 (does not fit)" if n == 0 else f"{n:,}")
    lines = ["# Longest context for a QLoRA fine-tune, beside published figures", "",
             f"Command: `python -m planner bench longest-context`. Model: {ref.model} (Llama-3-8B's shapes, 128K context). "
             "This planner's columns are its estimate of peft's QLoRA recipe on transformers' Llama (NF4 base with "
             "double quantization, bf16 compute, `prepare_model_for_kbit_training`, LoRA r=32 on every linear layer, "
             "AdamW, SDPA attention, batch 1) on a CUDA device of that size less the CUDA context, the longest "
             "sequence whose estimated peak fits (the same search as the Planner page's). The estimate's QLoRA terms "
             "are held to measurements on the CPU (section QLoRA of docs/accuracy.md) and to the live bytes of the "
             "same QLoRA grid on an H200 (docs/gpu.md). On CUDA this recipe's attention runs in fp32 "
             "(`prepare_model_for_kbit_training` leaves the hidden states fp32 and bitsandbytes' Linear4bit returns "
             "its input's dtype), and with Llama's grouped heads transformers calls SDPA with `enable_gqa`, which CUDA "
             "runs on the math kernel (measured on the H200: docs/gpu.md): each recomputed block's backward holds "
             "three b*a*s*s fp32 tensors, and those bound the context here long before the loss does. Hugging Face + "
             "FA2's column runs FlashAttention-2 (no s*s tensor), which this estimate does not model.", "",
             f"The last columns are **{ref.source}**, not measurements of ours: {ref.setting} ({ref.url}). Unsloth's "
             "own column uses its offloaded gradient checkpointing and a fused cross-entropy, which this first table "
             "does not use (the second table, below, does); Hugging Face + FA2 is the recipe this estimate models, with FlashAttention-2 where "
             "ours has SDPA and with whatever the allocator's caching and fragmentation add on a real GPU.", "",
             "| GPU (GiB) | this estimate, checkpointing | this estimate, no checkpointing | "
             + " | ".join(f"{c} (published)" for c in theirs) + " |",
             "|---:|---:|---:|" + "---:|" * len(theirs)]
    for on, off in zip(ours[True], ours[False]):
        lines.append(f"| {on['budget_gb']} | {fmt(on['this estimate'])} | {fmt(off['this estimate'])} | "
                     + " | ".join(fmt(on[c]) for c in theirs) + " |")
    lines += longest_context_techniques(spec, ref, ours[True], fmt)
    from planner.accounting import tensor_inventory
    from planner.estimate.training import estimate_training
    from planner.units import fmt_bytes

    one = dataclasses.replace(spec, checkpointing=True)
    est = estimate_training(prepare(PRESETS[ref.model], one, "sdpa"), one)
    fp32 = sum(t.numel for t in tensor_inventory(PRESETS[ref.model]) if t.role in ("embed", "head")) * 4
    lines += ["", f"Where nothing fits, even one token's step does not: its estimated peak is {fmt_bytes(est.peak_bytes)}, "
              f"of which {fmt_bytes(est.params_bytes)} are the weights (the 4-bit linears with their statistics, the "
              f"adapters, and {fmt_bytes(fp32)} of embedding and output head that `prepare_model_for_kbit_training` "
              "casts to fp32)."]
    return "\n".join(lines) + "\n"


def longest_context_techniques(spec, ref, plain: list[dict], fmt) -> list[str]:
    """Issue #24 item 5: the same table recomputed with the memory techniques on (checkpointing, a fused loss:
    estimated; and the fused loss with Unsloth's offloaded checkpointing: derived, planner/estimate/offload_ckpt.py),
    and how far the result still is from Unsloth's published column, in numbers."""
    import dataclasses

    from planner.config import PRESETS
    from planner.estimate.offload_ckpt import longest_offloaded, offloaded_checkpoint
    from planner.estimate.training import estimate_training
    from planner.fit import tensor_budget
    from planner.plan import longest_context
    from planner.spec import prepare
    from planner.units import fmt_bytes

    run = dataclasses.replace(spec, checkpointing=True)
    cfg = prepare(PRESETS[ref.model], run, "sdpa")
    fused = {loss: longest_context(cfg, dataclasses.replace(run, loss=loss), ref) for loss in ("chunked-ce", "cce")}
    cce_run = dataclasses.replace(run, loss="cce")
    offl = [longest_offloaded(cfg, cce_run, tensor_budget(r["budget_gb"] * 2**30, run.device)) for r in plain]
    theirs = list(ref.columns)[0]
    lines = ["", "## With the memory techniques on (issue #24)", "",
             "The same search with checkpointing and a fused loss (`--loss chunked-ce` / `--loss cce`: the b*s*V "
             "logits, their fp32 copy and the log-softmax output never whole; estimated, and held to the measured step "
             "on the CPU in docs/accuracy.md, section Fused losses, fine-tuning rows incl. QLoRA). The last of our columns adds "
             "Unsloth's offloaded gradient checkpointing (unsloth/models/_utils.py `Unsloth_Offloaded_Gradient_Checkpointer`: "
             "each block's input copied to the host in forward, back for its recompute): a **derived** device figure "
             "(the cce estimate less the stashed block inputs of all blocks but the one recomputing; "
             "planner/estimate/offload_ckpt.py), for the CUDA check: it runs on CUDA only and is not measured here. "
             "`--offload-activations` (torch's save_on_cpu) is not used: it is modelled for full training only.", "",
             f"| GPU (GiB) | checkpointing (as above) | + chunked-ce | + cce | + cce + offloaded checkpointing (derived, "
             f"CUDA check) | {theirs} (published) | ours / theirs |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(plain):
        pub = r[theirs]
        ratio = (f"{offl[i] / pub:.2f}" + (" (capped)" if offl[i] >= cfg.max_seq_len else "")) if pub else "-"
        lines.append(f"| {r['budget_gb']} | {fmt(r['this estimate'])} | {fmt(fused['chunked-ce'][i]['this estimate'])} | "
                     f"{fmt(fused['cce'][i]['this estimate'])} | {fmt(offl[i])} | {fmt(pub)} | {ratio} |")
    # the numbers at the largest budget whose answer the model's context does not cap
    i = max(k for k, r in enumerate(plain) if 0 < offl[k] < cfg.max_seq_len and r[theirs])
    big, s_off, pub = plain[i], offl[i], plain[i][theirs]
    _, host = offloaded_checkpoint(estimate_training(cfg, dataclasses.replace(cce_run, seq_len=s_off)), cfg)
    at_pub = estimate_training(cfg, dataclasses.replace(cce_run, seq_len=pub))
    dev_pub, host_pub = offloaded_checkpoint(at_pub, cfg)
    e_r = host // max(cfg.layers * s_off * cfg.hidden, 1)
    rest = dev_pub - at_pub.params_bytes - at_pub.optimizer_bytes - at_pub.grads_bytes
    lines += ["", f"Our search stops at the model's context ({cfg.max_seq_len:,} tokens, max_position_embeddings), "
              "so a row that reaches it is capped; Unsloth's larger rows go past it (their benchmark ran sequences "
              f"longer than the model's 128K context). At {big['budget_gb']} GiB, the largest uncapped row, the fused loss takes the longest context from "
              f"{fmt(big['this estimate'])} to {fmt(fused['cce'][i]['this estimate'])} tokens (x"
              f"{fused['cce'][i]['this estimate'] / max(big['this estimate'], 1):.1f}), and the block inputs on the host "
              f"to {fmt(s_off)} ({fmt_bytes(host)} of host memory): {100 * s_off / pub:.0f}% of Unsloth's published "
              f"{pub:,}. At their {pub:,} tokens this derived device peak is {fmt_bytes(dev_pub)} ({fmt_bytes(host_pub)} "
              f"of block inputs on the host): the weights, grads and optimizer {fmt_bytes(dev_pub - rest)}, and "
              f"{fmt_bytes(rest)} of one block's recompute and backward (its saved set, the LoRA adapters' inputs, "
              "the MLP's b*s*f tensors) with the loss's and the final norm's tensors. What Unsloth does that this estimate "
              "does not model: (0) its attention: not SDPA's math kernel, whose s*s fp32 weights (above) are what "
              "bounds these rows on CUDA, so the fused loss adds nothing past 24 GiB here; (1) its own fused Triton kernels for RMSNorm, RoPE, SwiGLU/GeGLU and the LoRA MLP/QKV/O "
              "(unsloth/kernels/: rms_layernorm.py, rope_embedding.py, swiglu.py, fast_lora.py), whose backward keeps "
              "fewer b*s*h and b*s*f tensors alive than transformers' modules with peft's adapters, which are what "
              f"this estimate holds to the measured step; (2) the residual stream's width: in peft's recipe "
              f"`prepare_model_for_kbit_training` casts the norms to fp32, so the stashed hidden states are {e_r}-byte "
              "here (measured on the CPU, QLoRA rows); whether Unsloth's loader keeps the stream in bf16 is not checked "
              "against its code here: a bf16 stream would halve the host copies and every b*s*h term; (3) its loss: Unsloth's "
              "docs say its chunk count adapts to the VRAM tier, ours follows Liger's rule (the loss is not the peak "
              "here once fused, so this changes little). Unsloth's figures are theirs, on their GPU, with the "
              "allocator's caching and the CUDA context; ours are tensors' bytes less a CUDA context."]
    return lines


def main(what: str, quick: bool = False, out: str | None = None, device: str = "cpu",
         family: str | None = None) -> int:
    if family and what != "families" and not (what == "finetune" and family == "gpt2"):
        from planner.config import ConfigError

        raise ConfigError("--family goes with bench families (and bench finetune --family gpt2: the book's GPT-2)")
    if what == "longest-context":
        text = longest_context_markdown()
        print(text)
        if out:
            write_section(out, text)
        return 0
    if what == "export":  # profiling exports' time and size: bench/export.py
        from .export import main as export_main

        return export_main(quick=quick, out=out)
    if what == "simulate":  # formula vs simulation at full size: bench/simulate.py
        from .simulate import main as simulate_main
        from planner.config import ConfigError

        if device != "cpu":
            raise ConfigError("bench simulate runs on the CPU (simulating CUDA needs a CUDA build; use simulate train)")
        return simulate_main(quick=quick, out=out)
    if what == "families":
        from planner.arch import families

        names = [family] if family else [f for f, fam in families().items() if fam.source == "transformers"]
        results = {name: run_accuracy(family_grid(name, quick), device=device, in_process=True,
                                      progress=lambda line: print(line, flush=True)) for name in names}
        text = families_markdown(results, device)
        print(text)
        if out:
            if family:  # the other families' tables are kept (bench/families_doc.py)
                from .families_doc import merge

                text = merge(out, text)
            write_section(out, text)
        worst = max(abs(r["error_pct"]) for rows in results.values() for r in rows)
        print(f"worst |error| {worst:.3f}% ({'meets' if worst <= FAMILY_BAR_PCT else 'MISSES'} the "
              f"{FAMILY_BAR_PCT}% bar)")
        return 0
    if what == "finetune-8bit":  # bench/bnb.py: its subsection of the fine-tuning section
        from .bnb import main as bnb_main, write_subsection

        code, text = bnb_main(quick=quick, device=device, progress=lambda line: print(line, flush=True))
        print(text)
        if out:
            write_subsection(out, text)
        return code
    if what == "finetune":
        rows = finetune_book_grid(quick) if family == "gpt2" else finetune_grid(quick)
        results = run_accuracy(rows, device=device, in_process=True, progress=lambda line: print(line, flush=True))
        # known_gap names transformers' decoders' recompute transients; the book's estimate has its own
        gaps = [family != "gpt2" and finetune_gap(row) is not None for row in rows]
        text = finetune_markdown(results, device, gaps)
        if family == "gpt2":  # its own section of docs/accuracy.md (the 8-bit and QLoRA rows are llama's and qwen2's)
            text = finetune_book_markdown(text)
        else:
            from .bnb import main as bnb_main  # 8-bit optimizers (issue #12): a subsection of this section

            text += "\n" + bnb_main(quick=quick, device=device, progress=lambda line: print(line, flush=True))[1]
        print(text)
        if out:
            write_section(out, text)
        worst = max(abs(r["error_pct"]) for r, g in zip(results, gaps) if not g)
        print(f"worst |error| {worst:.3f}% ({'meets' if worst <= FINETUNE_BAR_PCT else 'MISSES'} the "
              f"{FINETUNE_BAR_PCT}% bar)")
        if family == "gpt2":
            return 0
        qrows = finetune_qlora_grid(quick)
        qresults = run_accuracy(qrows, device=device, in_process=True, progress=lambda line: print(line, flush=True))
        qtext = qlora_markdown(qresults, device)
        print(qtext)
        if out:
            write_section(out, qtext)
        qworst = max(abs(r["error_pct"]) for r in qresults)
        print(f"QLoRA worst |error| {qworst:.3f}% ({'meets' if qworst <= FINETUNE_QUANT_BAR_PCT else 'MISSES'} the "
              f"{FINETUNE_QUANT_BAR_PCT}% bar)")
        return 0
    if what == "loading":
        rows = run_loading(("gpt2-small",) if quick else ("gpt2-small", "gpt2-medium"), device=device)
        text = loading_markdown(rows, device)
        print(text)
        if out:
            from pathlib import Path

            Path(out).write_text(text)
        return 0 if all(r["ok"] for r in rows) else 1
    if what == "speed":
        text = speed_report()
        print(text)
    else:
        results = run_accuracy(accuracy_grid(quick), device=device, simulate=device == "cpu")
        text = accuracy_markdown(results, device)
        print(text)
        worst = max(abs(r["error_pct"]) for r in results)
        bar = ACCURACY_BAR_PCT if device == "cpu" else 3.0
        print(f"worst |error| {worst:.3f}% ({'meets' if worst <= bar else 'MISSES'} the {bar}% bar)")
    if out:
        write_section(out, text)  # other sections of the file (bench simulate's) are kept
    return 0
