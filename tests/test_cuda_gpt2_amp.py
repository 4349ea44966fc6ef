"""Both GPT-2s (the book's, planner/arch/gpt2_book.py, and transformers', planner/arch/gpt2.py) under CUDA autocast,
held to the H200 run's records (tests/data/cuda/2026-11-27-h200; no CUDA device needed): CUDA's fp32 autocast list
has pow and softmax (the tanh GELU's chain and the book's attention probabilities are fp32), and F.cross_entropy
runs its e_m log_softmax with nll_loss on an fp32 copy (planner/estimate/training.py cuda_amp_cross_entropy)."""
import pytest

from bench.gpu_grids import RECORDS_DIR, live_error, read_records
from planner.config import config_from_dict
from planner.estimate.training import estimate_training
from planner.spec import TrainSpec

GRIDS = ("accuracy", "families", "losses", "offload-activations", "policies")
AMP = ("bf16-amp", "fp16-amp")


def _amp_rows():
    return [r for r in read_records(RECORDS_DIR / "cuda-rows.jsonl")
            if "error" not in r and r["kind"] == "train" and r["grid"] in GRIDS
            and r["config"].get("arch") in ("gpt2", "gpt2-hf") and r["spec"]["precision"] in AMP]


ROWS = _amp_rows()
# (transformers' GPT-2 with --offload-activations and dropout is refused on CUDA: ConfigError, live_error None)
HELD = [r for r in ROWS if live_error(r) is not None]


def test_the_rows_are_there():
    """The rows the task names: accuracy, families, losses, policies and offload-activations, book and HF."""
    assert len(HELD) >= 50
    assert {(r["grid"], r["config"]["arch"]) for r in HELD} >= {
        ("accuracy", "gpt2"), ("families", "gpt2-hf"), ("losses", "gpt2"), ("losses", "gpt2-hf"),
        ("offload-activations", "gpt2"), ("policies", "gpt2"), ("policies", "gpt2-hf")}


@pytest.mark.parametrize("rec", HELD, ids=[f"{r['grid']}: {r['label']}" for r in HELD])
def test_live_bytes_within_1pct(rec):
    est, tracked, err = live_error(rec)
    assert abs(err) <= 1.0, f"{rec['label']}: estimate {est:,} B, the H200's live tensors {tracked:,} B ({err:+.3f}%)"


def test_offload_activations_book_host_and_device():
    """--offload-activations on the book's GPT-2 on CUDA, fp32 and bf16-AMP, checkpointed or not: the host copies
    (CUDA's bool dropout masks; under autocast the GELU's fp32 chain, the fp32 softmax with its e_m cast and the
    cross-entropy composite's e_m log_softmax with nll_loss's fp32 copy) to the byte, and the device's live bytes
    (checkpointed: the unpack hook's device copy of the current block's input) within 16 B."""
    recs = [r for r in read_records(RECORDS_DIR / "cuda-rows.jsonl") if r["grid"] == "offload-activations"
            and r["config"].get("arch") == "gpt2" and "error" not in r]
    assert {(r["spec"]["precision"], r["spec"]["checkpointing"]) for r in recs} == {
        (p, c) for p in ("fp32", "bf16-amp") for c in (False, True)}
    for r in recs:
        est = estimate_training(config_from_dict(r["config"]), TrainSpec(**r["spec"]))
        assert est.transients["host_activation_offload"] == r["measured"]["host_activation_offload_bytes"], r["label"]
        live, tracked, _ = live_error(r)
        assert abs(live - tracked) <= 16, (r["label"], live, tracked)


REALISTIC = [r for r in read_records(RECORDS_DIR / "realistic.jsonl")
             if "error" not in r and r["config"].get("arch") in ("gpt2", "gpt2-hf") and r["spec"]["precision"] in AMP]


def test_realistic_rows_are_there():
    assert {r["label"].split()[0] for r in REALISTIC} >= {"gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"}


