"""What every benchmark shares (no torch): the versions and machine a table names, the markdown section
writer, and the documented-gap rule of the fine-tuning grids. bench/main.py and the other bench/ files import
it; it imports none of them.
"""
from __future__ import annotations


# A documented gap (planner/estimate/finetune.py known_gap): rows it names are held to this looser bar
# (none are named now: the recompute transients that were the gap are modelled).
FINETUNE_GAP_BAR_PCT = 6.0


def finetune_gap(label_cfg_spec) -> str | None:
    from planner.estimate.finetune import known_gap

    _, cfg, spec = label_cfg_spec
    return known_gap(cfg, spec)


def _version(package: str) -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001
        return "?"


def write_section(path, text: str) -> None:
    """Put `text` (a markdown section whose first line is its `# ` heading) in the file at `path`: it replaces
    the section with the same heading line, else it is appended; the file's other sections are kept."""
    from pathlib import Path

    path = Path(path)
    heading = text.splitlines()[0]
    old = path.read_text() if path.exists() else ""
    sections, current = [], []
    for line in old.splitlines(keepends=True):
        if line.startswith("# ") and current:
            sections.append("".join(current))
            current = []
        current.append(line)
    if current:
        sections.append("".join(current))
    body = text if text.endswith("\n") else text + "\n"
    for i, sec in enumerate(sections):
        if sec.splitlines()[0] == heading:
            sections[i] = body + ("\n" if i < len(sections) - 1 else "")
            break
    else:
        if sections and not sections[-1].endswith("\n\n"):
            sections[-1] += "\n"
        sections.append(body)
    path.write_text("".join(sections))


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 1


def _torch_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001
        return "?"
