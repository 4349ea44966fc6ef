"""QLoRA's base model (issue #12): the recipe its users run, in the measuring child (imports torch).

peft's QLoRA recipe (peft docs, "Quantization"; transformers' BitsAndBytesConfig):
  1. the checkpoint: the family's model built from the config in bf16 and written with save_pretrained
     (safetensors) to a temporary folder (the planner never downloads weights);
  2. AutoModelForCausalLM.from_pretrained(folder, quantization_config=BitsAndBytesConfig(...)): nf4 / fp4 =
     load_in_4bit, bnb_4bit_quant_type, bnb_4bit_compute_dtype=bf16, bnb_4bit_use_double_quant; int8 =
     load_in_8bit. Every nn.Linear but the output head becomes bnb's Linear4bit (Params4bit: uint8 packed
     weights of shape (out*in/2, 1) and a QuantState whose tensors are not parameters) or Linear8bitLt;
  3. peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False): freezes everything and
     casts every non-quantized bf16 parameter (norms, embeddings, head, biases) to fp32; with checkpointing the
     step then enables it as for every run (activation_checkpointing_enable, use_reentrant=False), which is
     what peft's use_gradient_checkpointing=True does through transformers' deprecated alias;
  4. get_peft_model(model, LoraConfig(...)) (planner/routines/training.py apply_finetuning).
"""
from __future__ import annotations

import tempfile

import torch

from ..arch import family_of
from ..config import ConfigError, ModelConfig
from ..spec import TrainSpec
from . import fake_mode_of


