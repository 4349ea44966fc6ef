"""Every accuracy grid's measurements, recorded once, so the estimate is held to all of them in seconds.

    python -m planner bench record [--grid accuracy|families|finetune|finetune-book|qlora|8bit|finetune-amp|all]
    python -m planner bench record --grid families --family mixtral,qwen2_moe   (those families' rows only, put in
                                                                                  the kept file in place of theirs;
                                                                                  also --grid finetune|finetune-amp)

A row is measured exactly as `measure train` measures it (planner.measure.training.measure_training, the
live-bytes tracker), in one process for the whole grid: a fresh TrainingStep per row holds the same bytes as a
fresh child (checked: the recorded file's own freshness test re-measures rows in a child). Each grid's file,
tests/data/measured/<grid>.jsonl, starts with a header line (the versions measured on, the date, the bar) and
has one line per row: its label, the config and spec as JSON, and the measured peak and phase peaks.

The estimate reads no file: tests/test_recorded.py re-estimates every recorded row with the code as it is now
and holds it to the grid's bar, so a change to an estimator is checked against ~1,700 real measurements in a
few seconds. The measurements go stale only when torch, transformers, peft or bitsandbytes change: the header
names their versions, the test refuses a file recorded on other versions, and `bench record` renews it.
"""
from __future__ import annotations

import datetime
import json
from dataclasses import asdict
from pathlib import Path

RECORD_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "measured"
PACKAGES = ("torch", "transformers", "peft", "bitsandbytes")
# the grids whose rows `bench record --family` can renew one family at a time (every row names its config's arch)
FAMILY_GRIDS = ("families", "finetune", "finetune-amp")


def grids() -> dict[str, tuple[float, callable]]:
    """grid name -> (its bar in percent, the function that lists its rows), from the benchmarks that own them."""
    from . import main as bench
    from .bnb import BNB_BAR_PCT, bnb_grid
    from .finetune_amp import AMP_BAR_PCT, finetune_amp_grid

    def families_rows():
        from planner.arch import families
        return [row for fam in families() for row in bench.family_grid(fam)]

    return {"accuracy": (bench.ACCURACY_BAR_PCT, bench.accuracy_grid),
            "families": (bench.FAMILY_BAR_PCT, families_rows),
            "finetune": (bench.FINETUNE_BAR_PCT, bench.finetune_grid),
            "finetune-book": (bench.FINETUNE_BAR_PCT, bench.finetune_book_grid),
            "qlora": (bench.FINETUNE_QUANT_BAR_PCT, bench.finetune_qlora_grid),
            "8bit": (BNB_BAR_PCT, bnb_grid),
            "finetune-amp": (AMP_BAR_PCT, finetune_amp_grid)}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def record_row(label: str, cfg, spec) -> dict:
    from planner.config import config_to_dict
    from planner.measure.training import measure_training

    meas = measure_training(cfg, spec)
    return {"label": label, "config": config_to_dict(cfg), "spec": asdict(spec), "peak_bytes": meas["peak_bytes"],
            "peak_phase": meas["peak_phase"], "phase_peak_bytes": meas["phase_peak_bytes"]}


def record(name: str, out_dir: Path = RECORD_DIR, progress=print, family: str | None = None) -> Path:
    """Measure every row of one grid (in this process) and write its file; returns the path.

    family (FAMILY_GRIDS only; comma-separated arch names): measure only those families' rows and put them in the
    existing file in place of that family's old rows (the other families' records are kept as they are; the
    header's versions must be the ones installed, as the test requires of every row)."""
    bar, rows_of = grids()[name]
    rows = rows_of()
    kept: list[dict] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.jsonl"
    if family:
        from planner.config import ConfigError

        chosen = {f.strip() for f in family.split(",") if f.strip()}
        if name not in FAMILY_GRIDS:
            raise ConfigError(f"bench record --family goes with --grid {', '.join(FAMILY_GRIDS)}")
        unknown = chosen - {cfg.arch for _, cfg, _ in rows}
        if unknown:
            raise ConfigError(f"no rows of {', '.join(sorted(unknown))} in the {name} grid")
        rows = [r for r in rows if r[1].arch in chosen]
        if path.exists():
            header, old = load(path)
            if header["versions"] != versions():
                raise ConfigError(f"{path.name} was measured on other versions: record the whole grid")
            kept = [r for r in old if r["config"].get("arch") not in chosen]
    date = today = datetime.date.today().isoformat()
    if family and path.exists() and not header["date"].startswith(today):
        # the kept rows were measured on the header's date: it stays, with the date of the families renewed now
        note = f"{', '.join(sorted(chosen))} rows: {today}"
        date = header["date"][:-1] + f"; {note})" if header["date"].endswith(")") else f"{header['date']} ({note})"
    tmp = path.with_suffix(".jsonl.part")
    with tmp.open("w") as fh:
        fh.write(json.dumps({"grid": name, "bar_pct": bar, "rows": len(kept) + len(rows), "versions": versions(),
                             "date": date}) + "\n")
        for row in kept:
            fh.write(json.dumps(row) + "\n")
        for i, (label, cfg, spec) in enumerate(rows):
            fh.write(json.dumps(record_row(label, cfg, spec)) + "\n")
            progress(f"{name} {i + 1}/{len(rows)} {label}")
    tmp.replace(path)  # a run cut short leaves the last complete file in place
    return path


