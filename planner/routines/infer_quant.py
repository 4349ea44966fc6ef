"""Quantized weights for inference (issue #21): the model loaded the way its users load it (imports torch).

    AutoModelForCausalLM.from_pretrained(folder, quantization_config=BitsAndBytesConfig(...), dtype=D,
                                         attn_implementation=..., device_map=device)

with D the run's precision, int8 = `BitsAndBytesConfig(load_in_8bit=True)` (Linear8bitLt, LLM.int8 with its
default outlier threshold 6.0) and nf4 / fp4 = `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q,
bnb_4bit_compute_dtype=D, bnb_4bit_use_double_quant=dq)` (Linear4bit). The compute dtype is the weights' dtype,
as transformers' quantization docs load a model for inference (`bnb_4bit_compute_dtype=torch.bfloat16` beside
`torch_dtype=torch.bfloat16`): every non-quantized tensor (embeddings, norms, the head, biases) stays in D and
Linear4bit's casts of its input and output are no-ops. The checkpoint is the family's model built from the
config in D and written with save_pretrained to a temporary folder (the planner never downloads weights).
No peft preparation: this is inference, nothing is cast to fp32.

On fake tensors (simulate) a checkpoint cannot be written: the bitsandbytes quantizer's replacement is done in
place by planner/routines/quantized.py _quantize_fake_model (4-bit only; Int8Params cannot wrap a fake tensor).
"""
from __future__ import annotations

import tempfile
from types import SimpleNamespace

import torch

from ..arch import family_of
from ..config import ConfigError, ModelConfig
from ..infer_spec import InferSpec
from . import fake_mode_of


def quantization_config(ispec: InferSpec):
    from transformers import BitsAndBytesConfig

    if ispec.quantize_weights == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=ispec.quantize_weights,
                              bnb_4bit_compute_dtype=getattr(torch, ispec.param_dtype),
                              bnb_4bit_use_double_quant=ispec.double_quant)


def load_quantized_for_inference(cfg: ModelConfig, ispec: InferSpec, device: torch.device):
    try:
        import bitsandbytes  # noqa: F401  (pyflakes: the import is the check)
    except ImportError:
        raise ConfigError("--quantize-weights needs bitsandbytes installed in the measuring environment "
                          "(pip install bitsandbytes); the estimate itself does not") from None
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    dtype = getattr(torch, ispec.param_dtype)
    model = family_of(cfg).build(cfg, device, ispec.param_dtype)
    if fake_mode_of(model) is not None:
        if ispec.quantize_weights == "int8":
            raise ConfigError("simulating --quantize-weights int8 is not supported (bitsandbytes' Int8Params "
                              "cannot wrap a fake tensor); measure it, or simulate nf4 / fp4")
        from .quantized import _quantize_fake_model

        spec = SimpleNamespace(quantize_base=ispec.quantize_weights, double_quant=ispec.double_quant)
        return _quantize_fake_model(model, spec, device, compute_dtype=dtype)
    with tempfile.TemporaryDirectory(prefix="planner-infer-q-") as folder:
        model.save_pretrained(folder, safe_serialization=True)
        del model
        return AutoModelForCausalLM.from_pretrained(folder, quantization_config=quantization_config(ispec),
                                                    dtype=dtype, attn_implementation=cfg.attention,
                                                    device_map=str(device))


def quant_state_tensors(model) -> list[torch.Tensor]:
    """Every tensor bitsandbytes keeps beside the quantized weights, which model.parameters() does not list:
    each 4-bit weight's QuantState (bitsandbytes/functional.py: absmax, code, and with double quantization
    offset and state2's absmax and code, whatever of these it holds now: on a CPU with AVX512-BF16 the first
    eval forward repacks it, functional._convert_weight_packed_for_cpu) and each int8 weight's SCB (on
    Int8Params, then on the module's MatmulLtState with CB, the weight's own storage)."""
    out = []

    def state_tensors(qs):
        for v in vars(qs).values():
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif type(v).__name__ == "QuantState":
                state_tensors(v)

    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            state_tensors(qs)
        out.append(getattr(p, "SCB", None))
    for m in model.modules():
        state = getattr(m, "state", None)
        if type(state).__name__ == "MatmulLtState":
            out += [state.SCB, state.CB]
    return [t for t in out if isinstance(t, torch.Tensor)]
