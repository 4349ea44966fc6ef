"""QLoRA (issue #12): LoRA on a base whose linear layers bitsandbytes quantized (no torch, no bitsandbytes).

The run (planner/routines/quantized.py) is peft's recipe: from_pretrained(quantization_config=
BitsAndBytesConfig(load_in_4bit, bnb_4bit_quant_type, bnb_4bit_compute_dtype=bf16, ...)), then
prepare_model_for_kbit_training (peft/utils/other.py), which casts every parameter that is bf16 and not a
Params4bit to fp32: the embeddings, the norms, the output head (transformers never quantizes the output
embedding: get_keys_to_not_convert) and the biases. So the residual stream, every norm, attention and
the loss run in fp32, exactly as on an fp32 base; each quantized linear (bitsandbytes/nn/modules.py
Linear4bit.forward) casts its fp32 input to the compute dtype, multiplies by the dequantized weight
(MatMul4Bit, bitsandbytes/autograd/_functions.py: it saves only the packed weight, never the input) and
casts its bf16 output back to fp32. peft's adapters (peft/tuners/lora/bnb.py Linear4bit.forward) read
the fp32 input, as on an fp32 base.

Hence: the step's saved set and phases are those of the same LoRA run on an fp32 base
(planner/estimate/finetune.py, on `fp32_twin(spec)`), with
  - the weights: each quantized linear's packed storage and quantization statistics instead of its fp32
    weight (quantized_linear_bytes), a bias in the compute dtype (Linear4bit.forward re-assigns
    `bias.data = bias.data.to(x.dtype)` on the first forward, so it is bf16 in every later step);
  - the backward's high points at a quantized linear's input-grad matmul, where the weight is dequantized
    (dequant_points: down_proj, up_proj, gate_proj, q_proj), measured on the op timeline. The forward's
    bf16 casts (b*s*in and b*s*out in bf16 beside the fp32 output) were not a high point on the grid. What a
    custom bitsandbytes op does inside (the forward's gemm_4bit dequantizes the weight and then multiplies)
    is one op to a dispatch-level tracker: only its output is seen, so that out*in bf16 transient is in
    neither the measured nor the estimated figure (the backward's, made by a separate dequantize_4bit
    call, is in both).
"""
from __future__ import annotations

import dataclasses

from ..arch import family_of
from ..bnb import quantized_linear_bytes
from ..config import ConfigError
from ..finetune import quantized_linears
from .finetune import estimate_finetune, finetune_activations
from .finetune import known_gap as twin_gap
from . import step

COMPUTE_BYTES = 2          # bnb_4bit_compute_dtype bf16 (planner/routines/quantized.py quantization_config)


def fp32_twin(spec):
    """The same run on an fp32 base: what a QLoRA step holds besides its weights (see the module doc)."""
    return dataclasses.replace(spec, precision="fp32", quantize_base="none", double_quant=False)


def weights_delta(cfg, spec) -> int:
    """Bytes the quantized base holds less than its fp32 twin: each quantized linear's fp32 weight (out*in*4)
    becomes quantized_linear_bytes, and its bias (fp32 after prepare_model_for_kbit_training) is cast to the
    compute dtype by Linear4bit.forward (the int8 Linear8bitLt.forward casts it to its input's, fp32)."""
    delta = 0
    for lin in quantized_linears(cfg):
        delta += lin.n_out * lin.n_in * 4 - quantized_linear_bytes(lin.n_out, lin.n_in, spec)
        if lin.bias and spec.quantize_base != "int8":
            delta += lin.n_out * (4 - COMPUTE_BYTES)
    return delta


def check_supported(cfg, spec) -> None:
    if spec.quantize_base == "int8":
        raise ConfigError("--quantize-base int8 is not estimated yet (bitsandbytes' Linear8bitLt trains through "
                          "MatMul8bitFp on the CPU, which keeps each linear's fp32 input and dequantizes the weight to "
                          "fp32 in forward and backward; the measuring child runs it); use nf4 or fp4")
    family = family_of(cfg)
    if not (family.lora_supported and family.qlora_supported and family.source == "transformers"):
        raise ConfigError(f"QLoRA is estimated for transformers' decoders with LoRA so far, not {family.arch}")