def load(path: Path) -> tuple[dict, list[dict]]:
    lines = path.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def re_estimate(row: dict) -> tuple[int, float]:
    """(estimated peak, error in percent against the recorded measurement) with the estimator as it is now."""
    from planner.config import config_from_dict
    from planner.estimate.training import estimate_training
    from planner.spec import TrainSpec

    est = estimate_training(config_from_dict(row["config"]), TrainSpec(**row["spec"]))
    return est.peak_bytes, 100.0 * (est.peak_bytes - row["peak_bytes"]) / row["peak_bytes"]


def is_gap(grid: str, row: dict) -> bool:
    """A fine-tuning row the estimate names a documented gap for (planner/estimate/finetune.py known_gap):
    held to bench/common.py FINETUNE_GAP_BAR_PCT, as `bench finetune` and `bench finetune-amp` mark it."""
    if not grid.startswith("finetune"):
        return False
    from .common import finetune_gap
    from planner.config import config_from_dict
    from planner.spec import TrainSpec

    return finetune_gap((row["label"], config_from_dict(row["config"]), TrainSpec(**row["spec"]))) is not None


def summary_markdown(record_dir: Path = RECORD_DIR) -> str:
    """One row per recorded grid: its rows, when and on what it was measured, and the estimate's worst error
    against it now (the figures tests/test_recorded.py holds to the bars)."""
    lines = ["# Recorded measurements: every grid re-estimated on every test run", "",
             "Command: `python -m planner bench record --grid all --out docs/accuracy.md`. Each grid's rows (the "
             "sections above) are measured once into `tests/data/measured/<grid>.jsonl`; `tests/test_recorded.py` "
             "re-estimates every row with the code as it is and holds it to the grid's bar, and measures one row of "
             "each grid again in a fresh child, which must equal its record to the byte. `python -m planner bench "
             "record --from-records --out docs/accuracy.md` measures nothing: it rebuilds those sections from the "
             "records with the estimate of the code as it is.", "",
             "| grid | rows | measured on | torch | transformers | peft | bitsandbytes | worst \\|error\\| | bar |",
             "|---|---:|---|---|---|---|---|---:|---:|"]
    total = gaps = 0
    for path in sorted(record_dir.glob("*.jsonl")):
        header, rows = load(path)
        modelled = [r for r in rows if not is_gap(path.stem, r)]  # (a documented gap has its own bar)
        gaps += len(rows) - len(modelled)
        worst = max((abs(re_estimate(r)[1]) for r in modelled), default=0.0)
        v = header["versions"]
        lines.append(f"| {header['grid']} | {len(rows)} | {header['date']} | {v['torch']} | {v['transformers']} | "
                     f"{v['peft']} | {v['bitsandbytes']} | {worst:.3f}% | {header['bar_pct']}% |")
        total += len(rows)
    lines += ["", f"{total} rows in all. " + (
        f"The worst |error| leaves out the {gaps} rows a documented gap names (planner/estimate/finetune.py "
        "known_gap; their own bar, 6%: the sections above mark them *gap*)." if gaps else
        "No row is a documented gap (planner/estimate/finetune.py known_gap names none): each is held to its "
        "grid's bar.")]
    return "\n".join(lines) + "\n"


