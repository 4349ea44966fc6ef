"""Random training runs of every formula family, estimated and measured (issue #34's fuzz check).

A case is a random tiny model of one family (vocabulary, width, depth, heads, K/V heads, head_dim, a tied or untied
head, experts and top-k for the MoE families, the family's own windows and dropouts) and a random run (batch,
sequence, precision, attention kernel, checkpointing policy, optimizer, and full training, frozen layers or LoRA on
peft's default / every linear / a random subset of targets). Case i of seed S is drawn from its own
`random.Random(f"{S}:{i}")`, so one case reproduces alone; the families take turns in a seed-shuffled order, so any
run of as many cases as families covers every one. A drawn run the planner refuses (ConfigError) is drawn again.

The arch/auto family (estimated from a fitted simulation, not formulas) is not drawn.

    python tests/fuzz_train.py --seed 7 --cases 100 [--out rows.jsonl] [--small]   # the longer run, a table
    PLANNER_FUZZ_SEED=7 PLANNER_FUZZ_CASES=20 pytest -n 0 tests/test_train_fuzz.py  # the same cases as a test
"""
from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a script from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.arch import families, family_of  # noqa: E402
from planner.config import ConfigError, config_to_dict  # noqa: E402
from planner.finetune import lora_target_names  # noqa: E402
from planner.spec import TrainSpec, prepare, run_args  # noqa: E402

BAR_PCT = 1.0  # the project's accuracy bar on the peak (issue #34)
OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw")  # torch's; bitsandbytes' need CUDA to measure
PRECISIONS = ("fp32", "fp16-amp", "bf16-amp", "bf16")
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")


@dataclass(frozen=True)
class Case:
    index: int
    arch: str
    cfg: object
    spec: TrainSpec
    redraws: int  # runs the planner refused before this one

    @property
    def label(self) -> str:
        return describe(self.cfg, self.spec)


def fuzz_archs() -> list[str]:
    return [a for a, f in families().items() if f.basis == "formula"]


def _heads(rng: random.Random) -> tuple[int, int]:
    a = rng.choice((1, 2, 3, 4, 6, 8))
    return a, rng.choice([k for k in range(1, a + 1) if a % k == 0])


def draw_config(rng: random.Random, arch: str, small: bool):
    """A random tiny model of the family: the family's first grid config with its sizes redrawn."""
    family = families()[arch]
    vocab = rng.randint(64, 1200 if small else 6000)
    layers = rng.randint(1, 2 if small else 3)
    a, kv = _heads(rng)
    hd = rng.choice((8, 12, 16) if small else (8, 12, 16, 24, 32))
    width = rng.randint(16, 160 if small else 320)
    tied = rng.random() < 0.5
    if arch == "gpt2":  # the book's GPT-2 (planner/arch/gpt2_book.py): no grid config, its own keys
        from planner.config import preset

        return dataclasses.replace(preset("gpt2-small"), vocab_size=vocab, context_length=512, emb_dim=a * hd,
                                   n_heads=a, n_layers=layers, drop_rate=rng.choice((0.0, 0.0, 0.1)),
                                   qkv_bias=rng.random() < 0.5)
    base = family.grid_configs()[0][1]
    if arch == "gpt2-hf":  # transformers' GPT-2: plain heads, a tied head only, dropout 0.1 as published or none
        p = rng.choice((0.0, 0.1))
        return dataclasses.replace(base, vocab_size=vocab, n_positions=512, n_embd=a * hd, n_layer=layers, n_head=a,
                                   n_inner=rng.choice((None, width)), resid_pdrop=p, embd_pdrop=p, attn_pdrop=p)
    fields = {f.name for f in dataclasses.fields(base) if f.init}
    kw = dict(vocab_size=vocab, num_hidden_layers=layers, num_attention_heads=a, num_key_value_heads=kv,
              intermediate_size=width, max_position_embeddings=512, tie_word_embeddings=tied)
    if "head_dim" in fields and rng.random() < 0.4:  # an explicit head_dim, the width on its own
        kw.update(head_dim=hd, hidden_size=rng.randrange(16, 193 if not small else 97, 8))
    else:
        kw.update(hidden_size=a * hd, **({"head_dim": None} if "head_dim" in fields else {}))
        if arch in ("gemma", "gemma2", "qwen3", "qwen3_moe"):  # their configs default head_dim to the published one
            kw["head_dim"] = hd
    if arch in MOE:  # the experts' widths in whole 16 bytes (torch's grouped GEMM: planner/arch/moe.py check_run)
        width = kw["intermediate_size"] = rng.randrange(8, width + 8, 8)
        experts = rng.randint(2, 8)
        kw["num_experts_per_tok"] = rng.randint(1, min(experts, 4))
        kw["num_local_experts" if arch == "mixtral" else "num_experts"] = experts
        if arch != "mixtral":
            kw.update(moe_intermediate_size=rng.randrange(8, width + 8, 8), norm_topk_prob=rng.random() < 0.5)
        if arch == "qwen2_moe":
            kw["shared_expert_intermediate_size"] = rng.randint(8, width)
    if "sliding_window" in fields:  # mistral, mixtral, phi3, gemma2: a window shorter or longer than the run
        kw["sliding_window"] = (rng.randint(4, 300) if arch == "gemma2" or rng.random() < 0.5 else None)
    if arch == "gemma2":
        kw["query_pre_attn_scalar"] = rng.choice((kw["head_dim"], 256))
    return dataclasses.replace(base, **kw)


