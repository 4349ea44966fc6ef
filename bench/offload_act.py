"""Issue #24: `--offload-activations` measured, simulated and estimated on small Llama and Qwen 2 configs (fp32 and
bf16-AMP, with and without checkpointing; AdamW and SGD) and one shape per other family (FAMILY_ROWS and the book's
GPT-2, AdamW). The step runs under
`torch.autograd.graph.save_on_cpu(pin_memory=True)`; the tracker counts the pack hook's host copies apart
(planner/measure/tracker.py host_scope), so each row has two figures: the device figure (for the CUDA check) and
the host bytes. Regenerate: `python -m planner bench offload-activations --out docs/accuracy.md` (~30 min on 2 cores: the
combinations, fine-tuning and off-grid grid rows included)."""
from __future__ import annotations

from planner.config import LlamaConfig
from planner.spec import TrainSpec

HEADING = "# Activation offloading: --offload-activations (issue #24; the mechanism measured on the CPU)"


def grid(quick: bool = False) -> list[tuple[str, object, int, int]]:
    from planner.arch.qwen2 import Qwen2Config

    rows = [("llama V300 h48 a6 kv2 f96 L2", LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96,
                                                          num_hidden_layers=2, num_attention_heads=6,
                                                          num_key_value_heads=2, max_position_embeddings=128), 2, 32),
            ("qwen2 V1000 h64 a4 kv2 f160 L2", Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=160,
                                                          num_hidden_layers=2, num_attention_heads=4,
                                                          num_key_value_heads=2, max_position_embeddings=128), 2, 64)]
    if not quick:
        rows.append(("llama V200 h96 a6 kv2 f256 L2", LlamaConfig(vocab_size=200, hidden_size=96, intermediate_size=256,
                                                                   num_hidden_layers=2, num_attention_heads=6,
                                                                   num_key_value_heads=2, max_position_embeddings=128),
                     1, 64))
    return rows


# Every other family with a formula file: its first grid shape (planner/arch/<family>.py grid_configs), AdamW only;
# "llama eager" is Llama's first shape with eager attention (the mask added, softmax and probabilities saved);
# transformers' GPT-2 (dropout 0.1 as published: SDPA's math kernel on the CPU) and the MoE families
FAMILY_ROWS = ("mistral", "qwen3", "phi3", "gemma", "gemma2", "llama eager", "gpt2", "mixtral", "qwen2_moe",
               "qwen3_moe")
SHOWN = {"gpt2": "gpt2-hf"}  # planner/arch/gpt2.py is transformers' GPT-2


def book_row() -> tuple[str, object, int, int]:
    """The book's GPT-2 (planner/arch/gpt2_book.py has no grid shapes): its own eager attention with the training
    chapters' drop_rate 0.1 (the noise of every dropout saved), untied head."""
    from planner.arch.gpt2_book import GPT2Config

    return ("gpt2 (book) V1000 h64 a4 p0.1", GPT2Config(vocab_size=1000, context_length=128, emb_dim=64, n_heads=4,
                                                         n_layers=2, drop_rate=0.1), 2, 64)


def family_shape(arch: str, index: int = 0) -> tuple[str, object, int, int]:
    """A family's grid shape (planner/arch/<family>.py grid_configs()[index]) as a row: "<arch> <shape>" (the label
    without its batch and sequence), the config, batch and sequence."""
    import importlib

    label, cfg, b, s = importlib.import_module(f"planner.arch.{arch}").FAMILY.grid_configs()[index]
    return f"{arch} {label.rsplit(' b', 1)[0]}", cfg, b, s


def family_grid() -> list[tuple[str, object, int, int]]:
    import dataclasses

    out = []
    for name in FAMILY_ROWS:
        arch, _, attn = name.partition(" ")
        label, cfg, b, s = family_shape(arch)
        if attn:
            cfg = dataclasses.replace(cfg, attention=attn)
        out.append((f"{SHOWN.get(name, name)}{label[len(arch):]}", cfg, b, s))
    return out + [book_row()]


# The long-sequence shape of every RMS decoder family (planner/arch/<family>.py grid_configs()[3]: V97 h32 a4 kv2
# tied b2 s256, SDPA; Mistral with its 32-token window; Gemma 2 eager with soft-capping), where without
# checkpointing the forward is the peak at the last block's MLP, RoPE on q, SDPA or eager's scores
# (planner/arch/decoder.py offload_forward_held / offload_attention_points / offload_forward_points)
LONG_ROWS = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma", "gemma2", "qwen2_moe", "qwen3_moe")


def long_grid() -> list[tuple[str, object, int, int]]:
    return [family_shape(arch, 3) for arch in LONG_ROWS]


# Shapes of the off-grid sweep (OFFGRID_SHAPES below) that missed by more than 1% before their points were modelled,
# one per RMS family, measured in the main table (fp32 and bf16-AMP, checkpointing off and on, AdamW): Llama b4 s64
# kv = a (bf16-AMP backward +13.9%, checkpointed forward -9.7%), Qwen 3 s512 (q_norm's backward -16.3%), Mistral
# s256 past its window (forward -2.1%, bf16-AMP checkpointed +7%), Phi-3 f = 8h (the fused gate_up's forward and
# backward -10%), Gemma b4 s64 kv = a (checkpointed forward -9.7%), Gemma 2 f = 8h (forward -14.3%, the step's peak)
OFFGRID_GRID = (("llama", 1), ("qwen3", 1), ("mistral", 3), ("phi3", 0), ("gemma", 2), ("gemma2", 0))


def offgrid_grid() -> list[tuple[str, object, int, int]]:
    out = []
    for arch, i in OFFGRID_GRID:
        h, f, a, kv, b, s = OFFGRID_SHAPES[i]
        out.append((f"{arch} V97 h{h} f{f} a{a} kv{kv} L2", offgrid_config(arch, h, f, a, kv), b, s))
    return out


def offload_row(label: str, cfg, spec: TrainSpec, plain: TrainSpec, host: str) -> tuple[dict, object, dict] | None:
    """One offloading run (activations or optimizer): estimated, measured and simulated, device peak and `host`
    bytes (the estimate's transient line `host`, the records' `host`_bytes), beside the plain run it replaces;
    None when the estimate refuses it. Returns the row, the estimate and the measurement."""
    from planner.estimate.training import estimate_training
    from planner.measure.simulate import simulate_training
    from planner.measure.training import measure_training
    from planner.validation import ConfigError

    try:
        est = estimate_training(cfg, spec)
    except ConfigError:  # refused in one line: no row
        return None
    meas, sim, base = measure_training(cfg, spec), simulate_training(cfg, spec), measure_training(cfg, plain)
    policy = getattr(spec, "checkpoint_policy", "full")
    row = {"model": label, "run": f"b{spec.batch_size} s{spec.seq_len} {spec.precision} {spec.optimizer}"
           + ((" ckpt" if policy == "full" else f" ckpt {policy}") if spec.checkpointing else "")
           + (f" accum{spec.grad_accum}" if spec.grad_accum > 1 else ""),
           "plain_peak": base["peak_bytes"], "est_peak": est.peak_bytes,
           "meas_peak": meas["peak_bytes"], "sim_peak": sim["peak_bytes"],
           "est_phase": est.peak_phase, "meas_phase": meas["peak_phase"],
           "est_host": est.transients[host], "meas_host": meas[f"{host}_bytes"], "sim_host": sim[f"{host}_bytes"]}
    return row, est, {"measured": meas, "plain": base}


