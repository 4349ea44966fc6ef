"""Run history and the pages' display of a run's end: statuses kept (cancelled and failed runs too), old
databases migrated, the export in numbers, a pasted model's name. The pages are driven with recorded child
output (tests/replay.py): the child is not what these tests check."""
import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.config import PRESETS, GPT2Config, config_from_dict, model_label
from planner.compare import completed
from planner.store import RunStore, runs_csv
from tests.replay import ReplayJob, recorded

ROOT = Path(__file__).resolve().parent.parent
TINY = {"arch": "gpt2", "vocab_size": 300, "context_length": 64, "emb_dim": 32, "n_heads": 2, "n_layers": 2,
        "drop_rate": 0.1}
TINY_NAME = "gpt2 h32 L2 (46.7K params)"
OLD_SCHEMA = """CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, kind TEXT NOT NULL,
    model TEXT NOT NULL, settings TEXT NOT NULL, device TEXT NOT NULL, estimate_bytes INTEGER, measured_bytes INTEGER,
    error_pct REAL, record TEXT NOT NULL)"""


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PLANNER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "data"


def store() -> RunStore:
    return RunStore()


def test_a_database_from_before_statuses_opens_and_keeps_its_runs(data_dir):
    data_dir.mkdir()
    with sqlite3.connect(data_dir / "runs.sqlite") as db:
        db.execute(OLD_SCHEMA)
        db.execute("INSERT INTO runs (created, kind, model, settings, device, estimate_bytes, measured_bytes, error_pct,"
                   " record) VALUES (1.0, 'train', 'gpt2-small', '{}', 'cpu', 110, 100, 10.0, '{}')")
    [old] = store().list()
    assert old["status"] == "done" and old["measured_bytes"] == 100
    store().save("train", "m", {}, "cpu", 100, None, {"error": "x"}, status="cancelled")
    assert [r["status"] for r in store().list()] == ["cancelled", "done"]


def test_export_holds_numbers_with_estimate_and_measured_first():
    store().save("train", "a", {"batch_size": 2}, "cpu", 3 * 2**30, 3 * 2**30 - 5, {})
    store().save("load", "b", {"method": "mmap"}, "cpu", 1000, None, {}, status="failed")
    runs = store().list()
    parsed = list(csv.DictReader(io.StringIO(runs_csv(runs))))
    assert list(parsed[0])[:5] == ["estimate_bytes", "estimate", "measured_bytes", "measured", "error_pct"]
    done = next(r for r in parsed if r["status"] == "done")
    assert done["estimate_bytes"] == str(3 * 2**30) and done["estimate"] == "3.00 GiB"
    assert done["measured_bytes"] == str(3 * 2**30 - 5)  # an integer, though another row has none
    assert float(done["error_pct"]) == pytest.approx(100 * 5 / (3 * 2**30 - 5), abs=1e-3)
    failed = next(r for r in parsed if r["status"] == "failed")
    assert failed["measured_bytes"] == "" and failed["error_pct"] == ""
    assert [r["model"] for r in completed(runs)] == ["a"]


def test_a_pasted_model_gets_a_name():
    assert model_label(config_from_dict(TINY)) == TINY_NAME
    assert model_label(config_from_dict({**TINY, "name": "my tiny gpt"})) == "my tiny gpt"
    assert model_label(PRESETS["llama-3-8b"], "pasted config") == "llama h4096 L32 (8.03B params)"
    assert model_label(PRESETS["llama-3-8b"], "llama-3-8b") == "llama-3-8b"
    assert model_label(GPT2Config(vocab_size=1000, context_length=64, emb_dim=64, n_heads=2, n_layers=2)).endswith(
        "(232.2K params)")


def test_runs_page_lists_every_status_and_charts_completed_runs():
    store().save("train", "gpt2-small", {"batch_size": 2}, "cpu", 110, 100, {})
    store().save("train", "gpt2-small", {"batch_size": 4}, "cpu", 220, None, {}, status="cancelled")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.switch_page("pages/3_runs.py").run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table.columns[:5]) == ["estimate_bytes", "estimate", "measured_bytes", "measured", "error_pct"]
    assert sorted(table["status"]) == ["cancelled", "done"] and table["estimate_bytes"].dtype.kind == "i"
    assert any("1 completed runs; 1 cancelled or failed" in c.value for c in at.caption)


