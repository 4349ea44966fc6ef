"""`bench record --from-records` (bench/recorded.py write_from_records): a recorded grid's section of
docs/accuracy.md rebuilt from its record, re-estimated with the code as it is, nothing measured."""
from __future__ import annotations

import json

from bench.recorded import RECORD_DIR, load, sections_from_records, write_from_records
from planner.config import config_from_dict
from planner.estimate.training import estimate_training
from planner.spec import TrainSpec


def _small_record(tmp_path, grid: str, picks) -> tuple[dict, list[dict]]:
    """A record of a few of `grid`'s real rows (its header, with the row count and date changed) in tmp_path."""
    header, rows = load(RECORD_DIR / f"{grid}.jsonl")
    rows = [rows[i] for i in picks]
    header = {**header, "rows": len(rows), "date": "2026-01-02"}
    (tmp_path / f"{grid}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [header, *rows]))
    return header, rows


def _row_line(row: dict) -> str:
    est = estimate_training(config_from_dict(row["config"]), TrainSpec(**row["spec"]))
    err = 100.0 * (est.peak_bytes - row["peak_bytes"]) / row["peak_bytes"]
    return (f"| {row['label']} | {est.peak_bytes:,} | {row['peak_bytes']:,} | {err:+.3f} | {est.peak_phase} | "
            f"{row['peak_phase']} |")


def test_accuracy_section_from_a_small_record(tmp_path):
    header, rows = _small_record(tmp_path, "accuracy", [0, 7, 21])
    doc = tmp_path / "accuracy.md"
    doc.write_text("# Other section\n\nkept as it is\n")
    assert write_from_records("accuracy", out=str(doc), progress=lambda _: None, record_dir=tmp_path) == 0
    text = doc.read_text()
    assert text.startswith("# Other section\n\nkept as it is\n\n# Training-step peak: estimate vs measurement (cpu)\n")
    # the table: the record's measured peak and phase beside today's estimate, one line per recorded row, in order
    table = [line for line in text.splitlines() if any(line.startswith(f"| {r['label']} |") for r in rows)]
    assert table == [_row_line(r) for r in rows]
    worst = max(abs(float(line.split("|")[4])) for line in table)
    assert f"**3 configs, worst |error| {worst:.3f}%**" in text
    # the header says when and on what the rows were measured (the record's) and that the estimates are today's
    v = header["versions"]
    assert (f"Measured on 2026-01-02 (tests/data/measured/accuracy.jsonl: torch {v['torch']}, transformers "
            f"{v['transformers']}, peft {v['peft']}, bitsandbytes {v['bitsandbytes']}), re-estimated on") in text
    assert "Date: " not in text and "simulated (B)" not in text  # no column the record does not hold
    # and the recorded-grids summary, from the same record
    assert "| accuracy | 3 | 2026-01-02 |" in text


def test_finetune_section_keeps_its_family_and_8bit_subsections(tmp_path):
    _, rows = _small_record(tmp_path, "finetune", [0, 600, 700])  # llama, gemma, gemma2
    _, rows8 = _small_record(tmp_path, "8bit", [3])
    text = sections_from_records("finetune", tmp_path)[0]
    heads = [line for line in text.splitlines() if line.startswith("#")]
    assert heads == ["# Fine-tuning: estimate vs measurement (cpu)", "## Fine-tuning gemma: estimate vs measurement (cpu)",
                     "## Fine-tuning gemma2: estimate vs measurement (cpu)", "## 8-bit optimizers (bitsandbytes AdamW8bit)"]
    assert [r["config"]["arch"] for r in rows] == ["llama", "gemma", "gemma2"]
    for row in rows:
        assert _row_line(row) in text
    # the 8-bit table keeps the record's columns (no optimizer-state column: not recorded) and names what is not there
    from bench.bnb import small_tensor_counts

    row8 = rows8[0]
    big, small = small_tensor_counts(config_from_dict(row8["config"]), TrainSpec(**row8["spec"]))
    assert _row_line(row8).replace(" | ", f" | {big} / {small} | ", 1) in text.splitlines()
    assert "opt. state est = meas" not in text and "The optimizer state column" in text


def test_cli_from_records_refuses_family():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "planner", "bench", "record", "--from-records", "--grid", "families",
                          "--family", "llama"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--from-records re-estimates whole grids" in out.stderr