def rows(quick: bool = False) -> list[dict]:
    """One dict per run: estimate, measure and simulate, device and host."""
    out = []
    runs = [(row, ("adamw",) if quick else ("adamw", "sgd")) for row in grid(quick)]
    runs += [] if quick else [(row, ("adamw",)) for row in family_grid() + long_grid() + offgrid_grid()]
    for (label, cfg, b, s), opts in runs:
        for opt in opts:
            for prec in ("fp32", "bf16-amp"):
                for ckpt in (False, True):
                    spec = TrainSpec(b, s, prec, opt, checkpointing=ckpt, offload_activations=True)
                    got = offload_row(label, cfg, spec, TrainSpec(b, s, prec, opt, checkpointing=ckpt),
                                      "host_activation_offload")  # None: refused in one line
                    if got is None:
                        continue
                    row, est, m = got
                    phases = m["measured"]["phase_peak_bytes"]
                    out.append({**row, "phase_err": {k: est.phase_peak_bytes[k] / phases[k] - 1
                                                     for k in phases if phases[k]}})
    return out


# The combinations users make with --offload-activations (torchtune's recipes: accumulation, checkpointing), on
# Llama (the grid's first shape), Gemma 2 (sandwich norms, two masks, soft-capping), Qwen 3 (q/k norms),
# transformers' GPT-2 (its own backward points, dropout 0.1: SDPA's math kernel, the tied wte) and two MoE families
# (the sparse block's own points: Mixtral's, and Qwen2-MoE's with its shared expert); family_grid's labels
MIX_FAMILIES = ("gemma2", "qwen3", "gpt2-hf", "mixtral", "qwen2_moe")


def mix_grid() -> list[tuple[str, object, int, int]]:
    return (grid(quick=True)[:1] + [row for row in family_grid() if row[0].split()[0] in MIX_FAMILIES]
            + book_mix_grid())


def book_mix_grid() -> list[tuple[str, object, int, int]]:
    """The book's GPT-2 in the combinations (its own backward points, planner/arch/gpt2_book.py): the main table's
    shape (dropout 0.1) and the policy grid's V500 h48 L4 (no dropout, four blocks: every:2 leaves two uncheckpointed)."""
    from planner.arch.gpt2_book import GPT2Config

    return [book_row(), ("gpt2 (book) V500 h48 L4", GPT2Config(vocab_size=500, context_length=64, emb_dim=48, n_heads=3,
                                                               n_layers=4, drop_rate=0.0, qkv_bias=False), 2, 32)]


def mix_specs(b: int, s: int) -> list[tuple[str, TrainSpec]]:
    """(kind, spec) of every combination, AdamW: --grad-accum 2 with checkpointing off and on; the checkpointing
    policies every:2 and selective, alone and with --grad-accum 2; --offload-optimizer beside it."""
    out = []
    for prec in ("fp32", "bf16-amp"):
        for ckpt in (False, True):
            out.append(("grad-accum", TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, grad_accum=2,
                                                offload_activations=True)))
    for accum in (1, 2):
        for prec in ("fp32", "bf16-amp"):
            for policy in ("every:2", "selective"):
                out.append(("policy" + (" + grad-accum" if accum > 1 else ""),
                            TrainSpec(b, s, prec, "adamw", checkpointing=True, checkpoint_policy=policy,
                                      grad_accum=accum, offload_activations=True)))
    for prec in ("fp32", "bf16-amp"):
        for ckpt in (False, True):
            out.append(("+ offload-optimizer", TrainSpec(b, s, prec, "adamw", checkpointing=ckpt,
                                                         offload_activations=True, offload_optimizer=True)))
    return out


def combination_row(label: str, cfg, kind: str, spec: TrainSpec) -> dict | None:
    """One combination run with --offload-activations (offload_row's, beside the same run without it), with its kind,
    every phase's error and the optimizer's host bytes; None when the estimate refuses it."""
    import dataclasses

    got = offload_row(label, cfg, spec, dataclasses.replace(spec, offload_activations=False), "host_activation_offload")
    if got is None:
        return None
    row, est, m = got
    phases = m["measured"]["phase_peak_bytes"]
    return {**row, "kind": kind, "phase_err": {k: est.phase_peak_bytes[k] / phases[k] - 1 for k in phases if phases[k]},
            # --offload-optimizer: its host copies and states (the host's peak is the two together)
            "est_opt_host": est.transients.get("host_optimizer_offload"),
            "meas_opt_host": m["measured"].get("host_optimizer_offload_bytes"),
            "meas_host_peak": m["measured"].get("host_peak_bytes")}


def mix_rows() -> list[dict]:
    rows = (combination_row(label, cfg, kind, spec) for label, cfg, b, s in mix_grid() for kind, spec in mix_specs(b, s))
    return [r for r in rows if r is not None]


def table(columns: list[tuple[str, str, object]], rs: list[dict]) -> list[str]:
    """One markdown table, every section's: columns are (header, alignment "---" or "---:", cell(row) -> text)."""
    return (["| " + " | ".join(head for head, _, _ in columns) + " |", "|" + "|".join(a for _, a, _ in columns) + "|"]
            + ["| " + " | ".join(cell(r) for _, _, cell in columns) + " |" for r in rs])


def _worst_phase(r: dict) -> str:
    k = max(r["phase_err"], key=lambda k: abs(r["phase_err"][k]))
    return f"{k} {r['phase_err'][k]:+.1%}"


def measured_columns(host: str) -> list[tuple[str, str, object]]:
    """The columns of an offload_row row (measured, simulated and estimated, device and host), `host` naming the
    host bytes: the main table's and the combinations'."""
    return [("peak without offload (measured)", "---:", lambda r: f"{r['plain_peak']:,}"),
            ("device peak: estimate", "---:", lambda r: f"{r['est_peak']:,}"),
            ("measured", "---:", lambda r: f"{r['meas_peak']:,}"),
            ("simulated", "---:", lambda r: f"{r['sim_peak']:,}"),
            ("error", "---:", lambda r: f"{r['est_peak'] / r['meas_peak'] - 1:+.2%}"),
            ("phase (est / meas)", "---", lambda r: f"{r['est_phase']} / {r['meas_phase']}"),
            (f"{host}: estimate", "---:", lambda r: f"{r['est_host']:,}"),
            ("measured", "---:", lambda r: f"{r['meas_host']:,}"),
            ("simulated", "---:", lambda r: f"{r['sim_host']:,}"),
            ("host error", "---:", lambda r: f"{r['est_host'] / r['meas_host'] - 1:+.2%}")]


