"""The benchmarks sit beside the product (bench/, issue #34): planner never imports them, `python -m planner bench`
loads them lazily from the repository (from any working directory; exit 2 in one line without them), and the
children a benchmark starts find them wherever they run."""
import ast
import subprocess
import sys
from pathlib import Path

from planner.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    """The absolute module names a file imports (relative imports resolved against planner/'s packages)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = parts[:-1]  # a module's package (an __init__.py's is its own folder: the same parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            out.add(".".join([*base, *([node.module] if node.module else [])]))
    return out


def test_the_product_does_not_import_the_benchmarks():
    """planner/, app.py and pages/ import no bench module (planner/cli/main.py's `bench` command alone loads it),
    no test imports planner.bench, and planner/bench/ is gone."""
    assert not (ROOT / "planner" / "bench").exists()
    product = [*(ROOT / "planner").rglob("*.py"), ROOT / "app.py", *(ROOT / "pages").rglob("*.py")]
    leaks = [f"{p.relative_to(ROOT)}: {m}" for p in product if p != ROOT / "planner" / "cli" / "main.py"
             for m in _imports(p) if m == "bench" or m.startswith(("bench.", "planner.bench"))]
    assert not leaks, leaks
    tests = [f"{p.relative_to(ROOT)}: {m}" for p in (ROOT / "tests").rglob("*.py")
             for m in _imports(p) if m.startswith("planner.bench")]
    assert not tests, tests


def test_bench_runs_from_another_directory(tmp_path):
    """planner imported without the repository on sys.path (an editable install's finder, say), run elsewhere:
    the `bench` command finds bench/ beside planner/ and re-estimates a recorded grid."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from planner.cli import main as m; "
            f"sys.path.remove({str(ROOT)!r}); sys.exit(m.main(['bench', 'record', '--from-records', '--grid', '8bit']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "## 8-bit optimizers (bitsandbytes AdamW8bit)" in out.stderr and "| 8bit | 128 |" in out.stderr


def test_bench_without_the_package_is_refused_in_one_line(monkeypatch, capsys):
    """An installed planner without the repository: `bench` exits 2 with one line, no traceback."""
    monkeypatch.setitem(sys.modules, "bench", None)  # None in sys.modules: the import fails as a missing module
    monkeypatch.setitem(sys.modules, "bench.main", None)
    assert cli.main(["bench", "speed", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("planner: error: bench: the benchmarks are not installed") and err.count("\n") == 1, err


def test_a_benchmark_child_imports_bench_from_any_directory(tmp_path):
    """The environment bench gives its children (the inference grids' child, the CUDA shards): the repository on
    PYTHONPATH, so `python -m bench.inference` and `from bench.gpu_grids import ...` work outside it."""
    from bench import child_env

    out = subprocess.run([sys.executable, "-c", "import bench, bench.inference, bench.gpu_grids; print(bench.__file__)"],
                         cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip()) == ROOT / "bench" / "__init__.py"
