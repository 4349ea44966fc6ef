"""Random generate() configurations for tests/test_infer_fuzz.py (issue #39), and the child that runs them.

One case: a random config of an inference family (FAMILIES: every family whose generate() the estimate models, the
RMSNorm decoders, the MoE decoders, transformers' GPT-2 and the book's GPT-2), a precision, an attention kind, a
cache the family lists for that config (planner.serving.cache_choices; the offloaded cache runs on CUDA only and is
left out on a CPU), a batch, a prompt and a number of new tokens. The estimate is held against the measurement
(planner.measure.inference: the live-bytes tracker on the real call) within BAR_PCT, and the simulation
(planner.measure.simulate_infer) must equal the measurement to the byte.

Seeds: every run draws a new seed and prints it; PLANNER_FUZZ_SEED replays one (a list, "1,2,3", runs several),
PLANNER_FUZZ_CASES sets the number of cases per seed. A longer run, outside the suite:

    python tests/infer_fuzz.py --seeds 11,12,13 --cases 100 [--out runs.jsonl] [--families mixtral,qwen3_moe]
    python tests/infer_fuzz.py --retable runs.jsonl   # the stored runs re-estimated with the code as it is now

prints one line per case and the table of docs/accuracy.md's "generate() on random configurations" section.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BAR_PCT = 1.0  # the project's bar for an estimate against its measurement (README: "within 1% unless told")
DEVICE = "cpu"  # the offloaded cache needs CUDA (planner/estimate/infer_caches.py CUDA_ONLY): not drawn here
PRECISIONS = ("fp32", "bf16", "fp16")  # planner/infer_spec.py INFER_PRECISIONS
# the families whose generate() the estimate models (README, "Inference"): the RMSNorm decoders, the MoE decoders
# (their sparse block: planner/arch/moe.py infer_forward_points), transformers' GPT-2 and the book's GPT-2 (its
# generate_text_simple, cache "none")
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gpt2-hf", "gpt2", "mixtral", "qwen2_moe",
            "qwen3_moe")
MAX_PROMPT = 300
MAX_NEW = 16
MAX_BATCH = 4
# the suite's cases (tests/test_infer_fuzz.py) are drawn smaller, to keep its few measured cases within seconds
SMALL = dict(max_prompt=72, max_new=6, max_vocab=2000, max_layers=2)
FULL = dict(max_prompt=MAX_PROMPT, max_new=MAX_NEW, max_vocab=8000, max_layers=3)


def new_seed() -> int:
    return random.SystemRandom().randrange(1, 2**31)


def seeds_from_env(default_count: int = 1) -> list[int]:
    """PLANNER_FUZZ_SEED ("7" or "7,8,9"), else `default_count` fresh seeds."""
    raw = os.environ.get("PLANNER_FUZZ_SEED", "").strip()
    if raw:
        return [int(s) for s in raw.replace(" ", "").split(",") if s]
    return [new_seed() for _ in range(default_count)]


def cases_from_env(default: int) -> int:
    raw = os.environ.get("PLANNER_FUZZ_CASES", "").strip()
    return int(raw) if raw else default


def _heads(rng: random.Random) -> tuple[int, int]:
    a = rng.choice((1, 2, 3, 4, 6, 8))
    kv = rng.choice([k for k in range(1, a + 1) if a % k == 0])
    return a, kv


def random_config(rng: random.Random, name: str, size: dict = FULL):
    """A random config of family `name` (its first grid config with random sizes), valid for its family."""
    V, L, P = size["max_vocab"], size["max_layers"], size["max_prompt"] + size["max_new"]
    from planner.arch import families

    fam = families()[name]
    if name == "gpt2":  # the book's GPTModel (planner/arch/gpt2_book.py)
        a = rng.choice((1, 2, 3, 4, 6, 8))
        return fam.config_cls(vocab_size=rng.randint(50, V // 2), context_length=P + rng.randint(0, 64),
                              emb_dim=a * rng.choice((8, 16, 24, 32)), n_heads=a, n_layers=rng.randint(1, L),
                              qkv_bias=rng.random() < 0.5, attention=rng.choice(("eager", "sdpa")))
    base = fam.grid_configs()[0][1]
    fields = {f.name for f in dataclasses.fields(base)}
    a, kv = _heads(rng)
    d = rng.choice((8, 16, 24, 32))
    kw = {}
    if name == "gpt2-hf":
        kw = dict(vocab_size=rng.randint(50, V), n_embd=a * d, n_head=a, n_layer=rng.randint(1, L),
                  n_positions=P + rng.randint(0, 64),
                  n_inner=rng.choice((None, 8 * rng.randint(2, 64))))
    else:
        kw = dict(vocab_size=rng.randint(50, V), num_hidden_layers=rng.randint(1, L), num_attention_heads=a,
                  num_key_value_heads=kv, intermediate_size=8 * rng.randint(2, 64),
                  tie_word_embeddings=rng.random() < 0.5, max_position_embeddings=1024)
        if name in ("qwen3", "qwen3_moe", "gemma", "gemma2"):  # head_dim apart from hidden / heads
            kw.update(hidden_size=8 * rng.randint(2, 40), head_dim=d)
        else:
            kw.update(hidden_size=a * d)
            if "head_dim" in fields:
                kw["head_dim"] = d
        if name in ("mistral", "phi3"):  # a window the run crosses, one it stays inside, or none
            kw["sliding_window"] = rng.choice((None, rng.randint(8, P)))
        if name == "gemma2":
            kw["sliding_window"] = rng.randint(8, P + 32)
        if name == "mixtral":
            kw["num_local_experts"] = rng.randint(2, 6)
            kw["num_experts_per_tok"] = rng.randint(1, min(3, kw["num_local_experts"]))
        if name in ("qwen2_moe", "qwen3_moe"):
            kw["num_experts"] = rng.randint(2, 6)
            kw["num_experts_per_tok"] = rng.randint(1, min(3, kw["num_experts"]))
            kw["moe_intermediate_size"] = 8 * rng.randint(2, 32)
            if name == "qwen2_moe":
                kw["shared_expert_intermediate_size"] = 8 * rng.randint(2, 32)
        if "pad_token_id" in fields and base.pad_token_id is not None:
            kw["pad_token_id"] = 0
    cfg = dataclasses.replace(base, **{k: v for k, v in kw.items() if k in fields})
    kinds = fam.attention_kinds(cfg) if hasattr(fam, "attention_kinds") else ("eager",)
    return dataclasses.replace(cfg, attention=rng.choice(kinds))


def random_case(rng: random.Random, name: str, size: dict = FULL, tries: int = 50):
    """(config, InferSpec) of family `name` that planner.infer_spec.check_infer accepts."""
    from planner.config import ConfigError
    from planner.infer_spec import InferSpec, check_infer
    from planner.serving import cache_choices

    for _ in range(tries):
        try:  # a config the planner refuses (as transformers would: Gemma 2's hidden size and heads) is drawn again
            cfg = random_config(rng, name, size)
        except ConfigError:
            continue
        caches = [c for c in cache_choices(cfg) if c != "offloaded"]
        ispec = InferSpec(batch_size=rng.randint(1, MAX_BATCH), prompt_len=rng.randint(1, size["max_prompt"]),
                          new_tokens=rng.randint(1, size["max_new"]), precision=rng.choice(PRECISIONS),
                          cache=rng.choice(caches), device=DEVICE)
        try:
            check_infer(cfg, ispec)
        except ConfigError:
            continue
        return cfg, ispec
    raise AssertionError(f"no accepted {name} case in {tries} draws")


def draw_cases(seed: int, count: int, families: tuple[str, ...] = FAMILIES,
               size: dict = FULL) -> list[tuple[str, object, object]]:
    """`count` cases of one seed: the families in turn (a shuffled cycle), so every family is drawn."""
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        cycle = list(families)
        rng.shuffle(cycle)
        order += cycle
    return [(name, *random_case(rng, name, size)) for name in order[:count]]


def label(cfg, ispec) -> str:
    from planner.config import config_to_dict

    c = config_to_dict(cfg)
    keys = ("vocab_size", "hidden_size", "n_embd", "emb_dim", "intermediate_size", "n_inner", "num_hidden_layers",
            "n_layer", "n_layers", "num_attention_heads", "n_head", "n_heads", "num_key_value_heads", "head_dim",
            "sliding_window", "tie_word_embeddings", "num_local_experts", "num_experts", "num_experts_per_tok")
    short = " ".join(f"{k}={c[k]}" for k in keys if c.get(k) is not None)
    return (f"{c['arch']} {short} attn={c.get('attention')} b{ispec.batch_size} p{ispec.prompt_len} "
            f"n{ispec.new_tokens} {ispec.precision} {ispec.cache}")


def estimate_peak(cfg, ispec) -> dict:
    from planner.estimate.inference import estimate_inference

    est = estimate_inference(cfg, ispec)
    return {k: est[k] for k in ("peak_bytes", "peak_phase", "phase_peak_bytes")}


def child() -> None:
    """Measure and simulate each case of stdin's JSON list, one JSON line each on stdout (one torch import)."""
    from planner.config import config_from_dict
    from planner.infer_spec import InferSpec
    from planner.measure.inference import measure_inference
    from planner.measure.simulate_infer import simulate_inference
    from planner.serving import simulate_refusal

    for row in json.loads(sys.stdin.read()):
        cfg, ispec = config_from_dict(row["config"]), InferSpec(**row["spec"])
        out = {}
        for kind, fn in (("measure", measure_inference), ("simulate", simulate_inference)):
            if kind == "simulate" and simulate_refusal(ispec):
                out[kind] = None
                continue
            try:
                r = fn(cfg, ispec)
                out[kind] = {k: r[k] for k in ("peak_bytes", "peak_phase", "phase_peak_bytes")}
            except Exception as exc:  # noqa: BLE001  (reported as the case's failure)
                out[kind] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(json.dumps(out), flush=True)


