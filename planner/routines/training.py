"""The real training step the planner measures (runs in a child process).

One step = for each micro-batch: forward + loss and backward; then optimizer.step() and zero_grad()
(set_to_none, PyTorch's default). The loss is the model's users' (planner/arch/<family>.py `loss`):
transformers' models `model(input_ids=x, labels=y).loss`, or with `loss="cross-entropy"` the book's
cross-entropy over the returned logits; the book's GPT-2 its `calc_loss_batch`. Either way the logits
die before backward.
Precision modes: fp32; fp16-amp (autocast fp16 + GradScaler); bf16-amp (autocast bf16); bf16
(weights, grads and optimizer states all bf16).
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Callable

import torch

from ..arch import family_of
from ..arch.base import resolved_loss
from ..config import ModelConfig
from ..models import TORCH_DTYPES
from ..spec import TrainSpec
from . import build_model, fake_mode_of

# Hyper-parameters do not change memory; these are the book's ch05 AdamW settings and common defaults.
LEARNING_RATE = 4e-4
WEIGHT_DECAY = 0.1
MOMENTUM = 0.9


def make_optimizer(params, spec: TrainSpec) -> torch.optim.Optimizer:
    if spec.optimizer in BNB_CLASSES:
        return make_bnb_optimizer(params, spec)
    impl = spec.resolved_optimizer_impl
    kw = {"foreach": True} if impl == "foreach" else {"foreach": False} if impl == "for-loop" else {"fused": True}
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATE, **kw)
    if spec.optimizer == "sgd-momentum":
        return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=MOMENTUM, **kw)
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=LEARNING_RATE, **kw)
    return torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, **kw)


# bitsandbytes' optimizers (planner/estimate/bnb_optim.py): --optimizer name -> bnb.optim class name.
BNB_CLASSES = {"adamw-8bit": "AdamW8bit", "paged-adamw-8bit": "PagedAdamW8bit", "paged-adamw": "PagedAdamW"}


def make_bnb_optimizer(params, spec: TrainSpec) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW8bit / PagedAdamW8bit / PagedAdamW with the AdamW settings above (betas and eps are
    both libraries' defaults, (0.9, 0.999) and 1e-8; min_8bit_size stays bitsandbytes' 4096)."""
    import bitsandbytes as bnb
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    make = getattr(bnb.optim, BNB_CLASSES[spec.optimizer])
    params = list(params)
    fake = next((p.fake_mode for p in params if isinstance(p, FakeTensor)), None)
    if fake is None:
        return make(params, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    # A simulated step (planner/measure/simulate.py): Optimizer8bit.__init__ builds its quantization maps from Python
    # lists (functional.create_dynamic_map reads torch.linspace(...).tolist()), which fake tensors cannot
    # answer. So it is built with fake tensors off, and its two maps are replaced by fake tensors of the same
    # shape, dtype and device: the step holds what the real one holds.
    with unset_fake_temporarily():
        opt = make(params, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    with fake:
        opt.name2qmap = {k: torch.empty(v.shape, dtype=v.dtype, device=v.device) for k, v in opt.name2qmap.items()}
    return opt


def _optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Every state tensor of the optimizer: its per-parameter state, and bitsandbytes' quantization maps, made
    once in Optimizer8bit.__init__ (name2qmap) and shared by every 8-bit parameter's qmap1 / qmap2."""
    out = [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return out + [v for v in getattr(optimizer, "name2qmap", {}).values() if isinstance(v, torch.Tensor)]


def apply_finetuning(model, cfg: ModelConfig, spec: TrainSpec):
    """Freeze what does not train (planner/finetune.py: the family inventory's roles decide, by the names
    the inventory shares with the model), or wrap the model with peft's LoRA as its users do:
    get_peft_model(model, LoraConfig(...)) after checkpointing is enabled (peft then calls
    enable_input_require_grads itself; transformers' activation_checkpointing_enable already has).
    peft's defaults stay: autocast_adapter_dtype=True keeps the adapters fp32 on a bf16/fp16 base."""
    from ..finetune import lora_target_names, trainable_names

    family = family_of(cfg)
    if spec.lora_r:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                            target_modules=list(lora_target_names(family, cfg, spec)), bias="none",
                            # a custom nn.Module (the book's GPT-2) has no transformers conventions: plain PeftModel
                            task_type="CAUSAL_LM" if family.source == "transformers" else None)
        fake = fake_mode_of(model)
        with warnings.catch_warnings():
            # peft 0.21's PeftModel.__init__ reads transformers' deprecated `is_gradient_checkpointing`
            # (peft_model.py); the model's checkpointing was enabled with activation_checkpointing_enable
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
            if fake is None:
                return get_peft_model(model, config)
            return _peft_on_fake_model(model, config, fake)
    keep = trainable_names(family, cfg, spec)
    for name, p in model.named_parameters():
        p.requires_grad_(name in keep)
    return model


def _peft_on_fake_model(model, config, fake_mode):
    """peft on a simulated model: peft moves each new adapter to its base layer's device and dtype, and then
    back to fp32 (autocast_adapter_dtype) with Module.to, which swaps a FakeTensor parameter in place, and
    the swap is refused for a tensor the fake mode's converter keeps a weak reference to ("Couldn't swap
    Linear.weight"). So peft runs with fake tensors off (the adapters are made real: r*(in + out) values
    each), and every real adapter parameter is then replaced by a fake one of the same shape, dtype,
    device and requires_grad: what the step holds is what the real step holds."""
    from peft import get_peft_model
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    with unset_fake_temporarily():
        wrapped = get_peft_model(model, config)
    with fake_mode:
        for module in wrapped.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                if not isinstance(p, FakeTensor):
                    setattr(module, name, torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=p.device),
                                                             requires_grad=p.requires_grad))
    return wrapped