WORST_PHASE = ("worst phase error", "---", _worst_phase)


def simulated_row(preset: str, spec: TrainSpec) -> dict:
    """A full-size row: the formula against the simulation (fake tensors, the same hooks), device and host."""
    from planner.config import PRESETS
    from planner.estimate.training import estimate_training
    from planner.measure.simulate import simulate_training

    est, sim = estimate_training(PRESETS[preset], spec), simulate_training(PRESETS[preset], spec)
    return {"preset": preset, "est_peak": est.peak_bytes, "sim_peak": sim["peak_bytes"],
            "est_host": est.transients["host_activation_offload"], "sim_host": sim["host_activation_offload_bytes"],
            "est_opt_host": est.transients.get("host_optimizer_offload"),
            "sim_opt_host": sim.get("host_optimizer_offload_bytes")}


def simulated_columns(host: str) -> list[tuple[str, str, object]]:
    """The columns of a simulated_row row after its preset and setting columns."""
    return [("device peak: estimate", "---:", lambda r: f"{r['est_peak']:,}"),
            ("simulated", "---:", lambda r: f"{r['sim_peak']:,}"),
            ("error", "---:", lambda r: f"{r['est_peak'] / r['sim_peak'] - 1:+.3%}"),
            (f"{host}: estimate", "---:", lambda r: f"{r['est_host']:,}"),
            ("simulated", "---:", lambda r: f"{r['sim_host']:,}")]


def summary(rs: list[dict]) -> tuple[float, float, bool]:
    """An offload table's figures over its rows (offload_row's): the worst device-peak and host errors against the
    measurement, and whether the simulation equals it to the byte on both."""
    worst = max(abs(r["est_peak"] / r["meas_peak"] - 1) for r in rs)
    worst_host = max(abs(r["est_host"] / r["meas_host"] - 1) for r in rs)
    return worst, worst_host, all(r["sim_peak"] == r["meas_peak"] and r["sim_host"] == r["meas_host"] for r in rs)


def mix_lines() -> list[str]:
    rs = mix_rows()
    worst, worst_host, sim_equal = summary(rs)
    opt = [r for r in rs if r["est_opt_host"] is not None]
    opt_exact = all(r["est_opt_host"] == r["meas_opt_host"] and r["meas_host_peak"] == r["meas_host"]
                    + r["meas_opt_host"] for r in opt)
    lines = ["", "## Combinations: accumulation, checkpointing policies, optimizer offloading", "",
             "`--grad-accum N` (grad-accum rows): each micro-batch's forward and loss run under save_on_cpu, and its "
             "backward frees its host copies, so the host holds one micro-batch's copies; a later micro-batch's "
             "forward, loss and backward run with every `.grad` alive (its new grads are transients added in place: "
             "planner/estimate/training.py `_backward_sweep(grads_exist=True)`). `--checkpointing every:K` (policy "
             "rows): a block not checkpointed saves through save_on_cpu's hook, so its whole saved set is copied to "
             "the host and its backward reads the copies (no recompute); a checkpointed block's input is copied. "
             "`--checkpointing selective`: the outputs torchtitan's policy keeps are held by the checkpoint's own "
             "cache (create_selective_checkpoint_contexts), not by saved-tensor hooks, so they stay on the device; "
             "the host holds each block's input only, as under full checkpointing. The recompute stops once the "
             "last saved tensor is recovered, before the block's last op, so that op's cached output (down_proj's "
             "in the decoders without a post-feedforward norm) stays alive through the block's backward "
             "(planner/arch/base.py `selective_unconsumed`). With `--grad-accum 2` (policy + grad-accum rows) a "
             "later micro-batch runs the policy's backward with every grad alive, as above. `--offload-optimizer` "
             "beside it (+ offload-optimizer "
             "rows): the two mechanisms do not meet on the device (the optimizer's host copies are made before the "
             "step and its grad hook copies in place), so the device figure is the activation-offloaded step's less "
             "the offloaded parameters' states (planner/estimate/offload.py over planner/estimate/offload_act.py) and "
             "the host holds both: the optimizer's copies and states all step, the saved-tensor copies up to the "
             "loss (the record's `host_peak_bytes` is their sum). GPT-2 (HF) and the MoE families walk their own "
             "backward points with the saved tensors on the host (planner/arch/gpt2.py, planner/arch/moe.py "
             "`offload_backward_points`): in a later micro-batch a node's new weight grads are transients added in "
             "place, only a tied head's part is held apart until the embedding's backward (the grads were counted "
             "twice before: GPT-2 +3.84%, Mixtral +7.89% without checkpointing); under checkpointing the sparse "
             "block's down grouped GEMM's backward (its input and weight grads beside the grad of its output) is "
             "the later micro-batch's top (Mixtral -0.84% before), and Qwen2-MoE's shared branch keeps its grads "
             "through the routed experts' backward. Estimate: planner/estimate/offload_act.py. The "
             "forward phase's points are the main table's (the last block's MLP, RoPE, SDPA or eager attention: "
             "planner/arch/decoder.py offload_alive / offload_forward_points), under --offload-optimizer too (the "
             "off-grid section below: every phase within 1% but Gemma 2's checkpointed forward, up to +2.9%, "
             "which its estimate states in a note: planner/arch/gemma2.py offload_bound_note).",
             "",
             f"Worst device-peak error {worst:.2%}; worst host error {worst_host:.2%} (activation copies); "
             f"optimizer host bytes exact and host peak = activation copies + optimizer host: "
             f"{'yes' if opt_exact else 'NO'}; simulate = measure to the byte (device and host): "
             f"{'yes' if sim_equal else 'NO'}. Bar: 1%. \"without offload\" is the same run without "
             "--offload-activations (an optimizer-offload row keeps its optimizer on the host).", ""]
    opt_column = ("host (optimizer): estimate / measured", "---:", lambda r: f"{r['est_opt_host']:,} / "
                  f"{r['meas_opt_host']:,}" if r["est_opt_host"] is not None else "-")
    lines += table([("model", "---", lambda r: r["model"]), ("combination", "---", lambda r: r["kind"]),
                    ("run", "---", lambda r: r["run"])] + measured_columns("host (activation copies)")
                   + [opt_column, WORST_PHASE], rs)
    return lines