def draw_spec(rng: random.Random, cfg, small: bool) -> TrainSpec:
    family = family_of(cfg)
    layers = cfg.layers
    ckpt = rng.choice(("none", "full", "every", "selective"))
    kw = dict(batch_size=rng.randint(1, 3 if small else 4), seq_len=rng.randint(8, 96 if small else 300),
              precision=rng.choice(PRECISIONS), optimizer=rng.choice(OPTIMIZERS),
              checkpointing=ckpt != "none",
              checkpoint_policy={"none": "full", "every": f"every:{rng.randint(1, layers)}"}.get(ckpt, ckpt))
    tune = rng.choice(("full", "lora", "lora", "freeze"))
    if tune == "lora" and family.lora_supported:
        names = lora_target_names(family, cfg, TrainSpec(1, 1, lora_r=1, lora_targets="all-linear"))
        pick = rng.choice(("default", "all-linear", "some"))
        targets = ("" if pick == "default" and family.lora_default_targets else "all-linear" if pick != "some"
                   else ",".join(n for n in names if rng.random() < 0.5) or rng.choice(names))
        kw.update(lora_r=rng.choice((1, 2, 4, 8, 16)), lora_alpha=float(rng.choice((8, 16, 32))),
                  lora_dropout=rng.choice((0.0, 0.0, 0.0, 0.1)), lora_targets=targets)
    elif tune == "freeze" and family.subset_supported:
        kw["train_layers"] = rng.choice(("head", f"last:{rng.randint(1, layers)}"))
    attention = rng.choice(family.attention_kinds(cfg))
    return TrainSpec(**kw), attention


def draw_case(seed: int, index: int, small: bool = False, tries: int = 50) -> Case:
    order = fuzz_archs()
    random.Random(seed).shuffle(order)
    arch = order[index % len(order)]
    rng = random.Random(f"{seed}:{index}")
    for redraw in range(tries):
        try:
            cfg = draw_config(rng, arch, small)
            spec, attention = draw_spec(rng, cfg, small)
            cfg = prepare(cfg, spec, attention)
            _estimate(cfg, spec)  # what the planner refuses is drawn again
        except ConfigError:
            continue
        return Case(index, arch, cfg, spec, redraw)
    raise RuntimeError(f"seed {seed} case {index}: {tries} draws of {arch} refused")