class TrainingStep:
    """Model, optimizer and one fixed batch; `run()` performs one full optimizer step."""

    def __init__(self, cfg: ModelConfig, spec: TrainSpec, seed: int = 0):
        torch.manual_seed(seed)
        self.cfg, self.spec = cfg, spec
        self.device = torch.device(spec.device)
        self.family = family_of(cfg)
        self.loss_kind = resolved_loss(self.family, spec)
        if spec.quantize_base != "none":  # QLoRA: the recipe's quantized, prepared base (routines/quantized.py)
            from .quantized import load_quantized

            self.model = load_quantized(cfg, spec, self.device)
        else:
            self.model = build_model(cfg, self.device, spec.param_dtype)
        self.model.train()
        from ..estimate.offload import refuse_run

        refuse_run(spec)  # --offload-optimizer: the combinations the estimate refuses (planner/estimate/offload.py)
        if spec.checkpointing:  # the policy: planner/checkpointing.py (full is the family's own)
            from .checkpointing import enable_policy

            enable_policy(self.family, self.model, getattr(spec, "checkpoint_policy", "full"))
        if spec.finetuning:
            self.model = apply_finetuning(self.model, cfg, spec)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if getattr(spec, "offload_optimizer", False):  # torchao's CPUOffloadOptimizer, plain torch on the CPU
            from .offload_optim import HostOffloadAdamW

            adamw = spec.optimizer == "adamw"  # planner/estimate/offload.py allows adam / adamw only
            self.optimizer = HostOffloadAdamW(trainable, torch.optim.AdamW if adamw else torch.optim.Adam,
                                              lr=LEARNING_RATE, **({"weight_decay": WEIGHT_DECAY} if adamw else {}))
        else:
            self.optimizer = make_optimizer(trainable, spec)
        self.scaler = torch.amp.GradScaler(spec.device_type) if spec.precision == "fp16-amp" else None
        self.inputs = torch.randint(0, cfg.vocab_size, (spec.batch_size, spec.seq_len), device=self.device)
        self.targets = torch.randint(0, cfg.vocab_size, (spec.batch_size, spec.seq_len), device=self.device)
        self.current_phase = "setup"
        # --offload-activations: a context the tracker puts around save_on_cpu's pack hook (planner/measure/tracker.py
        # host_scope) so the host copies are counted apart; None: the hook runs as torch wrote it
        self.pack_scope = None

    def offload_context(self):
        """The forward as users write it: `with torch.autograd.graph.save_on_cpu(pin_memory=True):` (torch/autograd/
        graph.py). Its pack hook makes a fresh host tensor `torch.empty(size, dtype, pin_memory=is_pinnable)` and
        `copy_`s every saved tensor into it (pin_memory=False would call `tensor.cpu()`, which on a CPU tensor
        returns the tensor itself: no copy); its unpack hook returns `packed.to(device)`: on a CPU device the host
        copy itself, on CUDA a fresh device copy for the node's backward."""
        if not getattr(self.spec, "offload_activations", False):
            return nullcontext()
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=True)
        scope = self.pack_scope
        if scope is not None:
            pack = ctx.pack_hook

            def tagged_pack(tensor):
                with scope():
                    return pack(tensor)
            ctx.pack_hook = tagged_pack
        return ctx

    def autocast(self):
        if self.spec.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.spec.device_type, dtype=TORCH_DTYPES[self.spec.autocast_dtype])

    def compute_loss(self, on_phase: Callable[[str], None]) -> torch.Tensor:
        """Forward and loss of one micro-batch (planner.routines.user_module trains a user's module and loss)."""
        return self.family.loss(self.model, self.inputs, self.targets, self.loss_kind, on_phase)

    def run(self, on_phase: Callable[[str], None] = lambda phase: None) -> float:
        accum = self.spec.grad_accum
        total = 0.0
        user_on_phase = on_phase

        def on_phase(phase: str) -> None:  # remember where we are, so an out-of-memory can say so
            self.current_phase = phase
            user_on_phase(phase)
        for _ in range(accum):
            on_phase("forward")
            with self.offload_context(), self.autocast():
                loss = self.compute_loss(on_phase)
            on_phase("backward")
            loss = loss / accum if accum > 1 else loss
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total += loss.item()
            del loss
        on_phase("optimizer")
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        on_phase("zero_grad")
        self.optimizer.zero_grad()
        on_phase("done")
        return total

    def persistent_tensors(self) -> list[torch.Tensor]:
        """What lives across steps: weights, buffers, the batch, optimizer and GradScaler state."""
        out = list(self.model.parameters()) + list(self.model.buffers()) + [self.inputs, self.targets]
        if self.spec.quantize_base != "none":  # bitsandbytes' quantization statistics (not parameters)
            from .quantized import quant_state_tensors

            out += quant_state_tensors(self.model)
        out += _optimizer_tensors(self.optimizer)
        if self.scaler is not None:
            out += [t for t in (self.scaler._scale, self.scaler._growth_tracker) if t is not None]
        return out

    def host_tensors(self) -> list[torch.Tensor]:
        """--offload-optimizer: what lives on the host (planner/routines/offload_optim.py), counted apart."""
        return self.optimizer.host_tensors() if hasattr(self.optimizer, "host_tensors") else []

    def optimizer_state_bytes(self) -> int:
        """Bytes of the distinct storages of the optimizer's state (a shared tensor, as bitsandbytes' qmaps,
        counts once), without bitsandbytes' paged buffers (CUDA unified memory, outside the allocator)."""
        storages = {}
        for v in _optimizer_tensors(self.optimizer):
            if not getattr(v, "is_paged", False):
                storage = v.untyped_storage()
                storages[id(storage)] = storage
        return sum(st.nbytes() for st in storages.values())