def training_page(at_events: list[dict], final: str | None, kind: str = "measure"):
    """The Training step page (opened directly: its default run) for the pasted tiny model, with a replayed job
    of `kind` (measure or simulate)."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.switch_page("pages/1_training.py").run()
    at.radio(key="source").set_value("Paste a config").run()
    at.text_area(key="config_text").set_value(json.dumps(TINY)).run()
    at.session_state["job"] = ReplayJob(at_events, final)
    at.session_state["job_kind"] = kind
    return at.run()


def test_a_simulation_is_shown_as_simulated_and_stored_with_its_source():
    events = recorded("simulate_train_tiny.jsonl")
    at = training_page(events, "done", kind="simulate")
    assert not at.exception and not at.error
    assert [p.proto.text for p in at.get("progress")] == ["Finished: simulated on fake tensors in a child process"]
    assert "Simulated peak" in [m.label for m in at.metric] and any("fake tensors hold no memory" in c.value for c in at.caption)
    [run] = store().list()
    assert run["status"] == "done" and run["measured_bytes"] == events[-1]["peak_bytes"]
    at.switch_page("pages/3_runs.py").run()
    assert list(at.dataframe[0].value["source"]) == ["simulate"]


def test_simulate_is_offered_where_a_measurement_is_refused():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.switch_page("pages/1_training.py").run()
    at.selectbox(key="preset").set_value("llama-3-8b").run()
    at.session_state["run_settings"] = {"spec": {"batch_size": 8, "seq_len": 8192}, "attention": None, "budget": None}
    at.run()
    assert at.button(key="run").disabled and not at.button(key="simulate").disabled
    assert "Not started" in at.error[0].value


def test_training_cancel_is_information_and_the_run_is_kept():
    at = training_page([e for e in recorded("measure_train_tiny.jsonl") if e.get("event") == "progress"][:3], None)
    assert at.get("progress")[0].proto.text == "Running: timed step"
    at.button(key="cancel").click().run()
    assert not at.exception and not at.error
    assert "Cancelled" in at.info[0].value
    [run] = store().list()
    assert run["status"] == "cancelled" and run["model"].startswith("pasted gpt2") and run["measured_bytes"] is None


def test_training_final_status_reads_finished():
    events = recorded("measure_train_tiny.jsonl")
    at = training_page(events, "done")
    assert not at.exception and not at.error
    texts = [p.proto.text for p in at.get("progress")]
    assert texts == ["Finished: measured in a child process"] and not any("done: done" in t for t in texts)
    [run] = store().list()
    assert run["status"] == "done" and run["measured_bytes"] == events[-1]["peak_bytes"]


def test_training_failure_is_an_error_and_kept():
    at = training_page([{"event": "progress", "stage": "build", "fraction": 0.05},
                        {"error": "out of memory: boom", "phase": "forward", "oom": True}], "failed")
    assert "Failed: out of memory: boom (phase: forward)" in at.error[0].value
    assert store().list()[0]["status"] == "failed"


def loading_page(preset: str = "gpt2-small") -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.switch_page("pages/2_loading.py").run()
    return at.selectbox(key="preset").set_value(preset).run()


def test_loading_dtype_defaults_to_the_configs_torch_dtype():
    at = loading_page("llama-3.2-1b")
    assert at.selectbox(key="load_dtype").value == "bfloat16"
    assert any("W = 2.30 GiB of bfloat16" in c.value for c in at.caption)  # 2.47 GB, not fp32's 4.60 GiB
    at.selectbox(key="load_dtype").set_value("float32").run()
    assert any("W = 4.60 GiB of float32" in c.value for c in at.caption)
    at.selectbox(key="preset").set_value("gpt2-small").run()  # another model starts from its own dtype
    assert at.selectbox(key="load_dtype").value == "float32"
    at.selectbox(key="preset").set_value("llama-2-7b").run()
    assert at.selectbox(key="load_dtype").value == "float16"


def test_loading_refuses_cuda_on_a_cpu_only_machine():
    at = loading_page()
    if at.session_state["machine_gpu"]:
        pytest.skip("this machine has a GPU")
    assert not at.button(key="measure_all").disabled
    at.selectbox(key="load_device").set_value("cuda").run()
    assert at.button(key="measure_all").disabled
    assert "no GPU" in at.warning[0].value


def test_loading_says_what_the_cache_takes_and_refuses_a_full_disk(monkeypatch):
    at = loading_page()
    assert any("writes the checkpoints once" in c.value and "model.safetensors" in c.value for c in at.caption)
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 2**20, 2**20))
    at.run()
    assert at.button(key="measure_all").disabled and "of disk" in at.warning[0].value


def test_loading_progress_advances_per_method_and_cancel_is_kept():
    events = recorded("measure_load_all_tiny_fp16.jsonl")
    at = loading_page()
    at.session_state["load_job"] = ReplayJob(events[:5], None)
    at.run()
    bar = at.get("progress")[0].proto
    assert bar.value == 42 and bar.text == "Running: measuring mmap (4/7)"
    at.button(key="cancel_load").click().run()
    assert not at.error and "Cancelled" in at.info[0].value
    assert [r["status"] for r in store().list()] == ["cancelled"]


def test_loading_results_are_stored_per_method_with_the_dtype():
    events = recorded("measure_load_all_tiny_fp16.jsonl")
    at = loading_page()
    at.session_state["load_job"] = ReplayJob(events, "done")
    at.run()
    assert not at.exception and not at.error
    runs = store().list()
    assert len(runs) == 7 and {r["status"] for r in runs} == {"done"}
    assert {r["settings"]["dtype"] for r in runs} == {"float16"}  # what each record says it loaded
    assert all(r["error_pct"] == 0 and r["model"] == "gpt2-small" for r in runs)