# Fine-tuning under --offload-activations: Llama, Qwen 3 and Gemma 2 (planner/arch/<family>.py offload_finetune), their
# first grid shape, LoRA r8 on peft's default targets (q_proj, v_proj) and on every linear, the last block alone, and
# QLoRA nf4 (bf16 compute: its only precision) on both target sets
FT_FAMILIES = ("llama", "qwen3", "gemma2")
FT_KINDS = (("LoRA r8 q,v", dict(lora_r=8)), ("LoRA r8 all-linear", dict(lora_r=8, lora_targets="all-linear")),
            ("last:1", dict(train_layers="last:1")), ("QLoRA nf4 r8 q,v", dict(lora_r=8, quantize_base="nf4")),
            ("QLoRA nf4 r8 all-linear", dict(lora_r=8, quantize_base="nf4", lora_targets="all-linear")))


def finetune_grid() -> list[tuple[str, object, int, int]]:
    return [family_shape(name) for name in FT_FAMILIES]


# The other dense RMSNorm decoders (planner/arch/<family>.py offload_finetune): LoRA on every linear (Phi-3 has no
# peft default targets) in fp32, and QLoRA likewise under checkpointing
FT_OTHER = ("mistral", "qwen2", "gemma", "phi3")


def finetune_specs(b: int, s: int) -> list[tuple[str, TrainSpec]]:
    """(kind, spec) of every fine-tuning run, AdamW: each kind in fp32 and bf16-AMP (QLoRA: bf16, the recipe's
    compute dtype), checkpointing off and on."""
    return [(kind, TrainSpec(b, s, prec, "adamw", checkpointing=ckpt, offload_activations=True, **kw))
            for kind, kw in FT_KINDS for prec in (("bf16",) if "quantize_base" in kw else ("fp32", "bf16-amp"))
            for ckpt in (False, True)]


def finetune_rows() -> list[dict]:
    """One dict per fine-tuning run (offload_row's, with its kind and the phases' errors)."""
    import dataclasses

    runs = [(row, finetune_specs(*row[2:])) for row in finetune_grid()]
    for name in FT_OTHER:
        label, cfg, b, s = family_shape(name)
        runs.append(((label, cfg, b, s), [
            ("LoRA r8 all-linear", TrainSpec(b, s, "fp32", "adamw", lora_r=8, lora_targets="all-linear",
                                             offload_activations=True)),
            ("QLoRA nf4 r8 all-linear", TrainSpec(b, s, "bf16", "adamw", checkpointing=True, lora_r=8,
                                                  lora_targets="all-linear", quantize_base="nf4",
                                                  offload_activations=True))]))
    out = []
    for (label, cfg, b, s), specs in runs:
        for kind, spec in specs:
            got = offload_row(label, cfg, spec, dataclasses.replace(spec, offload_activations=False),
                              "host_activation_offload")
            if got is None:
                continue
            row, est, m = got
            phases = m["measured"]["phase_peak_bytes"]
            out.append({**row, "kind": kind, "phase_err": {k: est.phase_peak_bytes[k] / phases[k] - 1
                                                           for k in phases if phases[k]}})
    return out


# Fine-tuning under --offload-activations in combination (the combinations table's, above, for full training):
# --grad-accum 2, the checkpointing policies every:2 and selective, and --offload-optimizer beside it, on the dense
# RMSNorm decoders' first grid shape (planner/arch/<family>.py offload_finetune). LoRA r8 on peft's default targets
# (q_proj, v_proj; Phi-3 has none: every linear), the last block alone and QLoRA nf4 (bf16 compute). With
# --offload-optimizer LoRA is r64: torchao's minimal_size (4,096 elements) keeps r8's adapters (r*h = 512 elements
# at h64) on the device, r64's q_proj adapters (64*64 = 4,096) move to the host and v_proj's lora_B (32*64) stays.
FT_MIX_FULL = ("llama", "qwen3", "gemma2")  # every combination; the other dense decoders one row per combination
FT_MIX_OTHER = ("mistral", "qwen2", "gemma", "phi3")


def _ft_lora(arch: str, r: int = 8) -> dict:
    return dict(lora_r=r, lora_targets="all-linear") if arch == "phi3" else dict(lora_r=r)


def finetune_mix_specs(arch: str, b: int, s: int) -> list[tuple[str, TrainSpec]]:
    """(kind, spec) of every fine-tuning combination run of a family's shape, AdamW, --offload-activations."""
    lora, lora64 = _ft_lora(arch), _ft_lora(arch, 64)
    name = "LoRA r8 all-linear" if arch == "phi3" else "LoRA r8 q,v"
    name64 = name.replace("r8", "r64")
    qlora = dict(lora_r=8, quantize_base="nf4", **({"lora_targets": "all-linear"} if arch == "phi3" else {}))

    def run(kind: str, ft: str, prec: str, **kw) -> tuple[str, TrainSpec]:
        return f"{kind}: {ft}", TrainSpec(b, s, prec, "adamw", offload_activations=True, **kw)

    if arch not in FT_MIX_FULL:
        return [run("grad-accum", name, "bf16-amp", checkpointing=True, grad_accum=2, **lora),
                run("grad-accum", "QLoRA nf4 r8", "bf16", grad_accum=2, **qlora),
                run("policy", name, "fp32", checkpointing=True, checkpoint_policy="every:2", **lora),
                run("policy", name, "bf16-amp", checkpointing=True, checkpoint_policy="selective", **lora),
                run("+ offload-optimizer", name64, "bf16-amp", checkpointing=True, offload_optimizer=True, **lora64)]
    out = []
    for ckpt in (False, True):
        for prec in ("fp32", "bf16-amp"):
            out.append(run("grad-accum", name, prec, checkpointing=ckpt, grad_accum=2, **lora))
            out.append(run("grad-accum", "last:1", prec, checkpointing=ckpt, grad_accum=2, train_layers="last:1"))
        out.append(run("grad-accum", "QLoRA nf4 r8", "bf16", checkpointing=ckpt, grad_accum=2, **qlora))
    for policy in ("every:2", "selective"):
        for prec in ("fp32", "bf16-amp"):
            out.append(run("policy", name, prec, checkpointing=True, checkpoint_policy=policy, **lora))
        out.append(run("policy", "last:1", "fp32", checkpointing=True, checkpoint_policy=policy, train_layers="last:1"))
        out.append(run("policy + grad-accum", "QLoRA nf4 r8", "bf16", checkpointing=True, checkpoint_policy=policy,
                       grad_accum=2, **qlora))
    for ckpt in (False, True):
        for prec in ("fp32", "bf16-amp"):
            out.append(run("+ offload-optimizer", name64, prec, checkpointing=ckpt, offload_optimizer=True, **lora64))
    out.append(run("+ offload-optimizer", "last:1", "bf16-amp", offload_optimizer=True, train_layers="last:1"))
    return out