def run_cases(cases, timeout_s: float = 3600):
    """Yield one result dict per (family, config, InferSpec): the estimate, the measurement, the simulation,
    the error in percent and what failed (empty when the case passes)."""
    from planner.config import config_to_dict

    payload = [{"config": config_to_dict(c), "spec": i.to_dict()} for _, c, i in cases]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, __file__, "--child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=str(ROOT))
    proc.stdin.write(json.dumps(payload))
    proc.stdin.close()
    t0 = time.time()
    for (name, cfg, ispec), line in zip(cases, proc.stdout):
        got = json.loads(line)
        yield check(name, cfg, ispec, got["measure"], got["simulate"])
        if time.time() - t0 > timeout_s:
            proc.kill()
            break
    proc.wait()


def check(name, cfg, ispec, meas: dict, sim: dict | None) -> dict:
    from planner.config import config_to_dict

    res = {"family": name, "label": label(cfg, ispec), "measured": None, "estimated": None, "simulated": None,
           "err_pct": None, "failures": [], "config": config_to_dict(cfg), "spec": ispec.to_dict(),
           "measure": meas, "simulate": sim}
    try:
        est = estimate_peak(cfg, ispec)
        res["estimated"] = est["peak_bytes"]
        res["est_phases"] = est["phase_peak_bytes"]
    except Exception as exc:  # noqa: BLE001
        res["failures"].append(f"estimate: {type(exc).__name__}: {exc}")
        est = None
    if "error" in meas:
        res["failures"].append(f"measure: {meas['error']}")
        return res
    res["measured"] = meas["peak_bytes"]
    if est is not None:
        res["err_pct"] = 100.0 * (est["peak_bytes"] - meas["peak_bytes"]) / meas["peak_bytes"]
        if abs(res["err_pct"]) > BAR_PCT:
            res["failures"].append(f"estimate {est['peak_bytes']:,} ({est['peak_phase']}) vs measured "
                                   f"{meas['peak_bytes']:,} ({meas['peak_phase']}): {res['err_pct']:+.3f}%")
    if sim is not None:
        if "error" in sim:
            res["failures"].append(f"simulate: {sim['error']}")
        else:
            res["simulated"] = sim["peak_bytes"]
            if sim["phase_peak_bytes"] != meas["phase_peak_bytes"]:
                res["failures"].append(f"simulate {sim['phase_peak_bytes']} != measure {meas['phase_peak_bytes']}")
    return res


