"""The README's three questions are answered by the commands it shows, as written (exit 0, and the line that
answers each question is there). The figures in the README are a run's output at the time it was written."""
import shlex
from pathlib import Path

from planner.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent
PREFIX = ".venv/bin/python -m planner "
# The line of each command's output that answers its question
ANSWERS = {"fit": "options for batch 1", "train": "fewest devices that fit", "infer": "largest batch at 8,192 tokens"}


def test_the_readme_commands_answer_their_questions(capsys):
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines() if ln.strip().startswith(PREFIX)]
    assert len(lines) == 3
    for line in lines:
        args = shlex.split(line[len(PREFIX):])
        assert cli.main(args) == 0, line
        out = capsys.readouterr().out
        key = args[0] if args[0] == "fit" else args[1]
        assert ANSWERS[key] in out, (line, out)
