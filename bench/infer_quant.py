"""`python -m planner bench inference-quantized [--quick] [--out docs/accuracy.md]`: generate()'s peak with
bitsandbytes-quantized weights (int8 / nf4 / fp4, transformers' BitsAndBytesConfig: planner/routines/
infer_quant.py), estimated (planner/estimate/inference.py with planner/infer_quant.py's weight bytes) against
measured (live bytes) and simulated (fake tensors; 4-bit only: bitsandbytes' Int8Params cannot wrap a fake
tensor), on every transformers family's tiny config. Every row runs in a fresh child; no torch here.

The configs are each family's first grid config with its widths set to multiples of 64 (hidden 64, MLP 128,
4 heads of 16, 2 KV heads): bitsandbytes' CPU 4-bit kernel on an AVX512-BF16 CPU repacks each weight in
(out, in/64) absmax blocks and fails on other shapes (measured: a 64 x 160 down_proj raises "shape '[64, 2]'
is invalid for input of size 160"; planner/infer_quant.py check_quantized_infer refuses it in one line).
"""
from __future__ import annotations

import dataclasses
import datetime
import platform

from .common import _torch_version, _version, write_section
from .inference import BAR_PCT, NEW_TOKENS, _child, _estimate, _fmt
from planner.infer_spec import InferSpec, check_infer

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gpt2-hf")
QUANTS = (("int8", False), ("nf4", False), ("fp4", True))
QUICK_QUANTS = (("int8", False), ("nf4", False))
# widths that every quantized linear of the tiny configs satisfies (out % 32, in % 64: see the module doc)
WIDTHS = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
GPT2_WIDTHS = dict(n_embd=64, n_head=4, n_inner=None)


def quant_config(cfg):
    fields = {f.name for f in dataclasses.fields(cfg)}
    widths = {k: v for k, v in {**WIDTHS, **GPT2_WIDTHS}.items() if k in fields}
    if "sliding_window" in fields and getattr(cfg, "sliding_window", None) is not None:
        widths["sliding_window"] = 4096  # beyond the run (sliding caches are not modelled yet)
    return dataclasses.replace(cfg, **widths)


def grid_rows(quick: bool):
    from planner.arch import families

    for name in FAMILIES:
        fam = families().get(name)
        if fam is None or not fam.grid_configs():
            continue
        label, cfg, b, s = fam.grid_configs()[0]
        cfg = quant_config(cfg)
        label = f"V{cfg.vocab_size} h64 f128 a4 kv2 b{b} s{s}"
        atts = fam.attention_kinds(cfg)[: (1 if quick else None)]
        for att in atts:
            for prec in (("fp32",) if quick else ("fp32", "bf16")):
                for q, dq in (QUICK_QUANTS if quick else QUANTS):
                    c = dataclasses.replace(cfg, attention=att)
                    ispec = InferSpec(b, s, NEW_TOKENS, precision=prec, quantize_weights=q, double_quant=dq)
                    check_infer(c, ispec)
                    yield name, label, c, ispec


def run_grid(quick: bool, progress=print) -> list[dict]:
    rows = []
    for name, label, cfg, ispec in grid_rows(quick):
        m = _child("infer", cfg, ispec)
        s = _child("simulate-infer", cfg, ispec) if ispec.quantize_weights != "int8" else {}
        est = _estimate(cfg, ispec)
        row = {"family": name, "label": label, "attention": cfg.attention, "precision": ispec.precision,
               "quant": ispec.quantize_weights + (" dq" if ispec.double_quant else ""),
               "measured": m.get("peak_bytes"), "phase": m.get("peak_phase"), "simulated": s.get("peak_bytes"),
               "persistent_m": m.get("persistent_bytes"),
               "persistent_e": est["persistent_bytes"] if est else None,
               "estimated": est["peak_bytes"] if est else None, "error": m.get("error") or s.get("error")}
        if row["measured"] and row["estimated"]:
            row["err_pct"] = 100.0 * (row["estimated"] - row["measured"]) / row["measured"]
        progress(f"{name} {label} {row['attention']} {ispec.precision} {row['quant']}: {row}")
        rows.append(row)
    return rows


def markdown(grid: list[dict]) -> str:
    today = datetime.date.today().isoformat()
    lines = ["# Inference with quantized weights (bitsandbytes, issue #21)", "",
             f"`python -m planner bench inference-quantized` ({today}; torch {_torch_version()}, transformers "
             f"{_version('transformers')}, bitsandbytes {_version('bitsandbytes')}, {platform.machine()}). "
             "The model as users load it: `from_pretrained(folder, quantization_config=BitsAndBytesConfig(...), "
             "dtype=D)`, int8 = `load_in_8bit` (Linear8bitLt), nf4 / fp4 = `load_in_4bit` with "
             "`bnb_4bit_compute_dtype=D` (dq: `bnb_4bit_use_double_quant`), then "
             f"`generate(max_new_tokens={NEW_TOKENS}, min_new_tokens={NEW_TOKENS}, do_sample=False)`, DynamicCache. "
             "Weights = the quantized linears' storage with absmax / scales and codes, the rest in D. "
             "int8 is measured only (bitsandbytes' Int8Params cannot wrap a fake tensor: simulate refuses it). "
             "On this CPU (AVX512-BF16) bitsandbytes repacks 4-bit weights at the first forward (absmax to bf16, "
             "double quantization undone): the estimate counts that form for `--device cpu` on such a CPU.", "",
             "| family | config | attention | precision | weights | phase | measured B | simulated B | sim = meas | "
             "weights + prompt meas = est | estimated B | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in grid:
        if r["quant"] == "int8":
            same = "not simulable"
        elif r["measured"] is None:
            same = "—"
        else:
            same = "yes" if r["measured"] == r["simulated"] else (
                f"{r['simulated'] - r['measured']:+,} B" if r["simulated"] else "fails")
        pers = "—" if r["persistent_e"] is None else ("yes" if r["persistent_m"] == r["persistent_e"] else
                                                      f"{r['persistent_e'] - (r['persistent_m'] or 0):+,} B")
        err = f"{r['err_pct']:+.2f}%" if "err_pct" in r else "—"
        lines.append(f"| {r['family']} | {r['label']} | {r['attention']} | {r['precision']} | {r['quant']} | "
                     f"{r['phase'] or r['error'] or ''} | {_fmt(r['measured'])} | {_fmt(r['simulated'])} | {same} | "
                     f"{pers} | {_fmt(r['estimated'])} | {err} |")
    errs = [abs(r["err_pct"]) for r in grid if "err_pct" in r]
    sims = [r for r in grid if r["quant"] != "int8" and r["measured"] is not None]
    exact = sum(1 for r in sims if r["measured"] == r["simulated"])
    pers = sum(1 for r in grid if r["persistent_e"] is not None and r["persistent_e"] == r["persistent_m"])
    lines += ["", (f"Estimated rows: {len(errs)}, within {BAR_PCT}%: {sum(e <= BAR_PCT for e in errs)}; worst |error| "
                   f"{max(errs):.2f}%; weights + prompt exact to the byte: {pers} of {len(errs)}." if errs else ""),
              f"Simulated (4-bit) = measured to the byte: {exact} of {len(sims)}.", ""]
    return "\n".join(lines) + "\n"


def main(quick: bool = False, out: str | None = None, progress=print) -> int:
    text = markdown(run_grid(quick, progress))
    print(text)
    if out:
        write_section(out, text)
    return 0