def table(results: list[dict], seeds: list[int]) -> str:
    """docs/accuracy.md's table: cases per family, worst error, simulate = measure, failures."""
    lines = ["| family | cases | caches drawn | worst estimate error | mean abs error | estimated = measured, both "
             "phases to the byte | simulated = measured | outside the bar |", "|---|---|---|---|---|---|---|---|"]
    both = lambda rows: sum(1 for r in rows if r.get("est_phases") is not None and r["measured"] is not None
                            and r["est_phases"] == r["measure"]["phase_peak_bytes"])
    for name in FAMILIES:
        rows = [r for r in results if r["family"] == name]
        if not rows:
            continue
        errs = [r["err_pct"] for r in rows if r["err_pct"] is not None]
        worst = max(errs, key=abs) if errs else None
        caches = sorted({r["label"].rsplit(" ", 1)[1] for r in rows})
        sims = [r for r in rows if r["simulated"] is not None]
        exact = sum(r["simulated"] == r["measured"] for r in sims)
        lines.append(f"| {name} | {len(rows)} | {', '.join(caches)} | "
                     f"{'—' if worst is None else f'{worst:+.4f}%'} | "
                     f"{'—' if not errs else f'{sum(abs(e) for e in errs) / len(errs):.4f}%'} | "
                     f"{both(rows)} of {len(rows)} | {exact} of {len(sims)} | {sum(1 for r in rows if r['failures'])} |")
    errs = [r["err_pct"] for r in results if r["err_pct"] is not None]
    sims = [r for r in results if r["simulated"] is not None]
    lines.append(f"| all | {len(results)} | | {max(errs, key=abs):+.4f}% | "
                 f"{sum(abs(e) for e in errs) / len(errs):.4f}% | {both(results)} of {len(results)} | "
                 f"{sum(r['simulated'] == r['measured'] for r in sims)} of {len(sims)} | "
                 f"{sum(1 for r in results if r['failures'])} |")
    lines.append("")
    lines.append(f"Seeds: {', '.join(str(s) for s in seeds)}.")
    return "\n".join(lines)