def families_markdown_from_record(chosen: list[str], out: str | None, record_dir: Path = RECORD_DIR) -> str:
    """The families section (bench/main.py families_markdown) for `chosen` families from their recorded rows
    (each measured by record_row, as `bench families` measures it) re-estimated now; with `out`, merged into that
    file's section (bench/families_doc.py: the other families' tables are kept)."""
    from .main import families_markdown

    _, rows = load(record_dir / "families.jsonl")
    results: dict[str, list[dict]] = {}
    for row in rows:
        arch = row["config"].get("arch")
        if arch in chosen:
            est, err = re_estimate(row)
            results.setdefault(arch, []).append({
                "config": row["label"], "estimate_bytes": est, "measured_bytes": row["peak_bytes"], "error_pct": err,
                "estimated_phase": _estimated_phase(row), "measured_phase": row["peak_phase"]})
    text = families_markdown({f: results[f] for f in chosen if f in results}, "cpu")
    if out:
        from .families_doc import merge

        text = merge(out, text)
    return text


def _estimated_phase(row: dict) -> str:
    from planner.config import config_from_dict
    from planner.estimate.training import estimate_training
    from planner.spec import TrainSpec

    return estimate_training(config_from_dict(row["config"]), TrainSpec(**row["spec"])).peak_phase


def main(grid: str = "all", out: str | None = None, progress=print, family: str | None = None) -> int:
    names = list(grids()) if grid == "all" else [grid]
    for name in names:
        path = record(name, progress=progress, family=family)
        header, rows = load(path)
        worst = max((abs(re_estimate(r)[1]) for r in rows), default=0.0)
        progress(f"{name}: {len(rows)} rows recorded in {path.name}; worst |estimate error| {worst:.3f}% "
                 f"(bar {header['bar_pct']}%)")
    text = summary_markdown()
    print(text)
    if out:
        from .common import write_section

        write_section(out, text)
        if family and grid == "families":  # the families' own tables in the families section, from the rows just recorded
            write_section(out, families_markdown_from_record([f.strip() for f in family.split(",") if f.strip()], out))
    return 0


# The recorded grids' sections of docs/accuracy.md, rebuilt from their records (`bench record --from-records`):
# the same table writers as the benchmarks that measure them, fed each recorded row re-estimated now.
FROM_RECORD_COLUMNS = "measured (B) and meas. phase"  # what a record row holds (record_row): peak and phase peaks
# measured after the first four families: their own subsections (Phi-3 and the MoE families: bench/main.py
# FINETUNE_WALKED_FAMILIES, on a smaller grid)
FINETUNE_OWN_TABLES = ("gemma", "gemma2", "phi3", "qwen2_moe", "mixtral", "qwen3_moe")


def results_from_record(rows: list[dict]) -> list[dict]:
    """A benchmark's result rows (bench/main.py run_accuracy's keys) from recorded rows: the measured
    peak and phase from the record, the estimate of the code as it is now."""
    from planner.config import config_from_dict
    from planner.estimate.training import estimate_training
    from planner.spec import TrainSpec

    out = []
    for row in rows:
        est = estimate_training(config_from_dict(row["config"]), TrainSpec(**row["spec"]))
        out.append({"config": row["label"], "estimate_bytes": est.peak_bytes, "measured_bytes": row["peak_bytes"],
                    "error_pct": 100.0 * (est.peak_bytes - row["peak_bytes"]) / row["peak_bytes"],
                    "estimated_phase": est.peak_phase, "measured_phase": row["peak_phase"]})
    return out


def record_note(grid: str, header: dict, extra: str = "") -> str:
    """The line that replaces a section's "Date: ... Machine: ..." line: when and on what the rows were measured
    (the record's header), and that the estimates are today's."""
    v = header["versions"]
    return (f"Measured on {header['date']} (tests/data/measured/{grid}.jsonl: torch {v['torch']}, transformers "
            f"{v['transformers']}, peft {v['peft']}, bitsandbytes {v['bitsandbytes']}), re-estimated on "
            f"{datetime.date.today().isoformat()} with the code of today: `python -m planner bench record "
            f"--from-records --out docs/accuracy.md`. From the record: the {FROM_RECORD_COLUMNS} columns; the "
            f"estimate, error and est. phase are today's.{extra}")


