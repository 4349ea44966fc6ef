"""The allocator replay wired into the planner: the simulated run's event list (planner/measure/alloc_events.py)
against the simulation's own live bytes, the records' reserved keys, and the fit keeping a replay's reserve free."""
import dataclasses

from planner.allocator import events_from_run, replay, run_figures
from planner.config import config_from_dict
from planner.estimate.training import CUDA_CONTEXT_BYTES, estimate_training
from planner.fit import fit_report
from planner.spec import TrainSpec

TINY = config_from_dict({"arch": "gpt2", "vocab_size": 300, "context_length": 64, "emb_dim": 32, "n_heads": 2,
                         "n_layers": 2, "drop_rate": 0.1})
SPEC = TrainSpec(2, 32, "fp32", optimizer_impl="foreach", device="cpu")


def test_event_lists_hold_the_simulated_live_bytes():
    """Without the cuBLAS workspaces, the requests alive at once peak at the simulation's own peak (its tracked step):
    in the list made up from the tracked step (build, step 1 with the optimizer's lazy state, step 2) and in the
    whole run logged from the build on."""
    from planner.measure.alloc_run import simulate_events, simulate_run

    rec, initial, step = simulate_events(TINY, SPEC)
    fig = run_figures(initial, step, 0)
    assert fig["allocator_replay"]["requested_peak_bytes"] == rec["peak_bytes"]
    assert fig["reserved_peak_bytes"] >= fig["allocator_replay"]["allocated_peak_bytes"] >= rec["peak_bytes"]
    run = simulate_run(TINY, SPEC)
    assert [e[1] for e in run if e[0] == "m"] == ["step 1", "step 2"]
    res = replay(events_from_run(run, 0, host_scalars=False))
    assert res.requested_peak_bytes == rec["peak_bytes"]
    assert res.windows[0][0] == "step 2"


def test_simulate_records_the_replay_of_its_whole_run():
    """simulate --device cuda logs its build and warm-up step and joins them to the tracked step
    (planner/measure/simulate.py, alloc_events.RunLog): the same run simulate_run logs in one go, so the same
    replay. Device-blind: forced here on the CPU."""
    from planner.allocator import figures
    from planner.estimate.training import CUBLAS_WORKSPACE_BYTES_PER_HANDLE
    from planner.measure.alloc_run import simulate_run
    from planner.measure.simulate import simulate_training

    rec = simulate_training(TINY, SPEC, allocator_replay=True)
    alone = figures(events_from_run(simulate_run(TINY, SPEC), CUBLAS_WORKSPACE_BYTES_PER_HANDLE))
    assert rec["reserved_peak_bytes"] == alone["reserved_peak_bytes"]
    assert rec["fragmentation_bytes"] == alone["fragmentation_bytes"]
    assert rec["allocator_replay"]["events"] == alone["allocator_replay"]["events"]
    assert rec["reserved_peak_source"].startswith("simulate: the build, the warm-up step and the tracked step")
    assert "reserved_peak_bytes" not in simulate_training(TINY, SPEC)   # on the CPU, by default: no replay


def test_estimate_record_names_its_reserved_source():
    from planner.cli.args import _estimate_record

    rec = _estimate_record(TINY, dataclasses.replace(SPEC, device="cuda"))
    assert rec["reserved_peak_bytes"] - rec["fragmentation_bytes"] == rec["peak_bytes"]
    assert rec["reserved_peak_source"].startswith("estimate:") and "not a replay" in rec["reserved_peak_source"]
    assert "reserved_peak_bytes" not in _estimate_record(TINY, SPEC)


def test_fit_keeps_a_replays_reserve_free():
    spec = TrainSpec(1, 64, device="cuda")
    budget, reserve = 2 * 2**30, 50 * 2**20
    rec = fit_report(TINY, spec, budget, batch_given=False, reserve_bytes=reserve)
    tensors = budget - CUDA_CONTEXT_BYTES - reserve
    assert rec["allocator_reserve_bytes"] == reserve and rec["allocator_reserve_source"].startswith("replay")
    best = rec["max_batch_size"]
    assert estimate_training(TINY, dataclasses.replace(spec, batch_size=best)).peak_bytes <= tensors
    assert estimate_training(TINY, dataclasses.replace(spec, batch_size=best + 1)).peak_bytes > tensors
    assert fit_report(TINY, spec, budget, batch_given=False)["allocator_reserve_source"].startswith("measured share")


def test_fit_answers_from_the_replay_of_its_own_run():
    """fit --replay-reserve: the measured share's answer is replayed, the fit redone with that run's reserve, until
    the answer is the run replayed (the replay here stands in for the simulate child: a fixed reserve per run)."""
    from planner.fit import fit_report_replayed

    spec, budget = TrainSpec(1, 64, device="cuda"), 2 * 2**30
    seen = []

    def replay(cfg, run):
        seen.append(run.batch_size)
        return {"fragmentation_bytes": 10 * 2**20, "reserved_peak_bytes": 0}
    rec = fit_report_replayed(TINY, spec, budget, batch_given=False, replay=replay)
    share = fit_report(TINY, spec, budget, batch_given=False)
    assert rec["allocator_reserve_bytes"] == 10 * 2**20 and rec["allocator_reserve_source"].startswith("replay")
    assert rec["max_batch_size"] >= share["max_batch_size"]   # 10 MiB is less than the measured share here
    assert rec["allocator_reserve_run"]["batch_size"] == seen[-1] == rec["max_batch_size"]

    def runs_out(cfg, run):   # a replay that runs out at the answer: one batch down is replayed instead
        return {"oom": {"event": 1}} if run.batch_size == share["max_batch_size"] else {"fragmentation_bytes": 0}
    rec = fit_report_replayed(TINY, spec, budget, batch_given=False, replay=runs_out, rounds=1)
    assert rec["allocator_reserve_run"]["batch_size"] == share["max_batch_size"] - 1


def test_fit_replay_reserve_cli_refusals():
    import subprocess
    import sys

    for device, words in (("cpu", "give --device cuda"), ("cuda", "needs simulate --device cuda")):
        r = subprocess.run([sys.executable, "-m", "planner", "fit", "--model", "gpt2-small", "--seq-len", "128",
                            "--budget", "8GiB", "--device", device, "--replay-reserve", "--json"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