def retable(path: str) -> int:
    """The table of an --out file's cases with the estimate as the code is now."""
    from planner.config import config_from_dict
    from planner.infer_spec import InferSpec

    results, seeds = [], []
    for line in open(path):
        old = json.loads(line)
        cfg, ispec = config_from_dict(old["config"]), InferSpec(**old["spec"])
        res = check(old["family"], cfg, ispec, old["measure"], old["simulate"])
        res["seed"] = old["seed"]
        seeds += [old["seed"]] if old["seed"] not in seeds else []
        results.append(res)
        if res["failures"]:
            print(f"FAIL {res['label']}" + "".join(f"\n      {f}" for f in res["failures"]))
    print(table(results, seeds))
    return 1 if any(r["failures"] for r in results) else 0


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="generate() on random configurations (issue #39)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: PLANNER_FUZZ_SEED or one new)")
    ap.add_argument("--cases", type=int, default=None, help="cases per seed (default: PLANNER_FUZZ_CASES or 24)")
    ap.add_argument("--out", default=None, help="append one JSON line per case here")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated families to draw")
    ap.add_argument("--retable", default=None, help="re-estimate the cases of an --out file (their measurements "
                    "and simulations kept: they do not depend on the estimate) and print the table")
    args = ap.parse_args(argv)
    if args.child:
        child()
        return 0
    if args.retable:
        return retable(args.retable)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else seeds_from_env()
    count = args.cases or cases_from_env(24)
    results = []
    for seed in seeds:
        print(f"seed {seed}: {count} cases", flush=True)
        for res in run_cases(draw_cases(seed, count, tuple(args.families.split(",")))):
            res["seed"] = seed
            results.append(res)
            err = "—" if res["err_pct"] is None else f"{res['err_pct']:+.4f}%"
            print(f"  {'FAIL' if res['failures'] else 'ok  '} {err:>10} {res['label']}"
                  + "".join(f"\n      {f}" for f in res["failures"]), flush=True)
            if args.out:
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(res) + "\n")
    print(table(results, seeds))
    return 1 if any(r["failures"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
