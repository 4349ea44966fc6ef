"""`bench families --family F --out docs/accuracy.md`: one family's table put into the families section in place of
its old one (or added), the other families' tables and summary rows kept as they are (no torch).

Without this, one family's run would write a section holding that family alone (bench/common.py
write_section replaces a whole section). The section's layout is bench/main.py families_markdown's: a summary
table (| family | rows | worst |error| % |) and one "## family" table per family.
"""
from __future__ import annotations

from pathlib import Path


def _split(section: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(the lines before the summary table's rows, {family: its summary row}, {family: its "## family" part})."""
    head, summary, parts = [], {}, {}
    current = None
    for line in section.splitlines(keepends=True):
        if line.startswith("## "):
            current = line[3:].strip()
            parts[current] = line
        elif current is not None:
            parts[current] += line
        elif line.startswith("| ") and not line.startswith("| family |") and line.count("|") == 4:
            summary[line.split("|")[1].strip()] = line
        else:
            head.append(line)
    return head, summary, parts


def _section(text: str, heading: str) -> str | None:
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("# "):
            inside = line.rstrip("\n") == heading
        if inside:
            out.append(line)
    return "".join(out) or None


def merge(out: str | Path, new_text: str) -> str:
    """The families section with new_text's families in place of (or after) those in the file at `out`."""
    path = Path(out)
    heading = new_text.splitlines()[0]
    old = _section(path.read_text(), heading) if path.exists() else None
    if old is None:
        return new_text
    _, old_summary, old_parts = _split(old)
    head, new_summary, new_parts = _split(new_text)
    summary = {**old_summary, **new_summary}
    parts = {k: v if v.endswith("\n\n") else v.rstrip("\n") + "\n\n" for k, v in {**old_parts, **new_parts}.items()}
    body = "".join(head).rstrip("\n") + "\n" + "".join(summary.values()) + "\n" + "".join(parts.values())
    return body.rstrip("\n") + "\n"
