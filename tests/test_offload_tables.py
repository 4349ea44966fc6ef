"""bench/offload_act.py's tables: one renderer (table()) for the main, combination, fine-tuning and full-size
sections, held to the layout the sections had before they shared it, from fixed rows (nothing measured, simulated or
estimated: the row functions and the full-size grids are replaced by fixed ones)."""
from types import SimpleNamespace

import bench.offload_act as oa

FULL = (("llama-3.2-1b", False), ("gemma-2-2b", True))
MIX_FULL = (("llama-3.2-1b", dict(checkpointing=True, grad_accum=2)),
            ("qwen3-0.6b", dict(grad_accum=2, offload_optimizer=True)),
            ("gemma-2-2b", dict(checkpointing=True, checkpoint_policy="every:2", offload_optimizer=True)))


def row(i, model, kind=None, opt=False):
    r = {"model": model, "run": f"b2 s32 fp32 adamw{' ckpt' if i % 2 else ''}", "plain_peak": 1000000 + 7 * i,
         "est_peak": 900000 + 13 * i, "meas_peak": 901000 - 11 * i, "sim_peak": 901000 - 11 * i if i % 3 else 901001,
         "est_phase": "backward", "meas_phase": "loss" if i % 2 else "backward",
         "est_host": 500000 + 3 * i, "meas_host": 500100 - 5 * i, "sim_host": 500100 - 5 * i,
         "phase_err": {"forward": 0.01 * i - 0.03, "loss": -0.002 * i, "backward": 0.0005}}
    if kind is not None:
        r.update(kind=kind, est_opt_host=123456 + i if opt else None, meas_opt_host=123456 + i if opt else None,
                 meas_host_peak=(r["meas_host"] + 123456 + i) if opt else None)
    return r


MAIN = [row(i, f"llama tiny {i}") for i in range(5)]
MIX = [row(i, "qwen3 mix", kind=k, opt=k.startswith("+")) for i, k in
       enumerate(["grad-accum", "policy", "policy + grad-accum", "+ offload-optimizer", "+ offload-optimizer"])]
FT = [row(i, "llama ft", kind=k) for i, k in enumerate(["LoRA r8 q,v", "last:1", "QLoRA nf4 q,v"])]
FT_MIX = [row(i, "gemma2 ft mix", kind=k, opt=k.startswith("+")) for i, k in
          enumerate(["grad-accum: last:1", "policy: LoRA r8 q,v", "+ offload-optimizer: LoRA r64 q,v"])]
FT_FULL = (("llama-3.2-1b", dict(lora_r=16)), ("qwen3-0.6b", dict(train_layers="last:2", checkpointing=True)))