def finetune_mix_rows(families: tuple[str, ...] = FT_MIX_FULL + FT_MIX_OTHER) -> list[dict]:
    """One dict per fine-tuning combination run (offload_row's, with its kind, the phases' errors and the optimizer's
    host bytes: combination_row)."""
    out = []
    for arch in families:
        label, cfg, b, s = family_shape(arch)
        out += [r for r in (combination_row(label, cfg, kind, spec) for kind, spec in finetune_mix_specs(arch, b, s))
                if r is not None]
    return out


def finetune_mix_lines(rs: list[dict] | None = None) -> list[str]:
    rs = finetune_mix_rows() if rs is None else rs
    worst, worst_host, sim_equal = summary(rs)
    opt = [r for r in rs if r["est_opt_host"] is not None]
    opt_exact = all(r["est_opt_host"] == r["meas_opt_host"] for r in opt)
    lines = ["", "## Fine-tuning in combination: accumulation, checkpointing policies, optimizer offloading", "",
             "Fine-tuning (LoRA, the last block, QLoRA nf4) under `--offload-activations` with the combinations above. "
             "`--grad-accum 2`: a later micro-batch runs with every trainable .grad alive, its backward the "
             "fine-tuning sweep's own later micro-batch (planner/estimate/finetune.py `_sweep(grads_exist=True)`: "
             "new grads added in place) with the saved sets on the host. `--checkpointing every:2`: a block not "
             "checkpointed saves through save_on_cpu's hook, its whole walk with its input needing grad "
             "(enable_input_require_grads) copied to the host (planner/arch/decoder.py `offload_walk`), so its "
             "backward points are the fine-tuning sweep's with its saved set emptied; a checkpointed block's recompute "
             "stays on the device and its input is a host copy. `selective`: the policy's outputs (LoRA's adapter "
             "matmuls among the counted mms; QLoRA's gemm_4bit neither saved nor counted) are the checkpoint's own "
             "cache, on the device (planner/estimate/offload_ft.py `_policy_sweep`, `ft_policy_ops`). "
             "`--offload-optimizer`: torchao's CPUOffloadOptimizer is given the trainable tensors only, so only those "
             "of at least 4,096 elements move their AdamW states to the host (LoRA r64's q_proj adapters, the last "
             "block's weights; the adapters in fp32 whatever the base: planner/estimate/offload.py `trainable_sizes`). "
             "Eager attention's forward point under checkpointing holds v as v_proj made it (bf16 under autocast: "
             "no KV cache to promote it) and repeat_kv's copy of it (planner/arch/decoder.py "
             "`offload_forward_points`; Gemma 2 bf16-AMP checkpointed was +2.9% in forward before). Gemma 2's forward "
             "under selective is high by up to 3% (its last block's eager attention point counts every block's cached "
             "outputs, the last block's gate, up and down not made yet there; never the step's peak: "
             "planner/arch/gemma2.py `offload_bound_note`). LoRA on the last block's MLP input adds peft's "
             "moment `result + lora_B(lora_A(x)) * scaling`: the base output, lora_B's and the scaled copy alive at "
             "once (planner/arch/decoder.py `offload_adapter_extra`; Phi-3's fused gate_up was -2.7% to -6.3% in "
             "forward before, every fine-tuning row of Phi-3 too).", "",
             f"Worst device-peak error {worst:.2%}; worst host error {worst_host:.2%} (activation copies); optimizer "
             f"host bytes exact: {'yes' if opt_exact else 'NO'}; simulate = measure to the byte (device and host): "
             f"{'yes' if sim_equal else 'NO'}. Bar: 1%. {len(rs)} runs; \"without offload\" is the same run without "
             "--offload-activations.", ""]
    opt_column = ("host (optimizer): estimate / measured", "---:", lambda r: f"{r['est_opt_host']:,} / "
                  f"{r['meas_opt_host']:,}" if r["est_opt_host"] is not None else "-")
    lines += table([("model", "---", lambda r: r["model"]), ("combination", "---", lambda r: r["kind"]),
                    ("run", "---", lambda r: r["run"])] + measured_columns("host (activation copies)")
                   + [opt_column, WORST_PHASE], rs)
    return lines


def finetune_lines() -> list[str]:
    rs = finetune_rows()
    worst, worst_host, sim_equal = summary(rs)
    lines = ["", "## Fine-tuning: LoRA and a trainable subset", "",
             "With fine-tuning save_on_cpu copies only what autograd saves, and a frozen layer saves less: a frozen "
             "Linear saves no input for a weight grad, but its weight (the t() view, or autocast's fresh copy) when "
             "its input needs grad; a LoRA adapter its input (or the dropout's output and noise), lora_A's output and "
             "the adapters' weights; nothing before the first tensor that needs grad is saved. The host copies are the "
             "block walk's host view (planner/arch/saved.py `walk_block`: one copy per saved variable, beside the "
             "per-storage view the fine-tuning estimate sums; full training's copies come from the same walk, "
             "planner/arch/decoder.py `offload_walk`). The device figure is the fine-tuning estimate's persistent "
             "state (frozen weights, adapters, their grads and AdamW states) with the saved sets on the host: "
             "autocast's cache holds the trainable leaves' copies only (a frozen weight's copy is fresh at each "
             "matmul, saved to the host and freed), and under checkpointing the embedding output that "
             "enable_input_require_grads turns into a leaf stays on the device, held by its AccumulateGrad node, "
             "until backward reaches it; the recompute's saved set is on the device. Estimate: "
             "planner/estimate/offload_ft.py (`finetune_host_terms`, `ft_sweep`). QLoRA (offload_act.py "
             "`offload_qlora`): its fp32 twin's offloaded step less the quantized weights, with the dequantized weights' backward points; "
             "bitsandbytes' MatMul4Bit keeps its packed weight on ctx, not through save_for_backward, so the "
             "quantized linears' weights are not copied (the twin's walk without them). The other dense RMSNorm "
             "decoders (Mistral, Qwen 2, Gemma, Phi-3) have one LoRA and one QLoRA row each. The MoE families are "
             "refused in one line naming the family: the walk's host view of the sparse block is exact (frozen "
             "experts save their weights, not their inputs; planner/arch/moe.py saved_mlp, tests/"
             "test_offload_finetune.py) and so were their small grid shapes, but at full size the device figure's "
             "backward is not (qwen1.5-moe-a2.7b LoRA q,v b1 s512 bf16-AMP +1.85%, +2.53% checkpointed, against "
             "the simulation: the experts' backward point); GPT-2 (HF and the book's) is refused likewise "
             "(planner/arch/<family>.py `offload_finetune`). The forward phase is not the peak in any row: its column is within a few percent "
             "(Gemma 2 under checkpointing, Phi-3 fp32: points inside the block the fine-tuning path takes from full "
             "training's).", "",
             f"Worst device-peak error {worst:.2%}; worst host error {worst_host:.2%}; simulate = measure to the byte "
             f"(device and host): {'yes' if sim_equal else 'NO'}. Bar: 1%.", ""]
    lines += table([("model", "---", lambda r: r["model"]), ("fine-tuning", "---", lambda r: r["kind"]),
                    ("run", "---", lambda r: r["run"])] + measured_columns("host") + [WORST_PHASE], rs)
    return lines


