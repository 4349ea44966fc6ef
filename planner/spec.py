"""What one training run is: the settings that, with the model config, decide its memory (no torch)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .config import ConfigError, ModelConfig, with_attention

PRECISIONS = ("fp32", "fp16-amp", "bf16-amp", "bf16")
TORCH_OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw")
# Then bitsandbytes' (planner/estimate/bnb_optim.py): AdamW8bit, PagedAdamW8bit, PagedAdamW.
OPTIMIZERS = TORCH_OPTIMIZERS + ("adamw-8bit", "paged-adamw-8bit", "paged-adamw")
OPTIMIZER_IMPLS = ("default", "foreach", "for-loop", "fused")
# default: as the model's users train it (transformers: model(input_ids=x, labels=y).loss; the book's
# GPT-2: cross-entropy over its logits); labels / cross-entropy force one.
LOSSES = ("default", "labels", "cross-entropy")
# Issue #24 (planner/losses.py): the loss from the final hidden states and the head weight, the logits never
# whole: chunked-ce[:N] (N tokens a chunk) and cce (Cut Cross-Entropy).
LOSSES = LOSSES + ("chunked-ce", "cce")
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")

# planner.whatif's fit points (b, s): b >= 2 and b = 1 at a few short sequences (the polynomial is exact, so
# short ones suffice). Here, not in whatif.py, so the CLI's --points default costs no numpy import.
# Nine points with batch >= 2 determine the seven candidate terms (planner/whatif.py CANDIDATES) with two to spare;
# four with batch 1 its own fit's three terms with one to spare. WHATIF_HOLDOUT: simulated and never fitted, the
# check every fit gets (beyond the fitted range, so extrapolation is what is checked).
WHATIF_POINTS = ((2, 16), (2, 32), (2, 48), (3, 16), (3, 40), (4, 24), (4, 48), (5, 32), (6, 16),
                 (1, 16), (1, 24), (1, 32), (1, 48))
WHATIF_HOLDOUT = ((7, 64), (1, 64))
# A model without a sequence axis (an image or tabular module): only the batch varies (s is a placeholder).
WHATIF_POINTS_NO_SEQ = ((2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (1, 1))
WHATIF_HOLDOUT_NO_SEQ = ((9, 1),)


def check_device(device: str) -> str:
    if not isinstance(device, str) or not _DEVICE_RE.match(device):
        raise ConfigError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    return device


@dataclass(frozen=True)
class TrainSpec:
    batch_size: int
    seq_len: int
    precision: str = "fp32"         # fp32 | fp16-amp (autocast + GradScaler) | bf16-amp (autocast) | bf16 (all bf16)
    optimizer: str = "adamw"
    checkpointing: bool = False     # per-block torch.utils.checkpoint(use_reentrant=False)
    grad_accum: int = 1             # micro-batches of batch_size per optimizer step
    optimizer_impl: str = "default"  # default = PyTorch's pick: for-loop on CPU, foreach on CUDA
    device: str = "cpu"
    loss: str = "default"           # one of LOSSES
    # Fine-tuning (issue #12, planner/finetune.py): which parameters train, or LoRA adapters on a frozen base.
    train_layers: str = "all"       # all | head | last:N
    lora_r: int = 0                 # 0: no LoRA; else the adapters' rank
    lora_alpha: float = 8.0         # peft's LoraConfig default (scaling alpha/r: no effect on memory)
    lora_dropout: float = 0.0       # peft's default; > 0 saves the dropout's noise and output per adapter
    lora_targets: str = ""          # "": peft's default for the model type; "all-linear"; or "q_proj,v_proj,..."
    # QLoRA (issue #12, planner/estimate/quantized.py): the frozen base's linear layers quantized by bitsandbytes
    # (transformers' BitsAndBytesConfig: nf4 / fp4 = load_in_4bit + bnb_4bit_quant_type, int8 = load_in_8bit),
    # prepared with peft's prepare_model_for_kbit_training, LoRA on top (needs lora_r > 0). `precision` must be
    # "bf16" there (the CLI implies it): the checkpoint's dtype and bnb_4bit_compute_dtype, the QLoRA recipe;
    # prepare_model_for_kbit_training then casts every non-quantized parameter (norms, embeddings, head) to fp32.
    quantize_base: str = "none"     # none | nf4 | fp4 | int8
    double_quant: bool = False      # bnb_4bit_use_double_quant (BitsAndBytesConfig's default: False)
    # Issue #24 (planner/checkpointing.py): with checkpointing, which blocks and what they keep: full (every block,
    # its input only: what `checkpointing` has always meant), every:K, selective (torchtitan's op policy)
    checkpoint_policy: str = "full"
    # Issue #24 (planner/estimate/offload.py): the optimizer state on the host, torchao's CPUOffloadOptimizer
    # (estimated only: it runs on CUDA / XPU)
    offload_optimizer: bool = False
    # Issue #24 (planner/estimate/offload_act.py): the forward under torch.autograd.graph.save_on_cpu(pin_memory=True):
    # every tensor autograd saves is copied to the host; the device figure and the host's bytes are two figures
    offload_activations: bool = False

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len", "grad_accum"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{name} must be an integer, got {v!r}")
            if v <= 0:
                raise ConfigError(f"{name} must be positive, got {v}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ConfigError(f"unknown optimizer implementation {self.optimizer_impl!r}; "
                              f"choose one of: {', '.join(OPTIMIZER_IMPLS)}")
        from .bnb import check_spec as check_bnb_optimizer

        check_bnb_optimizer(self.optimizer, self.optimizer_impl, str(self.device).split(":")[0])
        if self.optimizer_impl == "fused" and self.optimizer not in ("adam", "adamw", "sgd", "sgd-momentum"):
            raise ConfigError(f"fused is not available for {self.optimizer}")
        from .losses import check_loss

        check_loss(self.loss)
        if self.loss.split(":")[0] not in LOSSES:
            raise ConfigError(f"unknown loss {self.loss!r}; choose one of: {', '.join(LOSSES)}")
        check_device(self.device)
        from .checkpointing import check_policy

        check_policy(self.checkpoint_policy)
        if self.checkpoint_policy != "full" and not self.checkpointing:
            raise ConfigError(f"checkpoint_policy {self.checkpoint_policy!r} needs checkpointing")
        from .finetune import check_lora_settings, check_train_layers

        check_train_layers(self.train_layers)
        check_lora_settings(self)
        from .finetune import check_quantize_settings

        check_quantize_settings(self)

    @property
    def finetuning(self) -> bool:
        """True when part of the model is frozen (a trainable subset, or LoRA on a frozen base)."""
        return bool(self.lora_r) or self.train_layers != "all"

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def param_dtype(self) -> str:
        """Weights, grads and optimizer states: bf16 only in pure bf16; AMP keeps fp32 master weights."""
        return "bfloat16" if self.precision == "bf16" else "float32"

    @property
    def autocast_dtype(self) -> str | None:
        return {"fp16-amp": "float16", "bf16-amp": "bfloat16"}.get(self.precision)

    @property
    def resolved_optimizer_impl(self) -> str:
        """PyTorch's default: foreach only when every param is on cuda/xpu/mtia (optimizer.py
        _default_to_fused_or_foreach); CPU falls back to the per-parameter for-loop."""
        if self.optimizer_impl != "default":
            return self.optimizer_impl
        return "foreach" if self.device_type == "cuda" else "for-loop"


def check_fits_model(cfg: ModelConfig, spec: TrainSpec) -> None:
    if spec.seq_len > cfg.max_seq_len:
        raise ConfigError(f"seq_len {spec.seq_len} is longer than the model's context of {cfg.max_seq_len}")
    from .arch import family_of

    family = family_of(cfg)
    if spec.loss == "labels" and family.default_loss != "labels":
        raise ConfigError(f"the {family.arch} model has no labels= loss; use --loss cross-entropy (or default)")
    from .losses import is_fused

    if is_fused(spec.loss):
        family.check_fused_loss(cfg, spec)
    family.check_run(cfg, spec)
    from .finetune import check_finetune

    check_finetune(family, cfg, spec)


def prepare(cfg: ModelConfig, spec: TrainSpec, attention: str | None = None) -> ModelConfig:
    """The model config a run actually uses (attention override applied), validated against the run."""
    cfg = with_attention(cfg, attention)
    check_fits_model(cfg, spec)
    return cfg


def run_args(spec: TrainSpec) -> list[str]:
    """The command line's RUN options for this spec (`python -m planner measure|simulate train ...`): what the
    app passes to the child it starts, so the child runs exactly the settings on the screen."""
    args = ["--batch-size", str(spec.batch_size), "--seq-len", str(spec.seq_len), "--precision", spec.precision,
            "--optimizer", spec.optimizer, "--grad-accum", str(spec.grad_accum), "--optimizer-impl",
            spec.optimizer_impl, "--device", spec.device, "--loss", spec.loss]
    args += (["--checkpointing"] + ([spec.checkpoint_policy] if spec.checkpoint_policy != "full" else [])
             if spec.checkpointing else [])
    args += ["--train-layers", spec.train_layers] if spec.train_layers != "all" else []
    if spec.lora_r:
        args += ["--lora-r", str(spec.lora_r), "--lora-alpha", repr(spec.lora_alpha),
                 "--lora-dropout", repr(spec.lora_dropout)]
        args += ["--lora-targets", spec.lora_targets] if spec.lora_targets else []
    args += ["--quantize-base", spec.quantize_base] if spec.quantize_base != "none" else []
    args += ["--double-quant"] if spec.double_quant else []
    args += ["--offload-optimizer"] if getattr(spec, "offload_optimizer", False) else []
    args += ["--offload-activations"] if getattr(spec, "offload_activations", False) else []
    return args
