"""One family's run of `bench families --family F --out FILE` (and `bench record --grid families --family F`) keeps
the other families' tables and records (bench/families_doc.py, bench/recorded.py)."""
import subprocess
import sys

from bench.common import write_section
from bench.families_doc import _split, merge

HEAD = "# Hugging Face families: estimate vs transformers' own model (cpu)"


def _section(date: str, fams: dict[str, list[tuple[str, int]]]) -> str:
    lines = [HEAD, "", f"Date: {date}.", "", "| family | rows | worst \\|error\\| % |", "|---|---:|---:|"]
    lines += [f"| {f} | {len(rows)} | 0.{len(rows)}00 |" for f, rows in fams.items()]
    for f, rows in fams.items():
        lines += ["", f"## {f}", "", "| config | estimate (B) |", "|---|---:|"] + [f"| {c} | {v:,} |" for c, v in rows]
    return "\n".join(lines) + "\n"


def test_one_family_replaces_its_table_and_keeps_the_others(tmp_path):
    doc = tmp_path / "accuracy.md"
    doc.write_text("# Before\n\ntext\n\n")
    write_section(doc, _section("old", {"llama": [("a", 1), ("b", 2)], "mixtral": [("m", 3)]}))
    doc.write_text(doc.read_text() + "\n# After\n\nmore\n")
    new = _section("new", {"mixtral": [("m", 4), ("n", 5)], "qwen3_moe": [("q", 6)]})
    write_section(doc, merge(doc, new))
    text = doc.read_text()
    assert text.startswith("# Before") and text.rstrip().endswith("more")
    _, summary, parts = _split(text.split("# After")[0].split(HEAD)[1])
    assert list(summary) == ["llama", "mixtral", "qwen3_moe"]
    assert "| 2 |" in summary["mixtral"] and "| 1 |" in summary["qwen3_moe"]
    assert "| a | 1 |" in parts["llama"] and "| n | 5 |" in parts["mixtral"] and "| m | 3 |" not in parts["mixtral"]
    assert "Date: new." in text and "Date: old." not in text


def test_record_family_goes_with_the_families_grid():
    out = subprocess.run([sys.executable, "-m", "planner", "bench", "record", "--grid", "accuracy", "--family",
                          "mixtral"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--grid families" in out.stderr


def test_family_tables_from_the_recorded_rows():
    """`bench record --grid families --family F --out FILE` writes F's table from the rows it recorded, each
    re-estimated now (the same figures tests/test_recorded.py holds to the bar)."""
    from bench.recorded import RECORD_DIR, families_markdown_from_record, load

    _, rows = load(RECORD_DIR / "families.jsonl")
    qwen3 = [r for r in rows if r["config"]["arch"] == "qwen3"]
    text = families_markdown_from_record(["qwen3"], None)
    _, summary, parts = _split(text)
    assert list(summary) == ["qwen3"] and f"| {len(qwen3)} |" in summary["qwen3"]
    table = [line for line in parts["qwen3"].splitlines() if line.startswith("| qwen3 ")]
    assert len(table) == len(qwen3) and f"{qwen3[0]['peak_bytes']:,}" in table[0]