# Fine-tuning at full size, formula against the simulation (b1 s512 bf16-AMP AdamW, CPU device): a tied head
# (llama-3.2-1b, qwen3-0.6b: a frozen tied weight makes no grad to accumulate), sandwich norms (gemma-2-2b)
FT_FULL_SIZE = (("llama-3.2-1b", dict(lora_r=16)), ("llama-3.2-1b", dict(lora_r=16, lora_targets="all-linear",
                                                                         checkpointing=True)),
                ("qwen3-0.6b", dict(train_layers="last:2")), ("gemma-2-2b", dict(lora_r=16, checkpointing=True)))


def finetune_full_size() -> list[str]:
    lines = ["", "Fine-tuning at full size, formula against the simulation (b1 s512 bf16-AMP AdamW, CPU device):", ""]
    rs = []
    for name, kw in FT_FULL_SIZE:
        spec = TrainSpec(1, 512, "bf16-amp", "adamw", offload_activations=True, **kw)
        rs.append({**simulated_row(name, spec), "spec": spec})
    return lines + table([("preset", "---", lambda r: r["preset"]),
                          ("fine-tuning", "---", lambda r: (f"LoRA r{r['spec'].lora_r} {r['spec'].lora_targets or 'q,v'}"
                                                            if r["spec"].lora_r else r["spec"].train_layers)),
                          ("checkpointing", "---", lambda r: "full" if r["spec"].checkpointing else "none")]
                         + simulated_columns("host"), rs)


# Full size, formula against the simulation (b1 s256 bf16-AMP AdamW, CPU device): one row per combination, on tied
# (llama-3.2-1b, qwen3-0.6b, hf-gpt2-xl) and untied (gemma-2-2b, qwen1.5-moe-a2.7b) heads
MIX_FULL_SIZE = (("llama-3.2-1b", dict(checkpointing=True, grad_accum=2)),
                 ("llama-3.2-1b", dict(checkpointing=True, grad_accum=2, offload_optimizer=True)),
                 ("qwen3-0.6b", dict(checkpointing=True, checkpoint_policy="selective")),
                 ("qwen3-0.6b", dict(grad_accum=2, offload_optimizer=True)),
                 ("gemma-2-2b", dict(checkpointing=True, checkpoint_policy="every:2", offload_optimizer=True)),
                 ("hf-gpt2-xl", dict(checkpointing=True, grad_accum=2)),
                 ("qwen1.5-moe-a2.7b", dict(checkpointing=True, grad_accum=2, offload_optimizer=True)))


def mix_full_size() -> list[str]:
    lines = ["", "Full size, formula against the simulation (b1 s256 bf16-AMP AdamW, CPU device; llama-3.2-1b and "
             "qwen3-0.6b tie their head: the tied weight's grad is summed out of place at the embedding's backward, "
             "one more V*h tensor in a later micro-batch, planner/estimate/offload_act.py):", ""]
    rs = []
    for name, kw in MIX_FULL_SIZE:
        spec = TrainSpec(1, 256, "bf16-amp", "adamw", offload_activations=True, device="cpu", **kw)
        what = ", ".join(("checkpointing " + kw.get("checkpoint_policy", "full")) if k == "checkpointing" else
                         f"grad-accum {v}" if k == "grad_accum" else "offload-optimizer"
                         for k, v in kw.items() if k != "checkpoint_policy")
        rs.append({**simulated_row(name, spec), "what": what})
    def opt(key):  # --offload-optimizer's host bytes, "-" in a row without it
        return lambda r: f"{r[key]:,}" if r["est_opt_host"] is not None else "-"

    return lines + table([("preset", "---", lambda r: r["preset"]), ("combination", "---", lambda r: r["what"])]
                         + simulated_columns("host (activation copies)")
                         + [("host (optimizer): estimate", "---:", opt("est_opt_host")),
                            ("simulated", "---:", opt("sim_opt_host"))], rs)