@pytest.mark.parametrize("rec", REALISTIC, ids=[r["label"] for r in REALISTIC])
def test_realistic_within_2pct_of_max_memory_allocated(rec):
    """Fresh processes on the H200: the estimate with its CUDA allocator lines against max_memory_allocated, and its
    live bytes against the tracked live tensors to 1%."""
    est = estimate_training(config_from_dict(rec["config"]), TrainSpec(**rec["spec"]))
    alloc = rec["measured"]["peak_allocated_bytes"]
    assert abs(est.peak_bytes - alloc) <= 0.02 * alloc, f"{est.peak_bytes:,} vs {alloc:,}"
    live, tracked, err = live_error({**rec, "kind": "train"})
    assert abs(err) <= 1.0, f"{live:,} vs {tracked:,} ({err:+.3f}%)"


def test_cpu_amp_keeps_the_cpu_lists():
    """The CUDA terms only apply on CUDA: the same spec on the CPU keeps CPU autocast's bf16 GELU chain and its fp32
    cross_entropy (the recorded CPU grids hold the numbers: tests/test_recorded.py)."""
    cfg = config_from_dict(REALISTIC[0]["config"])
    spec = TrainSpec(**{**REALISTIC[0]["spec"], "device": "cuda"})
    cpu = estimate_training(cfg, TrainSpec(**{**REALISTIC[0]["spec"], "device": "cpu"}))
    cuda = estimate_training(cfg, spec)
    assert cuda.activations_bytes > cpu.activations_bytes
    names = [t["name"] for t in cuda.terms]
    assert any("CUDA autocast" in n for n in names)
    assert not any("CUDA autocast" in t["name"] for t in cpu.terms)


def _phase_errors(rec) -> dict[str, float]:
    est = estimate_training(config_from_dict(rec["config"]), TrainSpec(**rec["spec"]))
    lines = est.transients.get("allocator_rounding", 0) + est.transients.get("cublas_workspace", 0)
    tracked = rec["measured"].get("tracked_phase_peak_bytes") or rec["measured"]["phase_peak_bytes"]
    return {ph: 100 * (est.phase_peak_bytes[ph] - lines - v) / v for ph, v in tracked.items()}


# Phases not autocast's, left out here: --offload-activations' backward without checkpointing holds the unpack
# hook's device copies on CUDA (every family, fp32 too: planner/estimate/offload_act.py); the selective policy keeps
# SDPA's output by the kernel's aten name, and on CUDA bf16 / fp16 SDPA is cuDNN's, not on torchtitan's list
# (planner/routines/checkpointing.py _SAVE; every family's selective rows)
PHASED = [r for r in HELD if not (r["grid"] == "offload-activations" and not r["spec"]["checkpointing"])
          and r["spec"].get("checkpoint_policy") != "selective"]


@pytest.mark.parametrize("rec", PHASED, ids=[f"{r['grid']}: {r['label']}" for r in PHASED])
def test_loss_and_backward_phases_within_1pct(rec):
    """The loss phase (the cross-entropy composite, the logits) and the backward phase (the GELU's fp32 chain, the
    attention's fp32 softmax) each to 1%, not only the step's peak."""
    errs = _phase_errors(rec)
    assert abs(errs["loss"]) <= 1.0 and abs(errs["backward"]) <= 1.0, errs


# ---- points the records do not reach: an emulated CUDA-autocast step (tests/cuda_amp_emulation.py) --------------
def _record(label: str):
    return next(r for r in read_records(RECORDS_DIR / "cuda-rows.jsonl") if r["label"] == label and "error" not in r)


@pytest.mark.parametrize("label", ["gpt2 V97 h96 a3 s8 p0.0 eager bf16-amp sgd",
                                   "gpt2-hf V97 h96 a3 p0.1 b4 s8 eager bf16-amp sgd",
                                   "gpt2-hf V2000 h48 a6 p0 b2 s48 eager fp16-amp sgd accum2"])
def test_the_emulation_reproduces_h200_rows(label):
    """The emulated step's live bytes equal the H200's tracked ones to the byte (SGD: no optimizer state), each
    phase: the emulation is the CUDA step where it is trusted below."""
    from cuda_amp_emulation import emulated_phase_peaks

    rec = _record(label)
    got = emulated_phase_peaks(config_from_dict(rec["config"]), TrainSpec(**rec["spec"]))
    tracked = rec["measured"].get("tracked_phase_peak_bytes") or rec["measured"]["phase_peak_bytes"]
    assert {ph: got[ph] for ph in ("forward", "loss", "backward")} == {ph: tracked[ph] for ph in
                                                                       ("forward", "loss", "backward")}


