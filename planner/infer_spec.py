"""What one inference run is: the settings that, with the model config, decide the memory of generate() (no torch).

The run is transformers' `model.generate(input_ids, attention_mask=..., max_new_tokens=N, min_new_tokens=N,
do_sample=False)` on a batch of `batch_size` prompts of `prompt_len` tokens (greedy: every sequence makes all N
tokens), with the weights in `precision`, the attention kernel `attention` and the cache class `cache` chosen
the way transformers chooses it (`cache_implementation`); the book's GPT-2 runs its generate_text_simple (no
cache: the whole context is recomputed for every token). planner/routines/inference.py runs it;
planner/estimate/inference.py estimates it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .config import ConfigError, ModelConfig
from .spec import check_device

INFER_PRECISIONS = ("fp32", "fp16", "bf16")
# dynamic: DynamicCache (generate's default: one torch.cat per layer and token, cache_utils.py DynamicLayer);
# static: StaticCache (cache_implementation="static": max_length slots allocated at the first update);
# none: the book's GPT-2 (generate_text_simple keeps no cache).
# sliding: generate's default DynamicCache on a model whose config sets a sliding window: DynamicCache(config)
# gives every sliding layer a DynamicSlidingWindowLayer (cache_utils.py), which keeps the last window - 1 tokens;
# quantized: cache_implementation="quantized" with cache_config={"backend": "fp8"} (QuantizedCache's
# Fp8QuantizedLayer, transformers' own: float8_e4m3fn K/V and one fp32 scale per layer; planner/infer_caches.py);
# offloaded: cache_implementation="offloaded" (DynamicCache(offloading=True): each layer moved to the host after
# its update and prefetched back before the next layer's; CUDA only, planner/infer_caches.py).
CACHES = ("dynamic", "static", "sliding", "quantized", "offloaded")
BOOK_CACHES = ("none",)
# bitsandbytes' weight quantization as transformers applies it on from_pretrained(quantization_config=
# BitsAndBytesConfig(...)): int8 = load_in_8bit (LLM.int8, Linear8bitLt), nf4 / fp4 = load_in_4bit with
# bnb_4bit_quant_type (Linear4bit); planner/routines/inference.py loads it, planner/estimate/infer_quant.py counts it
WEIGHT_QUANT = ("none", "int8", "nf4", "fp4")
PRECISION_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class InferSpec:
    batch_size: int
    prompt_len: int
    new_tokens: int
    precision: str = "fp32"        # the weights' dtype (the model is built in it): fp32 | fp16 | bf16
    cache: str = "dynamic"         # dynamic | static | sliding | quantized | offloaded; none (the book's GPT-2)
    quantize_weights: str = "none"
    device: str = "cpu"
    double_quant: bool = False     # bnb_4bit_use_double_quant (nf4 / fp4 only; BitsAndBytesConfig's default False)

    def __post_init__(self) -> None:
        for name in ("batch_size", "prompt_len", "new_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{name} must be an integer, got {v!r}")
            if v <= 0:
                raise ConfigError(f"{name} must be positive, got {v}")
        if self.precision not in INFER_PRECISIONS:
            raise ConfigError(f"unknown inference precision {self.precision!r}; choose one of: "
                              f"{', '.join(INFER_PRECISIONS)}")
        if self.cache not in CACHES + BOOK_CACHES:
            raise ConfigError(f"unknown cache {self.cache!r}; choose one of: {', '.join(CACHES + BOOK_CACHES)}")
        if self.quantize_weights not in WEIGHT_QUANT:
            raise ConfigError(f"unknown --quantize-weights {self.quantize_weights!r}; "
                              f"choose one of: {', '.join(WEIGHT_QUANT)}")
        if self.double_quant and self.quantize_weights not in ("nf4", "fp4"):
            raise ConfigError("--double-quant quantizes the 4-bit weights' absmax (bnb_4bit_use_double_quant): "
                              "it needs --quantize-weights nf4 or fp4")
        check_device(self.device)

    @property
    def total_len(self) -> int:
        """The longest sequence the run reaches: the prompt and every new token (generate's max_length)."""
        return self.prompt_len + self.new_tokens

    @property
    def param_dtype(self) -> str:
        return PRECISION_DTYPE[self.precision]

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    def to_dict(self) -> dict:
        return asdict(self)


def default_cache(cfg: ModelConfig) -> str:
    """The cache a run gets when none is named: transformers' DynamicCache, or none for the book's GPT-2."""
    from .arch import family_of

    return family_of(cfg).infer_caches(cfg)[0]


def check_infer(cfg: ModelConfig, ispec: InferSpec) -> None:
    """Refuse a run the model cannot make (one-line ConfigError)."""
    from .arch import family_of

    family = family_of(cfg)
    if ispec.total_len > cfg.max_seq_len:
        raise ConfigError(f"prompt_len {ispec.prompt_len} + new_tokens {ispec.new_tokens} = {ispec.total_len} is "
                          f"longer than the model's context of {cfg.max_seq_len}")
    caches = family.infer_caches(cfg)
    if ispec.cache not in caches:
        why = {"sliding": " (its config sets no sliding window)",
               "quantized": " (transformers' QuantizedCache takes full-attention layers only)"}.get(ispec.cache, "")
        raise ConfigError(f"the {family.arch} model cannot use cache {ispec.cache!r}{why}; it can use: "
                          f"{', '.join(caches)}")
    family.check_infer(cfg, ispec)
    if ispec.quantize_weights != "none":
        from .infer_quant import check_quantized_infer

        check_quantized_infer(cfg, ispec)


def infer_args(ispec: InferSpec) -> list[str]:
    """The command line's options for this spec (`python -m planner measure|simulate infer ...`)."""
    return ["--batch-size", str(ispec.batch_size), "--prompt-len", str(ispec.prompt_len), "--new-tokens",
            str(ispec.new_tokens), "--precision", ispec.precision, "--cache", ispec.cache, "--device", ispec.device] + (
        ["--quantize-weights", ispec.quantize_weights] if ispec.quantize_weights != "none" else []) + (
        ["--double-quant"] if ispec.double_quant else [])