def fake_estimate(cfg, spec):
    n = 10_000_000 + 1_000 * spec.grad_accum + 77 * spec.checkpointing + cfg.num_hidden_layers
    transients = {"host_activation_offload": n // 3}
    if spec.offload_optimizer:
        transients["host_optimizer_offload"] = n // 5
    return SimpleNamespace(peak_bytes=n, transients=transients)


def fake_simulate(cfg, spec):
    est = fake_estimate(cfg, spec)
    out = {"peak_bytes": est.peak_bytes + 4096,
           "host_activation_offload_bytes": est.transients["host_activation_offload"] - 512}
    if "host_optimizer_offload" in est.transients:
        out["host_optimizer_offload_bytes"] = est.transients["host_optimizer_offload"]
    return out


def render(monkeypatch, quick):
    import planner.estimate.training as training
    import planner.measure.simulate as simulate

    monkeypatch.setattr(oa, "rows", lambda quick=False: MAIN[:2] if quick else MAIN)
    monkeypatch.setattr(oa, "mix_rows", lambda: MIX)
    monkeypatch.setattr(oa, "finetune_rows", lambda: FT)
    monkeypatch.setattr(oa, "finetune_mix_rows", lambda: FT_MIX)
    monkeypatch.setattr(oa, "FT_FULL_SIZE", FT_FULL)
    monkeypatch.setattr(oa, "FULL_SIZE", FULL)
    monkeypatch.setattr(oa, "MIX_FULL_SIZE", MIX_FULL)
    monkeypatch.setattr(training, "estimate_training", fake_estimate)
    monkeypatch.setattr(simulate, "simulate_training", fake_simulate)
    return oa.markdown(quick=quick)


# The tables as the sections' own renderers wrote them for these rows (before table() was shared)
EXPECTED = """\
Worst device-peak error 0.11%; worst host error 0.02%; simulate = measure to the byte (device and host): NO. Bar: 1%.
| model | run | peak without offload (measured) | device peak: estimate | measured | simulated | error | phase (est / meas) | host: estimate | measured | simulated | host error | PCIe copy time / step (Gen4 x16) | worst phase error |
|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|
| llama tiny 0 | b2 s32 fp32 adamw | 1,000,000 | 900,000 | 901,000 | 901,001 | -0.11% | backward / backward | 500,000 | 500,100 | 500,100 | -0.02% | 31.2 us | forward -3.0% |
| llama tiny 1 | b2 s32 fp32 adamw ckpt | 1,000,007 | 900,013 | 900,989 | 900,989 | -0.11% | backward / loss | 500,003 | 500,095 | 500,095 | -0.02% | 31.3 us | forward -2.0% |
| llama tiny 2 | b2 s32 fp32 adamw | 1,000,014 | 900,026 | 900,978 | 900,978 | -0.11% | backward / backward | 500,006 | 500,090 | 500,090 | -0.02% | 31.3 us | forward -1.0% |
| llama tiny 3 | b2 s32 fp32 adamw ckpt | 1,000,021 | 900,039 | 900,967 | 901,001 | -0.10% | backward / loss | 500,009 | 500,085 | 500,085 | -0.02% | 31.3 us | loss -0.6% |
| llama tiny 4 | b2 s32 fp32 adamw | 1,000,028 | 900,052 | 900,956 | 900,956 | -0.10% | backward / backward | 500,012 | 500,080 | 500,080 | -0.01% | 31.3 us | forward +1.0% |
Worst device-peak error 0.11%; worst host error 0.02% (activation copies); optimizer host bytes exact and host peak = activation copies + optimizer host: yes; simulate = measure to the byte (device and host): NO. Bar: 1%. "without offload" is the same run without --offload-activations (an optimizer-offload row keeps its optimizer on the host).
| model | combination | run | peak without offload (measured) | device peak: estimate | measured | simulated | error | phase (est / meas) | host (activation copies): estimate | measured | simulated | host error | host (optimizer): estimate / measured | worst phase error |
|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|
| qwen3 mix | grad-accum | b2 s32 fp32 adamw | 1,000,000 | 900,000 | 901,000 | 901,001 | -0.11% | backward / backward | 500,000 | 500,100 | 500,100 | -0.02% | - | forward -3.0% |
| qwen3 mix | policy | b2 s32 fp32 adamw ckpt | 1,000,007 | 900,013 | 900,989 | 900,989 | -0.11% | backward / loss | 500,003 | 500,095 | 500,095 | -0.02% | - | forward -2.0% |
| qwen3 mix | policy + grad-accum | b2 s32 fp32 adamw | 1,000,014 | 900,026 | 900,978 | 900,978 | -0.11% | backward / backward | 500,006 | 500,090 | 500,090 | -0.02% | - | forward -1.0% |
| qwen3 mix | + offload-optimizer | b2 s32 fp32 adamw ckpt | 1,000,021 | 900,039 | 900,967 | 901,001 | -0.10% | backward / loss | 500,009 | 500,085 | 500,085 | -0.02% | 123,459 / 123,459 | loss -0.6% |
| qwen3 mix | + offload-optimizer | b2 s32 fp32 adamw | 1,000,028 | 900,052 | 900,956 | 900,956 | -0.10% | backward / backward | 500,012 | 500,080 | 500,080 | -0.01% | 123,460 / 123,460 | forward +1.0% |
Worst device-peak error 0.11%; worst host error 0.02%; simulate = measure to the byte (device and host): NO. Bar: 1%.
| model | fine-tuning | run | peak without offload (measured) | device peak: estimate | measured | simulated | error | phase (est / meas) | host: estimate | measured | simulated | host error | worst phase error |
|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|
| llama ft | LoRA r8 q,v | b2 s32 fp32 adamw | 1,000,000 | 900,000 | 901,000 | 901,001 | -0.11% | backward / backward | 500,000 | 500,100 | 500,100 | -0.02% | forward -3.0% |
| llama ft | last:1 | b2 s32 fp32 adamw ckpt | 1,000,007 | 900,013 | 900,989 | 900,989 | -0.11% | backward / loss | 500,003 | 500,095 | 500,095 | -0.02% | forward -2.0% |
| llama ft | QLoRA nf4 q,v | b2 s32 fp32 adamw | 1,000,014 | 900,026 | 900,978 | 900,978 | -0.11% | backward / backward | 500,006 | 500,090 | 500,090 | -0.02% | forward -1.0% |
Worst device-peak error 0.11%; worst host error 0.02% (activation copies); optimizer host bytes exact: yes; simulate = measure to the byte (device and host): NO. Bar: 1%. 3 runs; "without offload" is the same run without --offload-activations.
| model | combination | run | peak without offload (measured) | device peak: estimate | measured | simulated | error | phase (est / meas) | host (activation copies): estimate | measured | simulated | host error | host (optimizer): estimate / measured | worst phase error |
|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|
| gemma2 ft mix | grad-accum: last:1 | b2 s32 fp32 adamw | 1,000,000 | 900,000 | 901,000 | 901,001 | -0.11% | backward / backward | 500,000 | 500,100 | 500,100 | -0.02% | - | forward -3.0% |
| gemma2 ft mix | policy: LoRA r8 q,v | b2 s32 fp32 adamw ckpt | 1,000,007 | 900,013 | 900,989 | 900,989 | -0.11% | backward / loss | 500,003 | 500,095 | 500,095 | -0.02% | - | forward -2.0% |
| gemma2 ft mix | + offload-optimizer: LoRA r64 q,v | b2 s32 fp32 adamw | 1,000,014 | 900,026 | 900,978 | 900,978 | -0.11% | backward / backward | 500,006 | 500,090 | 500,090 | -0.02% | 123,458 / 123,458 | forward -1.0% |
Fine-tuning at full size, formula against the simulation (b1 s512 bf16-AMP AdamW, CPU device):
| preset | fine-tuning | checkpointing | device peak: estimate | simulated | error | host: estimate | simulated |
|---|---|---|---:|---:|---:|---:|---:|
| llama-3.2-1b | LoRA r16 q,v | none | 10,001,016 | 10,005,112 | -0.041% | 3,333,672 | 3,333,160 |
| qwen3-0.6b | last:2 | full | 10,001,105 | 10,005,201 | -0.041% | 3,333,701 | 3,333,189 |
Full size, formula against the simulation (b1 s256 bf16-AMP AdamW, CPU device; llama-3.2-1b and qwen3-0.6b tie their head: the tied weight's grad is summed out of place at the embedding's backward, one more V*h tensor in a later micro-batch, planner/estimate/offload_act.py):
| preset | combination | device peak: estimate | simulated | error | host (activation copies): estimate | simulated | host (optimizer): estimate | simulated |
|---|---|---:|---:|---:|---:|---:|---:|---:|
| llama-3.2-1b | checkpointing full, grad-accum 2 | 10,002,093 | 10,006,189 | -0.041% | 3,334,031 | 3,333,519 | - | - |
| qwen3-0.6b | grad-accum 2, offload-optimizer | 10,002,028 | 10,006,124 | -0.041% | 3,334,009 | 3,333,497 | 2,000,405 | 2,000,405 |
| gemma-2-2b | checkpointing every:2, offload-optimizer | 10,001,103 | 10,005,199 | -0.041% | 3,333,701 | 3,333,189 | 2,000,220 | 2,000,220 |
Full size, formula against the simulation (b1 s512 bf16-AMP AdamW, CPU device: the mechanism above on fake tensors):
| preset | checkpointing | device peak: estimate | simulated | error | host: estimate | simulated | host error |
|---|---|---:|---:|---:|---:|---:|---:|
| llama-3.2-1b | none | 10,001,016 | 10,005,112 | -0.041% | 3,333,672 | 3,333,160 | +0.015% |
| gemma-2-2b | full | 10,001,103 | 10,005,199 | -0.041% | 3,333,701 | 3,333,189 | +0.015% |"""


def test_every_section_renders_its_table_as_before(monkeypatch):
    text = render(monkeypatch, quick=False)
    assert "\n".join(line for line in text.splitlines()
                     if line.startswith(("|", "Worst", "Full size", "Fine-tuning at"))) == EXPECTED
    quick = render(monkeypatch, quick=True)
    assert [line for line in quick.splitlines() if line.startswith("|")] == EXPECTED.splitlines()[1:5]  # its two rows


def test_table_is_one_markdown_table():
    lines = oa.table([("a", "---", lambda r: r["x"]), ("b", "---:", lambda r: f"{r['y']:,}")],
                     [{"x": "one", "y": 1234}, {"x": "two", "y": 5}])
    assert lines == ["| a | b |", "|---|---:|", "| one | 1,234 |", "| two | 5 |"]