def require_bitsandbytes() -> None:
    """The measuring child's check (the estimate needs no bitsandbytes): ConfigError, one line."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError("--quantize-base needs bitsandbytes installed in the measuring environment "
                          "(pip install bitsandbytes); the estimate itself does not") from None


def quantization_config(spec: TrainSpec):
    from transformers import BitsAndBytesConfig

    if spec.quantize_base == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=spec.quantize_base,
                              bnb_4bit_compute_dtype=torch.bfloat16,
                              bnb_4bit_use_double_quant=spec.double_quant)


def load_quantized(cfg: ModelConfig, spec: TrainSpec, device: torch.device):
    """Steps 1-3 of the recipe; returns the prepared model (LoRA is applied by the caller)."""
    require_bitsandbytes()
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    family = family_of(cfg)
    model = family.build(cfg, device, "bfloat16")
    fake = fake_mode_of(model)
    if fake is not None:  # planner/measure/simulate.py: nothing to write or read
        model = _quantize_fake_model(model, spec, device)
    else:
        with tempfile.TemporaryDirectory(prefix="planner-qlora-") as folder:
            model.save_pretrained(folder, safe_serialization=True)
            del model
            model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quantization_config(spec),
                                                         dtype=torch.bfloat16, attn_implementation=cfg.attention,
                                                         device_map=str(device))
    model.train()
    # Checkpointing is enabled by the caller as for every other run (family.enable_checkpointing:
    # transformers' activation_checkpointing_enable, non-reentrant). prepare_model_for_kbit_training would call
    # the deprecated gradient_checkpointing_enable alias (peft 0.21, utils/other.py) with the same kwargs and,
    # with use_reentrant=False, nothing else: the same model, without transformers' FutureWarning.
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def quant_state_tensors(model) -> list[torch.Tensor]:
    """The tensors bitsandbytes keeps beside the packed weights, which model.parameters() does not list:
    each Params4bit's QuantState (bitsandbytes/functional.py QuantState: absmax, code, and with double
    quantization offset and state2's absmax and code) and each int8 weight's SCB (fp32 row scales: on
    Int8Params until the first forward, then on the module's MatmulLtState, Linear8bitLt.init_8bit_state)."""
    out = []
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            out += [qs.absmax, qs.code]
            if getattr(qs, "nested", False):
                out += [qs.offset, qs.state2.absmax, qs.state2.code]
        out.append(getattr(p, "SCB", None))
    for m in model.modules():
        state = getattr(m, "state", None)
        if type(state).__name__ == "MatmulLtState":
            out += [state.SCB, state.CB]  # CB is the weight's own int8 data (one storage, counted once)
    return [t for t in out if isinstance(t, torch.Tensor)]


def _quantize_fake_model(model, spec: TrainSpec, device: torch.device, compute_dtype=torch.bfloat16):
    """The simulated twin of step 2 (planner/measure/simulate.py builds the bf16 model on fake tensors; a fake
    checkpoint cannot be written): what transformers' bitsandbytes quantizer does on from_pretrained, done
    in place. Every nn.Linear (and transformers' Conv1D, GPT-2's, transposed to (out, in) as transformers'
    quantizer does) but the output head (transformers' get_keys_to_not_convert) becomes a
    bitsandbytes Linear4bit(in, out, bias, compute_dtype=bf16, compress_statistics=double_quant, quant_type),
    its bf16 weight quantized by bitsandbytes' own functional.quantize_4bit (its quantize_4bit /
    quantize_blockwise ops have fake kernels, bitsandbytes/_ops.py register_fake): the packed weight and a
    QuantState of the real shapes and dtypes.
    Two things differ from the real model, neither in what is held:
      - the packed weight is an nn.Parameter carrying `quant_state` (and Params4bit's other attributes),
        not a Params4bit: Params4bit.__new__ is torch.Tensor._make_subclass(cls, data), which refuses a
        FakeTensor ("the raw Tensor object is already associated to a python object of type FakeTensor");
        Linear4bit.forward and MatMul4Bit read only `weight.quant_state` and the packed data;
      - double quantization's 256-entry dynamic code (functional.create_dynamic_map, cached in
        functional.name2qmap) is computed with `.tolist()`, a data-dependent read: it is made once outside
        the fake mode (a real 1 KiB tensor; each QuantState keeps its own copy, `code.to(copy=True)`).
    The model is marked is_loaded_in_4bit, as from_pretrained marks it (peft reads it). compute_dtype is
    bnb_4bit_compute_dtype (QLoRA's recipe: bf16; inference, planner/routines/infer_quant.py: the weights')."""
    if spec.quantize_base == "int8":
        raise ConfigError("simulating --quantize-base int8 is not supported yet (Int8Params, like Params4bit, "
                          "cannot wrap a fake tensor, and its quantization path is not checked); use nf4 or fp4")
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if spec.double_quant and "dynamic" not in bnbf.name2qmap:
        with unset_fake_temporarily():
            bnbf.name2qmap["dynamic"] = bnbf.create_dynamic_map().to(device)
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            conv1d = isinstance(child, Conv1D)
            if (type(child) is not torch.nn.Linear and not conv1d) or child is head:
                continue
            # transformers' replace_with_bnb_linear (integrations/bitsandbytes.py) takes GPT-2's Conv1D too: its
            # weight is (in, out), so in, out = weight.shape, and the quantizer transposes it to (out, in) first
            n_in, n_out = child.weight.shape if conv1d else (child.in_features, child.out_features)
            with unset_fake_temporarily():  # an empty shell on the meta device (no memory, no fake)
                new = bnb.nn.Linear4bit(n_in, n_out, bias=child.bias is not None,
                                        compute_dtype=compute_dtype, compress_statistics=spec.double_quant,
                                        quant_type=spec.quantize_base, device="meta")
            new.source_cls = type(child)  # as transformers marks it (it decides the transpose on load)
            w = child.weight.data.T if conv1d else child.weight.data
            packed, state = bnbf.quantize_4bit(w.to(device), blocksize=64,
                                               compress_statistics=spec.double_quant,
                                               quant_type=spec.quantize_base, quant_storage=torch.uint8)
            weight = torch.nn.Parameter(packed, requires_grad=False)
            weight.quant_state, weight.blocksize, weight.quant_type = state, 64, spec.quantize_base
            weight.compress_statistics, weight.quant_storage, weight.bnb_quantized = spec.double_quant, torch.uint8, True
            weight.module = new
            new.weight = weight
            new.quant_state = state
            if child.bias is not None:
                new.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, new)
    model.is_loaded_in_4bit = True
    return model