def known_open(case: Case) -> str | None:
    """Why a case lies in a region the fuzz check found past the bar and that is not modelled yet (docs/accuracy.md
    "Training fuzz"), or None. The test reports such a case as an expected failure instead of failing the suite."""
    spec, targets = case.spec, set(filter(None, case.spec.lora_targets.split(",")))
    if (case.arch == "gpt2" and spec.lora_r and spec.checkpointing and spec.checkpoint_policy == "selective"
            and not targets <= {"W_query", "W_value"}):
        return "the book's GPT-2, selective checkpointing, LoRA beyond W_query/W_value: adapter outputs kept uncounted"
    if (case.arch == "qwen2_moe" and spec.lora_r and spec.checkpointing
            and ("shared_expert_gate" in targets or spec.lora_targets == "all-linear")):
        return "Qwen2-MoE checkpointed, LoRA on shared_expert_gate: its adapter freed before the routed experts' backward"
    if (case.arch == "phi3" and spec.checkpointing and spec.checkpoint_policy in ("full", "every:1")
            and spec.train_layers != "all" and not spec.lora_r):
        # found by seed 302409 (V117 h24 L2 a3 b3 s55 bf16 sdpa, last:1): -4.11% under the measurement, about two
        # (b, s, h) bf16 tensors (15,848 B) alive at the backward's peak that the estimate does not count; every:2 exact
        return "Phi-3 under full checkpointing with frozen layers: the estimate 4% under (two b*s*h tensors uncounted)"
    if case.arch == "gemma2" and case.cfg.layers == 1 and spec.precision == "fp16-amp":
        # found by seed 661406 (V341 h8 a1 b2 s75): +3.4% (no checkpointing) .. +6.7% (checkpointing) over the
        # measurement; the same model with 2 layers, or under bf16-AMP, is exact (within 8 B)
        return "Gemma 2 with one layer under fp16-AMP: the estimate over by 3-7% (2 layers and bf16-AMP exact)"
    return None


def _estimate(cfg, spec):
    from planner.estimate.training import estimate_training

    return estimate_training(cfg, spec)


def describe(cfg, spec) -> str:
    """A short label: the model's sizes and the run's settings."""
    tied = family_of(cfg).tied(cfg)
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.heads
    experts = getattr(cfg, "num_experts", None)
    moe = f" E{experts}k{cfg.num_experts_per_tok}" if experts else ""
    model = (f"{cfg.arch} V{cfg.vocab_size} h{cfg.hidden} L{cfg.layers} a{cfg.heads} kv{kv} hd{getattr(cfg, 'head_dim', None) or cfg.hidden // cfg.heads}"
             f"{moe} {'tied' if tied else 'untied'}")
    args, run = run_args(spec), []
    quiet = {"--device": "cpu", "--grad-accum": "1", "--optimizer-impl": "default", "--loss": "default"}
    for i, a in enumerate(args):
        follows = args[i - 1] if i else None
        if (a in quiet and quiet[a] == (args[i + 1] if i + 1 < len(args) else None)) or (
                follows in quiet and quiet[follows] == a):
            continue
        run.append(a.removeprefix("--"))
    return f"{model} {cfg.attention} " + " ".join(run)


def cli_line(case: Case) -> str:
    """The command that reproduces a case (its config written to fuzz-case.json)."""
    args = " ".join(a for a in run_args(case.spec) if a not in ("--device", "cpu"))
    return (f"echo '{json.dumps(config_to_dict(case.cfg), separators=(',', ':'))}' > fuzz-case.json; "
            f"python -m planner measure train --config fuzz-case.json --attention {case.cfg.attention} {args} "
            "--device cpu --json")