def markdown(quick: bool = False) -> str:
    from planner.estimate.offload_act import PCIE_GEN4_X16_BYTES_PER_S

    rs = rows(quick)
    worst, worst_host, sim_equal = summary(rs)
    lines = [HEADING, "",
             "`--offload-activations` runs the forward and loss under `torch.autograd.graph.save_on_cpu(pin_memory=True)`, "
             "as users write it. Its pack hook makes a fresh host tensor and copies every saved tensor into it, one copy "
             "per saved variable (a tensor two nodes save is copied twice; the weights the matmuls save are copied "
             "too), so the host holds more than the deduplicated activations. On this CPU-only machine the pack hook "
             "still copies (with pin_memory=False it would call `tensor.cpu()`, which returns a CPU tensor itself: "
             "nothing would move), and the unpack hook's `.to('cpu')` returns the host copy itself. The tracker counts "
             "the tensors the pack hook makes as host bytes and everything else as the device figure: **device figure: "
             "for the CUDA check** (on CUDA the unpack hook's device copy of each node's saved tensors is a transient "
             "in backward that this run cannot show). torchtune's `OffloadActivations` cannot run here: its "
             "constructor calls `torch.cuda.default_stream()`, which raises 'Torch not compiled with CUDA enabled' on a "
             "CPU build (it also skips parameters and tensors under 1 KiB, so its host bytes are smaller). Estimate: "
             "planner/estimate/offload_act.py (device phases) and planner/arch/<family>.py `offload_copies` (the host "
             "copies, saved variable by saved variable: planner/arch/decoder.py for the RMSNorm decoders, with "
             "Gemma's norms and embedding scale and Gemma 2's sandwich norms and soft-capping in their files). "
             "Regenerate: "
             "`python -m planner bench offload-activations --out docs/accuracy.md`.", "",
             f"Worst device-peak error {worst:.2%}; worst host error {worst_host:.2%}; simulate = measure to the byte "
             f"(device and host): {'yes' if sim_equal else 'NO'}. Bar: 1%.", ""]
    lines += table([("model", "---", lambda r: r["model"]), ("run", "---", lambda r: r["run"])]
                   + measured_columns("host")
                   + [("PCIe copy time / step (Gen4 x16)", "---:",
                       lambda r: f"{2 * r['est_host'] / PCIE_GEN4_X16_BYTES_PER_S * 1e6:.1f} us"), WORST_PHASE], rs)
    lines += ["", "The forward phase's estimate takes the logits made, the last block's gated product and, with eager "
              "attention, the last block's s x s scores (planner/arch/decoder.py offload_forward_points; the step's "
              "peak at long sequences: Gemma 2 / Llama eager h32 s256 within 0.1%, tests/test_offload_families.py); "
              "the other points inside a block are modelled too (RoPE on q and k, SDPA's or eager attention's working "
              "set, the gated product, Phi-3's fused projections: planner/arch/decoder.py offload_attention_points / "
              "offload_forward_held, planner/arch/phi3.py), so every phase is held, not only the peak (the worst "
              "phase column; the off-grid section below sweeps other shapes). Gemma 2 fp32 "
              "with checkpointing was +2.09% from its checkpointed-backward estimate's own error, the first block's "
              "recomputed GELU point 98,808 B above the measured one (the post-feedforward norm's freed saves and "
              "the full-attention mask gone by block 0: planner/arch/gemma2.py block_points, first_block_released); "
              "now 8 B low. GPT-2 (HF, planner/arch/gpt2.py) and the book's GPT-2 (planner/arch/gpt2_book.py): "
              "the host copies saved variable by saved variable (LayerNorm, Conv1D or the book's three Linears, "
              "gelu_new, dropout's noise, SDPA's flash or math kernel, the book's eager attention and bool mask), "
              "the forward's points with the models' locals (inputs_embeds, position embeddings, the block's "
              "attn_output or shortcut), and without checkpointing the backward's own points (offload_backward_points: "
              "with every saved tensor on the host a node's backward holds only the grads made, the residual's grad "
              "and its own temporaries: gelu_new's six b*s*f, the weight grads' fp32 casts under autocast, the "
              "math kernel's s x s grads); the book's loss runs outside the model (offload_loss_held). A tied head's "
              "accumulation at the end of the backward (every grad and two V*h) is the backward's peak at full size "
              "(hf-gpt2-xl b1 s1024 bf16-AMP SGD checkpointed was -1.46% without it). The MoE families "
              "(planner/arch/moe.py): the sparse block's saved variables (router, top-k, dispatch permutations, "
              "grouped GEMMs, combine; Qwen2-MoE's shared expert) and its forward (the routing locals, the gate "
              "product or the combine) and backward points (the grouped GEMMs' grads, the combine's). The long "
              "rows (V97 h32 b2 s256, one per RMS family): without checkpointing the forward is the peak, and the "
              "model's forward keeps the embedding output, the last block's input, RoPE's cos and sin and "
              "position_ids beside the last block's MLP, its RoPE on q (Qwen 3: q_norm's fp32 output) or its SDPA "
              "(repeat_kv's copies and the converted mask under a sliding window; Phi-3's whole fused qkv output; "
              "Qwen2-MoE's unused (s, s) bool mask): -4% to -37% before (planner/arch/decoder.py "
              "offload_forward_held, offload_attention_points). Their backward without checkpointing: RoPE's backward "
              "on q and k (the incoming grad and RoPE's temporaries in its own widths: offload_rope_backward; Gemma "
              "-24.6% before), Qwen 3's q/k norms (offload_qk_norm_points) and eager attention's softmax backward, "
              "each to the byte. On CUDA the device figure also gets the "
              "unpack hook's device copies in backward (one node's saved tensors at a time) and the pinned host "
              "copies are rounded up to powers of two (`host_pinned_rounded`): both for the CUDA check."]
    if not quick:
        lines += mix_lines() + finetune_lines() + finetune_mix_lines() + finetune_full_size() + mix_full_size() + full_size()
    return "\n".join(lines) + "\n"


FULL_SIZE = (("llama-3.2-1b", False), ("tinyllama-1.1b", True), ("qwen2.5-0.5b", False), ("mistral-7b-v0.1", False),
             ("qwen3-0.6b", False), ("qwen3-0.6b", True), ("phi-3-mini-4k", False), ("gemma-2b", False),
             ("gemma-2-2b", False), ("gemma-2-2b", True), ("hf-gpt2-xl", False), ("hf-gpt2-xl", True),
             ("gpt2-xl", False), ("gpt2-xl", True), ("qwen1.5-moe-a2.7b", False), ("qwen1.5-moe-a2.7b", True))


def full_size() -> list[str]:
    """The formula against the simulation (fake tensors, the same hooks) at full size, one preset per family."""
    lines = ["", "Full size, formula against the simulation (b1 s512 bf16-AMP AdamW, CPU device: the mechanism "
             "above on fake tensors):", ""]
    rs = [{**simulated_row(name, TrainSpec(1, 512, "bf16-amp", "adamw", checkpointing=ckpt, offload_activations=True)),
           "ckpt": ckpt} for name, ckpt in FULL_SIZE]
    return lines + table([("preset", "---", lambda r: r["preset"]),
                          ("checkpointing", "---", lambda r: "full" if r["ckpt"] else "none")]
                         + simulated_columns("host")
                         + [("host error", "---:", lambda r: f"{r['est_host'] / r['sim_host'] - 1:+.3%}")], rs)


def main(quick: bool = False, out: str | None = None, grid: str = "all") -> int:
    """grid "offgrid": the off-grid sweep's section (offgrid_markdown) in place of the measured tables."""
    from .main import write_section

    text = offgrid_markdown() if grid == "offgrid" else markdown(quick)
    print(text)
    if out:
        write_section(out, text)
    return 0


# Off the grid (issue #24): the RMS decoder families at shapes the grids above do not hold, estimate against the
# simulation (fake tensors under the same save_on_cpu hooks: simulate = measure to the byte for this mechanism, the
# tables above), every phase. Each shape is the family's long grid shape (grid_configs()[3]: V97, two blocks, its
# own attention, window and activation) with (h, f, a, kv, b, s) replaced: f = 2h..8h, grouped and plain K/V,
# b 1..4, s 64..512 (past Mistral's 32-token and Phi-3's 48-token windows); head_dim = h / a.
OFFGRID_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma", "gemma2", "qwen2_moe", "qwen3_moe")
OFFGRID_SHAPES = ((64, 512, 4, 2, 2, 128),  # f = 8h
                  (48, 96, 6, 2, 1, 512),   # f = 2h, the longest sequence
                  (32, 128, 4, 4, 4, 64),   # f = 4h, kv = a, b4
                  (64, 192, 8, 2, 2, 256))  # f = 3h, a = 4 kv
# the optimizer side, cycled over the runs of a shape: AdamW, SGD, AdamW with --offload-optimizer (the MoE
# families refuse the last: planner/arch/moe.py offload_combinations)
OFFGRID_OPTIMIZERS = (("adamw", False), ("sgd", False), ("adamw", True))


