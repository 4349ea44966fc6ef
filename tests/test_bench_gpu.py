"""The CUDA check's plan (bench.gpu): it runs only on a GPU, so here its grid and its report are checked."""
import json
from dataclasses import asdict

from bench.gpu import cuda_grid, gpu_markdown
from planner.config import config_to_dict
from planner.estimate.training import estimate_training
from planner.spec import OPTIMIZER_IMPLS, PRECISIONS, TORCH_OPTIMIZERS


def test_cuda_grid_covers_every_setting_once_per_combination():
    rows = cuda_grid()
    assert len({label for label, _, _ in rows}) == len(rows) == 128
    combos = {(type(c).__name__, c.attention, s.precision, s.checkpointing) for _, c, s in rows}
    assert len(combos) == 2 * 2 * len(PRECISIONS) * 2  # each combination, at each of the 4 shapes
    assert {s.optimizer for _, _, s in rows} == set(TORCH_OPTIMIZERS)
    assert {s.optimizer_impl for _, _, s in rows} == set(OPTIMIZER_IMPLS)
    assert all(s.device == "cuda" for _, _, s in rows)


def test_gpu_markdown_compares_todays_estimate_with_the_records(tmp_path):
    label, cfg, spec = cuda_grid()[0]
    est = estimate_training(cfg, spec).peak_bytes
    # A record in the shape the child writes; the allocator figures are set 1% and 10% above the estimate.
    rec = {"label": label, "config": config_to_dict(cfg), "spec": asdict(spec), "exit_code": 0,
           "measured": {"peak_allocated_bytes": round(est / 0.99), "peak_reserved_bytes": round(est / 0.9),
                        "peak_phase": "backward"}}
    (tmp_path / "grid.jsonl").write_text(json.dumps(rec) + "\n")
    (tmp_path / "probe.json").write_text(json.dumps({"gpu": "Test GPU", "total_bytes": 2**34, "torch": "x",
                                                     "cuda": "y", "allocated_for_bytes": {"1": 512},
                                                     "persistent_after": {"fp32 matmul": 0}}))
    text = gpu_markdown(str(tmp_path))
    assert "worst |error| against allocated 1.00%" in text and "against reserved 10.00%" in text
    assert f"| {label} | {est:,} |" in text


def test_gpu_rows_are_the_recorded_and_inference_grids_on_cuda(tmp_path):
    """The recorded CPU grids and the inference grids, each row set to cuda; the report re-estimates a row
    and sets CUDA's live bytes beside the CPU's recorded peak."""
    from bench.gpu_grids import ROWS_FILE, infer_rows, recorded_rows, rows_markdown

    train, infer = recorded_rows(), infer_rows()
    assert len(train) > 1000 and {r["spec"]["device"] for r in train + infer} == {"cuda"}
    assert {"accuracy", "families", "finetune-amp", "qlora"} <= {r["grid"] for r in train}
    assert {"dynamic", "static", "offloaded"} <= {r["spec"]["cache"] for r in infer}
    row = next(r for r in train if r["grid"] == "accuracy")
    from bench.gpu_grids import _estimate

    est, _ = _estimate(row)
    cpu = row["cpu"]["peak_bytes"]
    rec = {**row, "measured": {"peak_allocated_bytes": round(est / 0.99), "tracked_peak_bytes": round(cpu * 1.02),
                               "peak_phase": "backward"}}
    bad = {**infer[0], "error": "RuntimeError: boom"}
    (tmp_path / ROWS_FILE).write_text(json.dumps(rec) + "\n" + json.dumps(bad) + "\n")
    text = "\n".join(rows_markdown(str(tmp_path), 1.0))
    # per grid: the error against allocated (-1%); the worst rows: the live-bytes error (live_error)
    from bench.gpu_grids import live_error

    assert "2 rows" in text and "+2.00% / +2.00%" in text and "| 1.000% |" in text
    assert f"| {live_error(rec)[2]:+.3f} |" in text
    assert "Rows that failed on CUDA (1)" in text and "RuntimeError: boom" in text