def _with_note(text: str, note: str) -> str:
    """The table writers' "Date: <today>. Machine: <this one>, ..." sentence (it runs to the line's end or to its
    "Command:") replaced by `note`."""
    import re

    return re.sub(r"^Date: \S+\. Machine: .*?(?=( Command:)|$)", lambda _: note, text, count=1, flags=re.M)


def sections_from_records(grid: str = "all", record_dir: Path = RECORD_DIR) -> list[str]:
    """The docs/accuracy.md sections of the recorded grids (each starting with its `# ` heading; an 8bit-only
    run gives the `## 8-bit` subsection) re-estimated from their records, in the benchmarks' own layout."""
    from . import main as bench
    from .bnb import bnb_markdown
    from .common import finetune_gap
    from .finetune_amp import amp_markdown
    from planner.config import config_from_dict
    from planner.spec import TrainSpec

    def rec(name):
        header, rows = load(record_dir / f"{name}.jsonl")
        return header, rows, results_from_record(rows)

    def gaps(rows):
        return [finetune_gap((r["label"], config_from_dict(r["config"]), TrainSpec(**r["spec"]))) is not None
                for r in rows]

    def eight_bit():
        header, rows, res = rec("8bit")
        triples = [(r["label"], config_from_dict(r["config"]), TrainSpec(**r["spec"])) for r in rows]
        return _with_note(bnb_markdown(triples, res, gaps(rows)), record_note(
            "8bit", header, " The optimizer state column and `bench finetune-8bit`'s comparison with torch's "
            "AdamW are not in the record (run `bench finetune-8bit` for them)."))

    names = list(grids()) if grid == "all" else [grid]
    out = []
    if "accuracy" in names:
        header, _, res = rec("accuracy")
        out.append(_with_note(bench.accuracy_markdown(res, "cpu"), record_note(
            "accuracy", header, " The simulated column of `bench accuracy` is not in the record.")))
    if "families" in names:
        header, rows, res = rec("families")
        by_family: dict[str, list[dict]] = {}
        for row, r in zip(rows, res):
            by_family.setdefault(row["config"]["arch"], []).append(r)
        out.append(_with_note(bench.families_markdown(by_family, "cpu"), record_note("families", header)))
    if "finetune" in names:
        header, rows, res = rec("finetune")
        g = gaps(rows)
        note = record_note("finetune", header)
        main_rows = [i for i, row in enumerate(rows) if row["config"]["arch"] not in FINETUNE_OWN_TABLES]
        text = _with_note(bench.finetune_markdown([res[i] for i in main_rows], "cpu", [g[i] for i in main_rows]), note)
        for fam in FINETUNE_OWN_TABLES:
            idx = [i for i, row in enumerate(rows) if row["config"]["arch"] == fam]
            if idx:
                sub = bench.finetune_markdown([res[i] for i in idx], "cpu", [g[i] for i in idx])
                text += "\n" + _with_note(sub.replace("# Fine-tuning:", f"## Fine-tuning {fam}:", 1), note)
        if (record_dir / "8bit.jsonl").exists():
            text += "\n" + eight_bit()
        out.append(text)
    elif "8bit" in names:
        out.append(eight_bit())
    if "qlora" in names:
        header, _, res = rec("qlora")
        out.append(_with_note(bench.qlora_markdown(res, "cpu"), record_note("qlora", header)))
    if "finetune-book" in names:
        header, rows, res = rec("finetune-book")
        out.append(_with_note(bench.finetune_book_markdown(bench.finetune_markdown(res, "cpu")),
                              record_note("finetune-book", header)))
    if "finetune-amp" in names:
        header, rows, res = rec("finetune-amp")
        for r, gap in zip(res, gaps(rows)):
            r["gap"] = gap
        out.append(_with_note(amp_markdown(res, "cpu"), record_note("finetune-amp", header)))
    return out


def write_from_records(grid: str = "all", out: str | None = None, progress=print, record_dir: Path = RECORD_DIR) -> int:
    """`bench record --from-records`: print (and with `out`, write into that file) the recorded grids' sections
    re-estimated from their records, then the summary section; nothing is measured."""
    from .bnb import write_subsection
    from .common import write_section

    for text in sections_from_records(grid, record_dir) + [summary_markdown(record_dir)]:
        progress(text)
        if out:
            (write_subsection if text.startswith("## ") else write_section)(out, text)
    return 0