def offgrid_config(arch: str, h: int, f: int, a: int, kv: int):
    import dataclasses
    import importlib

    cfg = importlib.import_module(f"planner.arch.{arch}").FAMILY.grid_configs()[3][1]
    kw = dict(hidden_size=h, intermediate_size=f, num_attention_heads=a, num_key_value_heads=kv)
    names = {fld.name for fld in dataclasses.fields(cfg)}
    if "head_dim" in names:
        kw["head_dim"] = h // a
    if "moe_intermediate_size" in names:  # the experts half as wide as the dense MLP, the shared expert as wide
        kw["moe_intermediate_size"] = f // 2
    if "shared_expert_intermediate_size" in names:
        kw["shared_expert_intermediate_size"] = f
    return dataclasses.replace(cfg, **kw)


def offgrid_runs(families: tuple[str, ...] = OFFGRID_FAMILIES) -> list[tuple[str, object, TrainSpec]]:
    """(label, config, spec) of every off-grid run: each family x OFFGRID_SHAPES x fp32 / bf16 / bf16-AMP x
    checkpointing off and on, the optimizer side cycled (OFFGRID_OPTIMIZERS)."""
    out = []
    for arch in families:
        moe = arch.endswith("_moe")
        opts = OFFGRID_OPTIMIZERS[:2] if moe else OFFGRID_OPTIMIZERS
        for n, (h, f, a, kv, b, s) in enumerate(OFFGRID_SHAPES):
            i = n  # each shape starts the cycle one further on: every precision meets every optimizer side
            cfg = offgrid_config(arch, h, f, a, kv)
            for prec in ("fp32", "bf16", "bf16-amp"):
                for ckpt in (False, True):
                    opt, off_opt = opts[i % len(opts)]
                    i += 1
                    out.append((f"{arch} V97 h{h} f{f} a{a} kv{kv} L2", cfg,
                                TrainSpec(b, s, prec, opt, checkpointing=ckpt, offload_activations=True,
                                          offload_optimizer=off_opt)))
    return out


def offgrid_row(label: str, cfg, spec: TrainSpec) -> dict | None:
    """One off-grid run: the estimate's and the simulation's device peak, every phase and the host bytes (None:
    refused in one line)."""
    from planner.estimate.training import estimate_training
    from planner.measure.simulate import simulate_training
    from planner.validation import ConfigError

    try:
        est = estimate_training(cfg, spec)
    except ConfigError:
        return None
    sim = simulate_training(cfg, spec)
    phases = sim["phase_peak_bytes"]
    return {"model": label, "run": f"b{spec.batch_size} s{spec.seq_len} {spec.precision} {spec.optimizer}"
            + (" ckpt" if spec.checkpointing else "") + (" +offload-opt" if spec.offload_optimizer else ""),
            "est_peak": est.peak_bytes, "sim_peak": sim["peak_bytes"], "est_phase": est.peak_phase,
            "sim_phase": sim["peak_phase"], "est_host": est.transients["host_activation_offload"],
            "sim_host": sim["host_activation_offload_bytes"],
            "phase_err": {k: est.phase_peak_bytes[k] / phases[k] - 1 for k in phases if phases[k]}}


def offgrid_rows(families: tuple[str, ...] = OFFGRID_FAMILIES, runs: list | None = None) -> list[dict]:
    """The off-grid sweep (offgrid_runs, or the runs given): one offgrid_row per run the estimate does not refuse."""
    out = []
    for label, cfg, spec in offgrid_runs(families) if runs is None else runs:
        row = offgrid_row(label, cfg, spec)
        if row is not None:
            out.append(row)
    return out


OFFGRID_HEADING = "# Activation offloading off the grid: estimate against the simulation (issue #24)"


def offgrid_markdown(rs: list[dict] | None = None) -> str:
    """The off-grid sweep as a section: the worst error per family and phase, then every run past 1%."""
    rs = offgrid_rows() if rs is None else rs
    worst_host = max(abs(r["est_host"] / r["sim_host"] - 1) for r in rs)
    fams = sorted({r["model"].split()[0] for r in rs}, key=OFFGRID_FAMILIES.index)
    phases = ("forward", "loss", "backward", "optimizer", "zero_grad")
    lines = [OFFGRID_HEADING, "",
             "`python -m planner bench offload-activations --grid offgrid [--out docs/accuracy.md]` "
             "(bench/offload_act.py offgrid_runs): every RMS decoder family at shapes the measured grids do "
             "not hold (h/f from 2h to 8h, grouped and plain K/V, b 1..4, s 64..512, past Mistral's and Phi-3's "
             "windows), fp32 / bf16 / bf16-AMP, checkpointing off and on, AdamW, SGD and AdamW with "
             "--offload-optimizer (not the MoE families: refused in one line), estimated and simulated (fake "
             "tensors under the same save_on_cpu hooks; simulate = measure to the byte for this mechanism, the "
             "tables above). Each phase's peak is compared, not only the step's.", "",
             f"{len(rs)} runs; worst host error {worst_host:.2%}; runs with a phase past 1%: "
             f"{sum(1 for r in rs if max(abs(v) for v in r['phase_err'].values()) > 0.01)}.", "",
             "| family | runs | worst peak error | " + " | ".join(f"worst {p}" for p in phases) + " |",
             "|---|---:|---:|" + "---:|" * len(phases)]
    for fam in fams:
        sub = [r for r in rs if r["model"].split()[0] == fam]
        peak = max((r["est_peak"] / r["sim_peak"] - 1 for r in sub), key=abs)
        cells = []
        for p in phases:
            errs = [r["phase_err"][p] for r in sub if p in r["phase_err"]]
            cells.append(f"{max(errs, key=abs):+.2%}" if errs else "-")
        lines.append(f"| {fam} | {len(sub)} | {peak:+.2%} | " + " | ".join(cells) + " |")
    past = [r for r in rs if max(abs(v) for v in r["phase_err"].values()) > 0.01]
    if past:
        lines += ["", "Runs with a phase past 1% (each in a class whose estimate states its measured bound in a note: Gemma 2 "
                  "checkpointed, the forward high by up to 2.9% (never the step's peak): planner/arch/gemma2.py "
                  "offload_bound_note):", "", "| model | run | device peak: estimate | simulated | error | "
                  "phases past 1% |", "|---|---|---:|---:|---:|---|"]
        for r in past:
            bad = ", ".join(f"{k} {v:+.2%}" for k, v in r["phase_err"].items() if abs(v) > 0.01)
            lines.append(f"| {r['model']} | {r['run']} | {r['est_peak']:,} | {r['sim_peak']:,} | "
                         f"{r['est_peak'] / r['sim_peak'] - 1:+.2%} | {bad} |")
    return "\n".join(lines) + "\n"