def dequant_points(cfg, spec, twin) -> dict[str, int]:
    """The backward's high points at a quantized linear's input-grad matmul (MatMul4Bit.backward:
    `torch.matmul(grad_output, F.dequantize_4bit(B, state).to(grad_output.dtype))`): the dequantized weight
    (out*in in the compute dtype), the output's grad cast to the compute dtype (b*s*out*2) and the new input
    grad (b*s*in*2, cast back to fp32 by the input cast's backward once the weight is freed). Each point is
    the fp32 twin's point at the same moment (planner/arch/decoder.py block_points), where the output's grad
    and the input grad are fp32 and no weight is made, with those swapped in; measured on the op timeline
    (bitsandbytes.dequantize_4bit then aten.mm) of Llama / Qwen2 steps. Only where the linear's input needs
    grad (otherwise MatMul4Bit makes no autograd node): the MLP input (the post-attention norm saved its fp32
    input), the product (the activation saved its input), the attention input (the input norm did)."""
    from .activations import Widths

    family = family_of(cfg)
    sh = family.shape(cfg)
    b, s, h, f, ad = spec.batch_size, spec.seq_len, sh.h, sh.f, sh.a * sh.d
    spec32 = fp32_twin(spec)
    w = Widths.of(spec32, loss_upcast=family.loss_upcast(cfg, spec32))
    _, _, per_block = finetune_activations(cfg, spec32, w)
    points = {}
    for i, blk in enumerate(per_block):
        fp32_in = lambda part: any(t.part == part and "fp32 input" in t.name for t in blk)
        prod_rg = any(t.where == "mlp" and ("saved input" in t.name or t.part in ("mlp.act_out", "mlp.up_out"))
                      for t in blk)
        at = lambda name: twin.backward_points.get(f"block {i} {name}")
        if prod_rg and at("ffn") is not None:
            # down_proj, the block's first backward op: the twin's activation-backward point less its two
            # fp32 b*s*f grads, with the dequantized f*h weight, the bf16 b*s*f input grad and the bf16
            # b*s*h output grad. With checkpointing and no adapter on down_proj, nothing down_proj's
            # backward unpacks is a saved tensor (MatMul4Bit keeps the packed weight on ctx), so the block's
            # recompute has not run yet: its recomputed saved set is not alive there (measured; the block's
            # stashed input, 4*b*s*h, excepted). With an adapter with dropout on down_proj, the
            # adapter's backward, which runs first, has freed one b*s*f fp32 tensor of the twin's point (measured)
            before_recompute = spec.checkpointing and not any(t.part == "mlp.out" for t in blk)
            dropout_down = spec.lora_dropout > 0 and any(t.name.startswith(("down_proj LoRA", "down_proj lora_A"))
                                                         for t in blk)
            points[f"block {i} down_proj dequantized"] = (
                at("ffn") - 8 * b * s * f + COMPUTE_BYTES * (f * h + b * s * f + b * s * h)
                - (sum(t.bytes for t in blk) - 4 * b * s * h if before_recompute else 0)
                - (4 * b * s * f if dropout_down else 0))
        up_adapted = any(t.name.startswith(("up_proj LoRA", "up_proj lora_A")) for t in blk)  # _adapter's terms
        if fp32_in("norm.mlp") and not up_adapted and at("gated product backward") is not None:
            # up_proj (the first MLP input projection backward meets, right after the gated product's
            # backward) when it has no adapter: the twin's product-backward point with the dequantized f*h
            # weight, less 14*b*s*f and plus 2*b*s*h (fitted on the op timelines of Llama / Qwen2 steps,
            # b*s 4 and 16, f 384 and 512, with and without checkpointing: exact to 8 B); with an adapter
            # on up_proj it was measured below down_proj's point
            points[f"block {i} up_proj dequantized"] = (at("gated product backward") + COMPUTE_BYTES * f * h
                                                        - 14 * b * s * f + 2 * b * s * h)
        if fp32_in("norm.mlp") and at("mlp_in") is not None:
            # gate_proj (the last MLP input projection backward meets): the twin's mlp_in point with its fp32
            # output grad and input grad in bf16, the dequantized weight, and no fp32 b*s*h grad of up's
            # input beside it (measured: 4*b*s*h below the twin's)
            points[f"block {i} gate_proj dequantized"] = (at("mlp_in") - 2 * b * s * (f + h) - 4 * b * s * h
                                                          + COMPUTE_BYTES * f * h)
        if fp32_in("norm.attn") and at("attn_in") is not None:
            # q_proj (the last attention input projection backward meets), likewise from the twin's attn_in
            # (measured up to 0.05*b*s*h above; o_proj's, at the attention's backward start, is not modelled)
            points[f"block {i} q_proj dequantized"] = (at("attn_in") - 2 * b * s * (ad + h) - 4 * b * s * h
                                                       + COMPUTE_BYTES * ad * h)
    return points


def estimate_quantized(cfg, spec):
    """The QLoRA step: its fp32 twin's estimate with the quantized weights and the dequantized weights'
    backward points (module doc)."""
    check_supported(cfg, spec)
    twin = estimate_finetune(cfg, fp32_twin(spec), quantized=True)
    delta = weights_delta(cfg, spec)
    base = twin.params_bytes + twin.buffers_bytes + twin.inputs_bytes + twin.optimizer_bytes  # the twin's
    points = dequant_points(cfg, spec, twin)
    # the twin's phases (planner/estimate/step.py) with the dequantized weights' backward points, less the
    # weights the quantization saves in every phase
    phase = step.shifted(twin.phase_peak_bytes, backward_at_least=(base + max(points.values(), default=0),))
    phase = step.shifted(phase, every=-delta)
    peak_phase = step.peak(phase)[0]
    notes = [f"QLoRA: {len(quantized_linears(cfg))} linears quantized to {spec.quantize_base}"
             + (" with double quantization" if spec.double_quant else "") + " (bitsandbytes), compute dtype bf16; "
             "norms, embeddings and the head fp32 (prepare_model_for_kbit_training)"] + twin.notes
    return dataclasses.replace(twin, params_bytes=twin.params_bytes - delta, peak_bytes=phase[peak_phase],
                               peak_phase=peak_phase, phase_peak_bytes=phase, notes=notes,
                               backward_points={**twin.backward_points, **points})


def known_gap(cfg, spec) -> str | None:
    """A QLoRA combination this estimate is known to miss by more than FINETUNE_QUANT_BAR_PCT, or None."""
    return twin_gap(cfg, fp32_twin(spec))
