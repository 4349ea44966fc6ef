"""The command line's shared vocabulary (no torch): the MODEL and RUN options every train command takes,
their parsing into a validated (config, TrainSpec), the estimate record printed beside a measurement, and
the exit codes. planner/cli/main.py (the parser and the commands) and the commands in their own files
(planner/cli/simulate.py, ...) import it; it imports none of them.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from . import parallel as cli_parallel
from ..config import ATTENTION_KINDS, PRESETS, ConfigError, config_to_dict, resolve_model
from ..spec import LOSSES, OPTIMIZER_IMPLS, OPTIMIZERS, PRECISIONS, TrainSpec, check_device, prepare
from ..units import fmt_bytes

EXIT_INVALID, EXIT_FAILED = 2, 3


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help=f"a preset: {', '.join(PRESETS)} (give --model or --config)")
    p.add_argument("--config", help="a JSON config file: the planner's own ({\"arch\": ...}, e.g. the book's "
                                    "GPT-2 keys) or a Hugging Face config.json (model_type llama, mistral, qwen2, ...)")


def _add_run(p: argparse.ArgumentParser, device_required: bool = False, batch_required: bool = True,
             seq_required: bool = True) -> None:
    """seq_required=False: the parser also takes --module, whose model may have no sequence (parse_train then
    requires --seq-len for a preset or config itself)."""
    p.add_argument("--batch-size", type=int, required=batch_required,
                   help="samples per micro-batch" if batch_required else
                   "samples per micro-batch (default: none, and fit reports the largest batch that fits)")
    p.add_argument("--seq-len", type=int, required=seq_required,
                   help="tokens per sample (at most the model's context)" + ("" if seq_required else
                        "; no default: required but with --module --input-shape (or a one-argument make_batch)"))
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="fp32 (the default; bf16 with --quantize-base); fp16-amp / bf16-amp (autocast, fp32 master "
                        "weights); bf16 (everything in bf16)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="the optimizer whose states are held")
    p.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="default",
                   help="PyTorch's optimizer kernel; default is its own pick (for-loop on CPU, foreach on CUDA)")
    p.add_argument("--checkpointing", nargs="?", const="full", default=None, metavar="POLICY",
                   help="activation checkpointing of every block; POLICY (planner/checkpointing.py): full (the "
                        "default), every:K (blocks 0, K, 2K, ...: transformers' every_n_layers), selective "
                        "(torchtitan's op policy: matmul and attention outputs kept, pointwise recomputed); "
                        "every:K and selective are estimated, measured and simulated (with fine-tuning or "
                        "--grad-accum > 1: measured and simulated only)")
    p.add_argument("--attention", choices=ATTENTION_KINDS,
                   help="attention kernel (default: the model's own, as its config says)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--offload-optimizer", action="store_true",
                   help="AdamW's state on the host (torchao CPUOffloadOptimizer): the device peak and the host's bytes "
                        "as two figures; measured and simulated with a plain-torch equivalent (pinned host copies on "
                        "cuda, as torchao; --device cpu: unpinned)")
    p.add_argument("--offload-activations", action="store_true",
                   help="the forward under torch.autograd.graph.save_on_cpu(pin_memory=True): every saved tensor "
                        "(weights a matmul saves included) copied to the host; the device peak and the host's bytes "
                        "as two figures (on a CPU device the device figure is for the CUDA check)")
    p.add_argument("--loss", type=_loss_arg, default="default", metavar="|".join(LOSSES[:3] + ("chunked-ce[:N]", "cce")),
                   help="default: as the model's users train it (transformers: model(input_ids, labels=...).loss; "
                        "the book's GPT-2: cross-entropy over its logits); cross-entropy: the book's loss over the "
                        "returned logits; chunked-ce[:N]: cross-entropy over chunks of N tokens, each chunk's logits "
                        "from the hidden states and the head weight, recomputed in backward (default N: Liger's "
                        "rule); cce: Cut Cross-Entropy's algorithm (per-token log-sum-exp, logits recomputed by "
                        "blocks in backward)")
    p.add_argument("--train-layers", default="all",
                   help="fine-tuning: which parameters train: all; head (output projection and final norm); "
                        "last:N (the last N blocks, the final norm and an untied head); the rest is frozen")
    p.add_argument("--lora-r", type=int, default=None,
                   help="fine-tuning with peft LoRA of this rank on a frozen base (default: none, no LoRA)")
    p.add_argument("--lora-alpha", type=float, default=8.0, help="LoRA alpha (peft's default; no effect on memory)")
    p.add_argument("--lora-dropout", type=float, default=0.0, help="LoRA dropout probability (default: 0, peft's)")
    p.add_argument("--lora-targets", default="",
                   help="LoRA target modules, comma-separated (e.g. q_proj,v_proj), or all-linear (every linear "
                        "layer but the output head) (default: peft's default for the model type)")
    p.add_argument("--quantize-base", choices=("nf4", "fp4", "int8"), default=None,
                   help="QLoRA: the frozen base's linear layers quantized by bitsandbytes (needs --lora-r; computes "
                        "in bf16: implies --precision bf16; measuring needs bitsandbytes installed) (default: none, "
                        "no quantization)")
    p.add_argument("--double-quant", action="store_true",
                   help="QLoRA: bnb_4bit_use_double_quant (the 4-bit absmax quantized again, 8-bit per 256)")
    p.add_argument("--device", required=device_required, default=None if device_required else "cpu",
                   help="cpu, cuda or cuda:N" + (" (required)" if device_required else ""))
    p.add_argument("--json", action="store_true", help="one JSON object on stdout (bytes as integers)")


def _loss_arg(text: str) -> str:
    """--loss: one of LOSSES, or chunked-ce:N (argparse answers exit 2 with this message otherwise)."""
    from ..losses import check_loss

    try:
        check_loss(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if text.split(":")[0] not in LOSSES or (":" in text and not text.startswith("chunked-ce:")):
        raise argparse.ArgumentTypeError(f"invalid choice {text!r} (choose from {', '.join(LOSSES)}, chunked-ce:N)")
    return text


def progress(text: str) -> None:
    """One progress line on stderr (stdout stays the command's answer)."""
    print(f"planner: {text}", file=sys.stderr, flush=True)


def parse_train(args) -> tuple:
    if getattr(args, "seq_len", 0) is None:  # a parser that also takes --module does not require it itself
        raise ConfigError("the following arguments are required: --seq-len")
    cfg = resolve_model(args.model, args.config)
    check_device(args.device)
    spec = TrainSpec(batch_size=args.batch_size, seq_len=args.seq_len, precision=args.precision,
                     optimizer=args.optimizer, checkpointing=bool(args.checkpointing),
                     checkpoint_policy=args.checkpointing or "full", grad_accum=args.grad_accum,
                     optimizer_impl=args.optimizer_impl, device=args.device, loss=args.loss,
                     offload_optimizer=bool(getattr(args, "offload_optimizer", False)),
                     offload_activations=bool(getattr(args, "offload_activations", False)), **finetune_args(args))
    if spec.offload_activations:  # issue #24 (planner/estimate/offload_act.py): one line for what is not modelled
        if cli_parallel.parallel_requested(args):
            raise ConfigError("--offload-activations with --world-size / --parallel is not modelled yet")
        from ..estimate.offload_act import check_offload_activations

        check_offload_activations(cfg, spec)
    if spec.quantize_base != "none" and cli_parallel.parallel_requested(args):
        raise ConfigError("--quantize-base with --world-size / --parallel is not modelled yet (QLoRA is estimated "
                          "for one process)")
    from ..losses import is_fused

    if is_fused(spec.loss) and cli_parallel.parallel_requested(args):
        raise ConfigError(f"--loss {spec.loss} with --world-size / --parallel is not modelled yet")
    return prepare(cfg, spec, args.attention), spec


def finetune_args(args) -> dict:
    """TrainSpec's fine-tuning fields from --train-layers and --lora-* (the LoRA options need --lora-r)."""
    if args.lora_r is not None and args.lora_r <= 0:
        raise ConfigError(f"--lora-r must be positive, got {args.lora_r}")
    if args.lora_r is None and (args.lora_targets or args.lora_dropout):
        raise ConfigError("--lora-targets and --lora-dropout need --lora-r R")
    out = {"train_layers": args.train_layers, "lora_r": args.lora_r or 0, "lora_alpha": args.lora_alpha,
           "lora_dropout": args.lora_dropout, "lora_targets": args.lora_targets}
    if getattr(args, "quantize_base", None) or getattr(args, "double_quant", False):
        out.update(quantize_base=args.quantize_base or "none", double_quant=bool(args.double_quant))
    return out


def default_precision(args) -> None:
    """--precision's default: fp32, or bf16 with --quantize-base (QLoRA computes in bf16)."""
    if getattr(args, "precision", "") is None:
        args.precision = "bf16" if getattr(args, "quantize_base", None) else "fp32"


def _estimate_record(cfg, spec) -> dict:
    from ..estimate.training import estimate_training

    est = estimate_training(cfg, spec).to_dict()
    # basis (issue #20): "formula" here; "fitted simulation" for what is answered from a what-if fit
    return {"model": config_to_dict(cfg), "run": asdict(spec), "basis": "formula", **est, **reserved_lines(spec, est)}


def reserved_lines(spec, est: dict) -> dict:
    """On cuda, what max_memory_reserved would be: the estimate has no ordered list of tensors to replay through
    the caching allocator (planner/allocator.py; simulate --device cuda replays its step), so its figure is the
    peak plus the reserve the fit keeps free (planner/fit.py ALLOCATOR_RESERVE: the worst share measured on an
    H200), and `reserved_peak_source` says so."""
    from ..fit import ALLOCATOR_RESERVE, allocator_reserve_fraction

    share = allocator_reserve_fraction(spec.device, spec.checkpointing)
    if not share or "peak_bytes" not in est:
        return {}
    reserved = int(est["peak_bytes"] * (1 + share))
    return {"reserved_peak_bytes": reserved, "fragmentation_bytes": reserved - est["peak_bytes"],
            "reserved_peak_source": (f"estimate: the peak plus the worst reserve share measured on an H200 "
                                     f"({ALLOCATOR_RESERVE[bool(spec.checkpointing)]:.1%}, planner/fit.py "
                                     "ALLOCATOR_RESERVE), not a replay of the allocator")}


def _print_table(rec: dict, keys: list[str]) -> None:
    width = max(len(k) for k in keys)
    for k in keys:
        v = rec.get(k)
        if isinstance(v, int) and k.endswith("_bytes"):
            print(f"{k:<{width}}  {fmt_bytes(v):>12}  ({v:,} B)")
        elif v is not None:
            print(f"{k:<{width}}  {v}")


ESTIMATE_KEYS = ["params_bytes", "buffers_bytes", "inputs_bytes", "grads_bytes", "optimizer_bytes",
                 "activations_bytes", "peak_bytes", "peak_phase"]


def policy_estimated(cfg, spec) -> bool:
    """False for a checkpointing policy the estimate does not model for this run (planner/estimate/ckpt_policy.py
    check_policy_estimable: the book's GPT-2 fine-tuned, a quantized base, accumulation in full training)."""
    if not (spec.checkpointing and spec.checkpoint_policy != "full"):
        return True
    from ..estimate.ckpt_policy import check_policy_estimable

    try:
        check_policy_estimable(cfg, spec)
    except ConfigError:
        return False
    return True
