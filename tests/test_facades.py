"""The facades the pages call, one per question (issue #34): training (planner.plan plan_training / plan_fitted),
inference (planner.serving plan_inference), loading (planner.loading plan_loading), your module (planner.plan
module_plan / check_point) and estimate against measurement (planner.compare). The pages do no arithmetic on
planner figures: every sum, margin, guard and percentage they show is checked here against the estimators
and the rule it stands for."""
import json
from pathlib import Path

import pytest

from planner.config import PRESETS, ConfigError, GPT2Config, config_from_dict, with_attention, with_dtype
from planner.estimate.distributed import estimate_distributed
from planner.estimate.inference import estimate_inference
from planner.estimate.loading import METHODS, estimate_loading, recommend
from planner.estimate.training import estimate_training
from planner.fit import choose_layout, tensor_budget
from planner.infer_spec import InferSpec
from planner.parallel import ParallelSpec
from planner.plan import check_point, module_plan, plan_fitted, plan_training
from planner.serving import plan_inference
from planner.spec import TrainSpec, prepare
from planner.units import bytes_to_gib, gib_to_bytes
from tests.replay import DATA as RECORDED_DIR

ROOT = Path(__file__).resolve().parent.parent

GPT = GPT2Config(vocab_size=1000, context_length=128, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.1)
LLAMA = config_from_dict({"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 160,
                          "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "max_position_embeddings": 256})
RUN = {"precision": "fp32", "optimizer": "adamw", "checkpointing": False, "grad_accum": 1, "optimizer_impl": "default",
       "device": "cpu", "loss": "default", "checkpoint_policy": "full", "offload_optimizer": False,
       "offload_activations": False}


def test_units_budget_round_trip():
    assert gib_to_bytes(24) == 24 * 2**30 and gib_to_bytes(0.5) == 2**29
    assert gib_to_bytes(1.3) == int(1.3 * 2**30)  # truncated, as every page did
    assert bytes_to_gib(int(23.99 * 2**30)) == 24.0 and bytes_to_gib(3 * 2**29) == 1.5


def test_training_facade_margin_terms_and_phases():
    budget = 30 * 2**20
    p = plan_training(GPT, RUN, 4, 64, None, budget)
    spec = TrainSpec(4, 64, **RUN)
    est = estimate_training(prepare(GPT, spec, None), spec)
    assert p.spec == spec and p.parallel is None and p.layout_choice is None
    assert p.peak_bytes == est.peak_bytes
    assert p.margin_bytes == abs(budget - est.peak_bytes)
    rows = p.term_rows()
    assert [r["name"] for r in rows] == [t["name"] for t in est.terms]
    for r, t in zip(rows, est.terms):  # a per-layer term over the model's 2 layers, the others once
        assert r["bytes (x L if per layer)"] == t["bytes"] * (2 if t["per_layer"] else 1)
    assert any(r["per_layer"] for r in rows)
    phases = p.phase_rows()
    assert phases[:len(est.phase_peak_bytes)] == [{"phase": k, "bytes": v} for k, v in est.phase_peak_bytes.items()]
    assert phases[len(est.phase_peak_bytes):] == [{"phase": f"transient: {k}", "bytes": v}
                                                  for k, v in est.transients.items()]
    assert p.host_optimizer_bytes == p.host_activation_bytes == 0 and p.cpu_ram_bytes is None


def test_training_facade_cpu_offload_adds_the_host_to_the_peak():
    """On a cpu device the offloaded optimizer's host copies are the same RAM as the device's peak."""
    run = {**RUN, "offload_optimizer": True}
    p = plan_training(GPT, run, 2, 32, None, 2**30)
    est = estimate_training(GPT, TrainSpec(2, 32, **run))
    host = est.transients["host_optimizer_offload"]
    assert host > 0 and p.host_optimizer_bytes == host
    assert p.cpu_ram_bytes == est.peak_bytes + host
    on_cuda = plan_training(GPT, {**run, "device": "cuda"}, 2, 32, None, 2**30)
    assert on_cuda.host_optimizer_bytes > 0 and on_cuda.cpu_ram_bytes is None  # the host is not the device there


def test_training_facade_checks_as_the_cli_does():
    with pytest.raises(ConfigError, match="offload-activations with --world-size"):
        plan_training(LLAMA, {**RUN, "offload_activations": True}, 1, 16, None, 2**30,
                      {"world_size": 2, "parallel": "ddp"})
    with pytest.raises(ConfigError, match="adam / adamw"):
        plan_training(GPT, {**RUN, "optimizer": "sgd", "offload_optimizer": True}, 1, 16, None, 2**30)


def test_training_facade_data_parallel_per_rank_and_the_layout():
    par = {"world_size": 4, "parallel": "fsdp"}
    budget = 64 * 2**20
    p = plan_training(LLAMA, RUN, 2, 64, None, budget, par)
    spec = TrainSpec(2, 64, **RUN)
    pspec = ParallelSpec(**par)
    dist = estimate_distributed(prepare(LLAMA, spec, None), spec, pspec)
    assert p.parallel == pspec and p.peak_bytes == dist.peak_bytes
    assert p.margin_bytes == abs(p.tensor_budget_bytes - dist.peak_bytes)
    assert p.term_rows() == list(dist.terms)
    assert p.phase_rows() == [{"phase": k, "bytes": v} for k, v in dist.phase_peak_bytes.items()]
    assert p.layout_choice == choose_layout(prepare(LLAMA, spec, None), spec, p.tensor_budget_bytes, pspec)
    assert p.host_optimizer_bytes == 0  # a data-parallel run says its host bytes per rank (DistEstimate.host_bytes)


def test_fitted_facade_with_and_without_the_kept_fit(data_dir):
    from planner.config import load_config
    from planner.fitted import fit_file, load_fit

    cfg, run = load_config(ROOT / "tests" / "data" / "configs" / "olmo2-tiny.json"), {**RUN, "device": "cuda"}
    fp = plan_fitted(cfg, run, 4, 512, None, 8 * 2**30)
    assert fp.plan is None and fp.tensor_budget_bytes == tensor_budget(8 * 2**30, "cuda") and fp.context_taken
    with pytest.raises(ConfigError, match="data-parallel layouts need a formula family"):
        plan_fitted(cfg, RUN, 4, 512, None, 2**30, {"world_size": 2, "parallel": "ddp"})
    path = fit_file(prepare(cfg, TrainSpec(4, 512), None), TrainSpec(4, 512))  # the fit a child keeps there
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((RECORDED_DIR / "fit_olmo2_tiny_b4_s512.json").read_text())
    what = load_fit(json.loads(path.read_text())["fit"])
    fp = plan_fitted(cfg, RUN, 4, 512, None, 2**30)
    assert not fp.context_taken and fp.tensor_budget_bytes == 2**30  # the CPU: no CUDA context off the budget
    assert fp.plan.peak_bytes == what.peak_bytes(4, 512)
    assert fp.plan.margin_bytes == abs(2**30 - what.peak_bytes(4, 512))
    assert fp.info == json.loads(path.read_text()).get("info", {})


def test_inference_facade_margin_guard_and_quantized_weights():
    cfg = PRESETS["llama-3.2-1b"]
    ispec = InferSpec(batch_size=2, prompt_len=256, new_tokens=32, precision="bf16", device="cpu")
    budget, ram = 8 * 2**30, 16 * 2**30
    p = plan_inference(cfg, ispec, budget, "sdpa", ram)
    est = estimate_inference(with_attention(cfg, "sdpa"), ispec)
    assert p.peak_bytes == est["peak_bytes"] and p.cfg.attention == "sdpa"
    assert p.margin_bytes == abs(budget - est["peak_bytes"])
    assert p.measure_limit_bytes == int(0.8 * ram)  # the CLI's guard (planner/api.py RAM_GUARD_FRACTION)
    assert p.measurable_here is (est["peak_bytes"] <= int(0.8 * ram))
    assert p.quantized_weights is None and p.simulate_refusal is None
    tight = plan_inference(cfg, ispec, budget, "sdpa", est["peak_bytes"])  # 80% of the peak: refused here
    assert not tight.measurable_here
    assert not plan_inference(cfg, InferSpec(2, 256, 32, precision="bf16", device="cuda"), budget, None, ram).measurable_here
    assert plan_inference(cfg, ispec, budget).measure_limit_bytes is None  # not asked: never offered


def test_inference_facade_names_what_bitsandbytes_holds():
    cfg = PRESETS["llama-3.2-1b"]
    ispec = InferSpec(1, 128, 16, precision="bf16", device="cuda", quantize_weights="int8")
    p = plan_inference(cfg, ispec, 24 * 2**30)
    est = estimate_inference(cfg, ispec)
    held, weights = p.quantized_weights
    assert weights == est["components"]["weights"] and est["terms"][0]["name"] == f"weights: {held}"
    assert p.simulate_refusal and "int8" in p.simulate_refusal


def test_loading_facade_gathers_every_method_and_the_recommendation(tmp_path):
    from planner.loading import measured_results, plan_loading

    cfg = PRESETS["gpt2-small"]
    ram = 64 * 2**30
    p = plan_loading(cfg, "cpu", "float16", None, ram, tmp_path)
    assert p.formula and p.cfg == with_dtype(cfg, "float16") and list(p.estimates) == list(METHODS)
    for row in p.table():
        e = estimate_loading(with_dtype(cfg, "float16"), row["method"], "cpu")
        assert (row["device"], row["cpu"], row["cpu_file"], row["cpu_anon"]) == (
            e.peak_device_bytes, e.peak_cpu_bytes, e.peak_cpu_file_bytes, e.peak_cpu_anon_bytes)
    assert p.checkpoint_bytes == estimate_loading(with_dtype(cfg, "float16"), "mmap", "cpu").checkpoint_bytes
    assert p.free_device_bytes == ram  # the device is the CPU: its free RAM
    assert (p.recommended, p.why) == recommend(with_dtype(cfg, "float16"), "cpu", ram, ram)
    assert p.refusal is None and not p.cache["cached"]
    gpu = plan_loading(cfg, "cuda", "float32", {"name": "H200", "total_bytes": 140 * 2**30}, ram, tmp_path)
    assert gpu.free_device_bytes == 140 * 2**30 and gpu.refusal is None
    nogpu = plan_loading(cfg, "cuda", "float32", None, ram, tmp_path)
    assert nogpu.free_device_bytes is None and "no GPU" in nogpu.refusal
    ok, failed = measured_results([{"method": "mmap", "peak_device_bytes": 1}, {"method": "meta", "error": "boom"}])
    assert [r["method"] for r in ok] == ["mmap"] and failed == ["meta: boom"]


def test_module_facade_margin_points_and_the_checked_point():
    fit = json.loads((RECORDED_DIR / "whatif_tiny_lm_fp32.json").read_text())
    p = module_plan(fit, 4, 64, 2**20, 4096)
    assert p.margin_bytes == abs(2**20 - p.peak_bytes)
    assert p.simulated_points == sum(len(f["points"]) for f in fit["fits"]) > 0
    assert p.validation_rows == (fit.get("validation") or {}).get("rows", [])
    record = {"peak_bytes": p.peak_bytes + 1000, "peak_phase": "backward"}
    checked = check_point(fit, record, 4, 64)
    assert checked["fitted_bytes"] == p.peak_bytes and checked["peak_phase"] == "backward"
    assert checked["fit_error_pct"] == pytest.approx(100.0 * -1000 / (p.peak_bytes + 1000))


def test_compare_error_and_the_runs_summary():
    from planner.compare import error_pct, runs_summary

    assert error_pct(110, 100) == pytest.approx(10.0) and error_pct(90, 100) == pytest.approx(-10.0)
    assert error_pct(None, 100) is None and error_pct(100, 0) is None and error_pct(100, None) is None
    runs = [{"kind": "train", "model": "a", "status": "done", "estimate_bytes": 99, "measured_bytes": 100,
             "error_pct": -1.0},
            {"kind": "infer", "model": "b", "status": "done", "estimate_bytes": 103, "measured_bytes": 100,
             "error_pct": 3.0},
            {"kind": "train", "model": "a", "status": "failed", "estimate_bytes": 5, "measured_bytes": None,
             "error_pct": None}]
    s = runs_summary(runs)
    assert s.worst_error_pct == 3.0 and len(s.completed) == 2 and s.not_completed == 1
    assert s.chart_rows[1] == {"label": "infer: b", "estimate_bytes": 103, "measured_bytes": 100}
    only_a = runs_summary(runs, ["a"])
    assert only_a.worst_error_pct == 1.0 and len(only_a.runs) == 2 and only_a.not_completed == 1
    assert runs_summary([], []).worst_error_pct == 0.0


def test_estimate_infer_budget_answers_what_the_page_answers(capsys):
    """`estimate infer --budget`: the inference facade's figures in the record's `fit` (the CLI and the page
    call the same planner.serving.plan_inference)."""
    from planner.cli import main as cli

    args = ["estimate", "infer", "--model", "llama-3.2-1b", "--batch-size", "2", "--prompt-len", "1000",
            "--new-tokens", "24", "--precision", "bf16", "--device", "cuda", "--budget", "16GiB", "--json"]
    assert cli.main(args) == 0
    rec = json.loads(capsys.readouterr().out)
    p = plan_inference(PRESETS["llama-3.2-1b"], InferSpec(2, 1000, 24, precision="bf16", device="cuda"), 16 * 2**30)
    assert rec["peak_bytes"] == p.peak_bytes
    assert rec["fit"] == {"budget_bytes": 16 * 2**30, "cuda_context_bytes": p.cuda_context_bytes,
                          "tensor_budget_bytes": p.tensor_budget_bytes, "fits": True, "max_batch_size": p.max_batch,
                          "max_batch_reason": p.max_batch_reason, "max_context": p.max_context,
                          "max_context_reason": p.max_context_reason, "kv_cache_tokens": p.kv_tokens,
                          "kv_cache_tokens_vllm": p.kv_tokens_vllm}
    assert p.max_batch > 2 and p.kv_tokens > 0
    assert cli.main(args[:-2] + ["--budget", "lots"]) == 2  # bad input: exit 2, one line
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_estimate_train_parallel_budget_answers_the_fewest_devices(capsys):
    """`estimate train --parallel fsdp --budget`: the page's fewest-devices solver (planner.fit.fewest_ranks) on
    the same budget for tensors; --budget without --parallel is refused in one line (one device: `fit`)."""
    from planner.cli import main as cli
    from planner.fit import fewest_ranks

    args = ["estimate", "train", "--model", "llama-3.2-1b", "--batch-size", "1", "--seq-len", "2048",
            "--precision", "bf16", "--checkpointing", "--world-size", "2", "--parallel", "fsdp", "--device", "cuda",
            "--budget", "8GiB", "--json"]
    assert cli.main(args) == 0
    rec = json.loads(capsys.readouterr().out)
    spec = TrainSpec(1, 2048, "bf16", checkpointing=True, device="cuda")
    usable = tensor_budget(8 * 2**30, "cuda", True)
    fewest, why = fewest_ranks(PRESETS["llama-3.2-1b"], spec, ParallelSpec(2, "fsdp"), usable)
    assert fewest > 1
    assert rec["fit"] == {"budget_bytes": 8 * 2**30, "cuda_context_bytes": rec["fit"]["cuda_context_bytes"],
                          "tensor_budget_bytes": usable, "fewest_ranks": fewest, "fewest_reason": why}
    assert cli.main(["estimate", "train", "--model", "gpt2-small", "--batch-size", "1", "--seq-len", "64",
                     "--budget", "8GiB"]) == 2
    assert "--parallel" in capsys.readouterr().err


def test_training_facade_published_context_is_longest_context():
    from planner.plan import longest_context
    from planner.reference import UNSLOTH_LLAMA31_8B

    run = {**RUN, "precision": "bf16", "checkpointing": True, "device": "cuda", "lora_r": 32,
           "lora_targets": "all-linear", "quantize_base": "nf4", "double_quant": True}
    p = plan_training(PRESETS["llama-3.1-8b"], run, 1, 2048, "sdpa", 24 * 2**30)
    assert p.published_context(UNSLOTH_LLAMA31_8B) == longest_context(p.cfg, p.spec, UNSLOTH_LLAMA31_8B)
