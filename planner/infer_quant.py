"""Quantized weights for inference (issue #21): what bitsandbytes holds per quantized linear, and what a run
cannot do (no torch, no bitsandbytes import).

The load is transformers' `from_pretrained(quantization_config=BitsAndBytesConfig(...), dtype=D)`
(planner/routines/infer_quant.py): every nn.Linear but the output head (transformers' get_keys_to_not_convert)
becomes bitsandbytes' Linear8bitLt (int8) or Linear4bit (nf4 / fp4); everything else stays in D.

Bytes held per quantized (out x in) weight, n = out*in (bitsandbytes 0.50 functional.py / nn/modules.py):
  int8   Int8Params: the int8 weight (n) and SCB, one fp32 scale per output row (4*out).
  4-bit  Params4bit: two codes per uint8 ((n + 1) // 2) and its QuantState: absmax, one fp32 per 64-weight
         block (4*ceil(n/64)), the 16-entry fp32 code (64 B); with double quantization (compress_statistics)
         absmax is itself uint8 (ceil(n/64)) with state2: an fp32 absmax per 256 blocks, the 256-entry fp32
         dynamic code, and the fp32 offset (4 B).  (planner/bnb.py quantized_linear_bytes.)
  4-bit on a CPU with AVX512-BF16 (bitsandbytes' lib.has_avx512bf16_cpu, the CPUID flag Linux lists as
  avx512_bf16): the first eval forward repacks the weight for its CPU kernel (Linear4bit.forward,
  functional._convert_weight_packed_for_cpu): the packed weight keeps n/2 bytes (shape (out, in/2)), absmax
  becomes bf16 of shape (out, in/64) (2*n/64: double quantization is undone, state2 dropped; the 0-d offset
  stays on the QuantState) and the 16-entry fp32 code stays. Measured here on transformers' Llama after the
  first generate(): absmax (1, 64) bf16 for a 64x64 q_proj, state2 gone.
"""
from __future__ import annotations

from functools import lru_cache

from .bnb import BLOCKSIZE_4BIT  # Params4bit(blocksize=64); BitsAndBytesConfig's bnb_4bit_blocksize default
from .config import ConfigError

CODE_4BIT_BYTES = 16 * 4       # QuantState.code: get_4bit_type(nf4 | fp4), 16 fp32
CPU_PACK_BLOCK_N = 32          # functional._convert_weight_packed_for_cpu(block_n=32): out % 32 == 0
OFFSET_BYTES = 4               # the double-quantized absmax's fp32 offset (a 0-d tensor)


@lru_cache(maxsize=1)
def cpu_repacks_4bit() -> bool:
    """Whether bitsandbytes repacks 4-bit weights for its CPU kernel on this machine (the avx512_bf16 CPU
    flag; bitsandbytes asks CPUID for the same bit). Read from /proc/cpuinfo (Linux); False elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx512_bf16" in line.split() for line in f)
    except OSError:
        return False


def repacked(ispec) -> bool:
    """A 4-bit run on a CPU that repacks (the estimate is of the machine it runs on when --device cpu)."""
    return ispec.quantize_weights in ("nf4", "fp4") and ispec.device_type == "cpu" and cpu_repacks_4bit()


def quantized_weight_bytes(n_out: int, n_in: int, ispec) -> int:
    """One quantized weight and its statistics (module doc)."""
    n = n_out * n_in
    if ispec.quantize_weights == "int8":
        return n + 4 * n_out
    if repacked(ispec):
        return n // 2 + 2 * (n // BLOCKSIZE_4BIT) + CODE_4BIT_BYTES + (OFFSET_BYTES if ispec.double_quant else 0)
    from types import SimpleNamespace

    from .bnb import quantized_linear_bytes

    return quantized_linear_bytes(n_out, n_in, SimpleNamespace(quantize_base=ispec.quantize_weights,
                                                               double_quant=ispec.double_quant))


def quantized_linears(cfg):
    """The linears transformers' bitsandbytes quantizer replaces: all but the output head."""
    from .finetune import quantized_linears as q

    return q(cfg)


def check_quantized_infer(cfg, ispec) -> None:
    """One line for a quantized-weights run that cannot be made."""
    from .arch import family_of

    family = family_of(cfg)
    if family.source != "transformers":
        raise ConfigError(f"--quantize-weights loads the model with transformers' BitsAndBytesConfig; the "
                          f"{family.arch} model is not a transformers model")
    if repacked(ispec):
        bad = [lin for lin in quantized_linears(cfg)
               if lin.n_out % CPU_PACK_BLOCK_N or lin.n_in % BLOCKSIZE_4BIT]
        if bad:
            raise ConfigError(f"bitsandbytes' CPU 4-bit kernel (AVX512-BF16) needs out_features % "
                              f"{CPU_PACK_BLOCK_N} == 0 and in_features % {BLOCKSIZE_4BIT} == 0; {bad[0].module} "
                              f"is {bad[0].n_out} x {bad[0].n_in}")


def weights_bytes(cfg, ispec, e: int) -> tuple[int, int]:
    """(bytes of every weight with the quantized linears as bitsandbytes holds them, the quantized linears'
    count); the rest, biases included, in the run's dtype (e bytes). They depend on the model and the
    quantization only, not on the batch or the lengths: memoised (a slider move or a search asks again)."""
    key = (cfg, ispec.quantize_weights, ispec.double_quant, repacked(ispec), ispec.device_type, e)
    try:
        return _weights_bytes(*key)
    except TypeError:  # a config with a dict field (rope_scaling) is not hashable: counted each time
        return _weights_bytes.__wrapped__(*key)


@lru_cache(maxsize=64)
def _weights_bytes(cfg, quantize: str, double_quant: bool, is_repacked: bool, device_type: str,
                   e: int) -> tuple[int, int]:
    from types import SimpleNamespace

    from .accounting import param_count

    ispec = SimpleNamespace(quantize_weights=quantize, double_quant=double_quant, device_type=device_type)
    qlin = quantized_linears(cfg)
    total = param_count(cfg) * e
    for lin in qlin:
        total += quantized_weight_bytes(lin.n_out, lin.n_in, ispec) - lin.n_out * lin.n_in * e
    return total, len(qlin)