BOOK_S256 = {"arch": "gpt2", "vocab_size": 97, "context_length": 256, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
             "drop_rate": 0.0, "qkv_bias": True, "attention": "eager"}
HF_S256 = {"arch": "gpt2-hf", "vocab_size": 97, "n_positions": 512, "n_embd": 32, "n_layer": 2, "n_head": 4,
           "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "attention": "eager"}
EMULATED = [(name, {**cfg, **drop}, prec, ckpt)
            for name, cfg, p in (("book", BOOK_S256, {"drop_rate": 0.1}),
                                 ("hf", HF_S256, {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}))
            for drop in ({}, p) for prec in ("bf16-amp", "fp16-amp") for ckpt in (False, True)]


def assert_loss_and_backward_match(c, spec, tol: float) -> None:
    """The estimate's loss and backward phases (less its CUDA allocator lines) against the emulated CUDA-autocast
    step's, each to `tol`."""
    from cuda_amp_emulation import emulated_phase_peaks

    got = emulated_phase_peaks(c, spec)
    est = estimate_training(c, spec)
    lines = est.transients.get("allocator_rounding", 0) + est.transients.get("cublas_workspace", 0)
    for ph in ("loss", "backward"):
        assert abs(est.phase_peak_bytes[ph] - lines - got[ph]) <= tol * got[ph], (ph, est.phase_peak_bytes[ph] - lines,
                                                                                   got[ph])


@pytest.mark.parametrize("name,cfg,prec,ckpt", EMULATED,
                         ids=[f"{n} {'p0.1' if any(v == 0.1 for v in c.values()) else 'p0'} {p}{' ckpt' if k else ''}"
                              for n, c, p, k in EMULATED])
def test_attention_heavy_points_against_the_emulation(name, cfg, prec, ckpt):
    """s = 256 with h = 32, where the eager attention's backward (fp32 softmax, its e_m cast, the fp32 grads) and the
    book's recompute (checkpointed, with dropout) are the step's top: the loss and backward phases to 0.1%."""
    assert_loss_and_backward_match(config_from_dict(cfg), TrainSpec(2, 256, prec, "sgd", checkpointing=ckpt,
                                                                     device="cuda"), 0.001)


@pytest.mark.parametrize("cfg,b,s", [(HF_S256 | {"attention": "sdpa"}, 2, 256),
                                     ({**BOOK_S256, "vocab_size": 1000, "emb_dim": 64, "drop_rate": 0.1}, 2, 64),
                                     (BOOK_S256, 2, 128)])
def test_offload_host_copies_against_the_emulation(cfg, b, s):
    """--offload-activations' host line under CUDA autocast (the GELU's fp32 chain, the book's fp32 softmax and
    cross-entropy composite) equals the saved bytes the pack hook sees in the emulated step; the book's V1000 h64
    p0.1 b2 s64 is the H200's record (3,428,108 B, test_offload_activations_book_host_and_device)."""
    from cuda_amp_emulation import emulated_saved_bytes

    c, spec = config_from_dict(cfg), TrainSpec(b, s, "bf16-amp", "sgd", device="cuda", offload_activations=True)
    assert estimate_training(c, spec).transients["host_activation_offload"] == emulated_saved_bytes(c, spec)


POLICIES = [(name, {**cfg, **drop, ("n_layers" if name == "book" else "n_layer"): 4}, kw)
            for name, cfg, drop in (("book", BOOK_S256, {"drop_rate": 0.1}),
                                    ("hf", HF_S256, {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}))
            for kw in ({"checkpointing": True, "checkpoint_policy": "every:2"},
                       {"checkpointing": True, "checkpoint_policy": "selective"}, {"grad_accum": 2},
                       {"checkpointing": True, "grad_accum": 2})]


@pytest.mark.parametrize("name,cfg,kw", POLICIES, ids=[f"{n} {kw}" for n, _, kw in POLICIES])
def test_policies_and_accumulation_against_the_emulation(name, cfg, kw):
    """every:2 and selective (eager attention: the policy keeps no attention op) and a later micro-batch, L4 s256
    with dropout, bf16-AMP: the loss and backward phases to 0.2%."""
    assert_loss_and_backward_match(config_from_dict(cfg), TrainSpec(2, 256, "bf16-amp", "sgd", device="cuda", **kw),
                                   0.002)