def run_case(case: Case) -> dict:
    """Estimate and measure (in this process, as `bench ... --in-process` does) one case."""
    from planner.measure.training import measure_training

    est = _estimate(case.cfg, case.spec)
    t0 = time.perf_counter()
    meas = measure_training(case.cfg, case.spec)
    err = 100.0 * (est.peak_bytes - meas["peak_bytes"]) / meas["peak_bytes"]
    phases = {p: (est.phase_peak_bytes.get(p), b) for p, b in meas["phase_peak_bytes"].items()}
    return {"index": case.index, "arch": case.arch, "config": config_to_dict(case.cfg), "run": run_args(case.spec),
            "attention": case.cfg.attention, "estimate_bytes": est.peak_bytes, "measured_bytes": meas["peak_bytes"],
            "error_pct": err, "estimated_phase": est.peak_phase, "measured_phase": meas["peak_phase"],
            "phase_error_pct": {p: (100.0 * (e - m) / m if e is not None and m else None) for p, (e, m) in phases.items()},
            "redraws": case.redraws, "measure_s": time.perf_counter() - t0}


def summary(rows: list[dict], seeds: list[int]) -> str:
    """docs/accuracy.md's table: cases per family, worst error on the peak, cases past the bar, and the runs the
    planner accepted but the real step raised on (rows with "error")."""
    done = [r for r in rows if "error" not in r]
    lines = [f"seeds {', '.join(map(str, seeds))}; {len(rows)} cases; bar {BAR_PCT}% on the peak", "",
             "| family | cases | worst peak error | mean abs error | past the bar | real step raised | worst case "
             "(seed:index) |", "|---|---:|---:|---:|---:|---:|---|"]
    for arch in fuzz_archs():
        mine = [r for r in done if r["arch"] == arch]
        raised = sum(1 for r in rows if r["arch"] == arch and "error" in r)
        if not mine and not raised:
            continue
        worst = max(mine, key=lambda r: abs(r["error_pct"])) if mine else None
        past = sum(abs(r["error_pct"]) > BAR_PCT for r in mine)
        mean = sum(abs(r["error_pct"]) for r in mine) / len(mine) if mine else 0.0
        lines.append(f"| {arch} | {len(mine)} | {worst['error_pct']:+.4f}% | {mean:.4f}% | {past} | {raised} | "
                     f"{worst.get('seed', '?')}:{worst['index']} |" if worst else
                     f"| {arch} | 0 | | | | {raised} | |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, action="append")
    ap.add_argument("--summarise", nargs="+", metavar="ROWS.jsonl", help="print the table of rows written by --out")
    ap.add_argument("--cases", type=int, default=24, help="cases per seed")
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--small", action="store_true", help="the in-suite sizes")
    ap.add_argument("--out", help="append one JSON row per case to this file")
    args = ap.parse_args(argv)
    if args.summarise:
        rows = [json.loads(line) for path in args.summarise for line in Path(path).read_text().splitlines() if line]
        print(summary(rows, sorted({r["seed"] for r in rows})))
        return 0
    if not args.seed:
        ap.error("--seed is required")
    rows = []
    for seed in args.seed:
        for i in range(args.start, args.start + args.cases):
            case = draw_case(seed, i, args.small)
            try:
                row = run_case(case)
            except Exception as exc:  # a run the planner accepts but the real step cannot take: reported, not hidden
                row = {"index": i, "arch": case.arch, "config": config_to_dict(case.cfg), "run": run_args(case.spec),
                       "attention": case.cfg.attention, "error": f"{type(exc).__name__}: {exc}"[:300]}
            row["seed"] = seed
            if args.out:
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
            rows.append(row)
            if "error" in row:
                print(f"{seed}:{i:<4d} {case.arch:10s} ERROR {row['error']}", flush=True)
                continue
            flag = "  PAST THE BAR" if abs(row["error_pct"]) > BAR_PCT else ""
            print(f"{seed}:{i:<4d} {case.arch:10s} {row['error_pct']:+8.4f}% {row['estimated_phase']:>9s}/"
                  f"{row['measured_phase']:<9s} {row['measure_s']:5.1f}s  {case.label}{flag}", flush=True)
    print(summary(rows, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
