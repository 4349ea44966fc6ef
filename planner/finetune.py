"""Fine-tuning settings (issue #12): which parameters train, and LoRA adapters (no torch, no peft).

Both sides read this: the estimator (planner/estimate/training.py) walks the family's inventory roles
through it, and the measuring child (planner/routines/training.py) freezes the same parameters by the
same names, or hands the same targets to peft's LoraConfig.

train_layers
  all      every parameter trains (the default)
  head     the output projection and the final norm (roles head, norm.final); a tied head is the input
           embedding itself, so it is refused there (training it trains the embedding: use last:N)
  last:N   the last N blocks, the final norm and an untied output projection (a tied head stays frozen)

LoRA (peft 0.21 LoraConfig(r, lora_alpha, lora_dropout, target_modules, bias="none")): the base model is
frozen; each targeted nn.Linear gets lora_A (in -> r, no bias) and lora_B (r -> out, no bias), trainable,
r*(in + out) parameters (peft/tuners/lora/layer.py update_layer). targets: "" = peft's default for the
model type (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, copied into each
family's `lora_default_targets`), "all-linear" = every linear layer but the output head (peft's
INCLUDE_LINEAR_LAYERS_SHORTHAND), or comma-separated module names matched as peft does (the name's last
component).
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import ConfigError

ALL_LINEAR = "all-linear"


def check_train_layers(value: str) -> None:
    if value in ("all", "head"):
        return
    if isinstance(value, str) and value.startswith("last:"):
        n = value[5:]
        if n.isdigit() and int(n) > 0:
            return
    raise ConfigError(f"train_layers must be all, head or last:N with N > 0, got {value!r}")


def check_lora_settings(spec) -> None:
    """Checks that need no model (the targets are checked against the model in check_lora_targets)."""
    if isinstance(spec.lora_r, bool) or not isinstance(spec.lora_r, int):
        raise ConfigError(f"lora_r must be an integer, got {spec.lora_r!r}")
    if spec.lora_r < 0:
        raise ConfigError(f"lora r must be positive, got {spec.lora_r}")
    if not spec.lora_r:
        return
    if not 0.0 <= spec.lora_dropout < 1.0:
        raise ConfigError(f"lora_dropout must be in [0, 1), got {spec.lora_dropout}")
    if spec.train_layers != "all":
        raise ConfigError("LoRA freezes the base model: give either --lora-r or --train-layers, not both")


QUANTIZE_BASE = ("none", "nf4", "fp4", "int8")


def check_quantize_settings(spec) -> None:
    """QLoRA's settings (TrainSpec.quantize_base, double_quant): quantized weights cannot train, so LoRA is
    required; bitsandbytes computes in bnb_4bit_compute_dtype, which is the run's bf16."""
    q = getattr(spec, "quantize_base", "none")
    if q not in QUANTIZE_BASE:
        raise ConfigError(f"unknown quantize_base {q!r}; choose one of: {', '.join(QUANTIZE_BASE)}")
    if not isinstance(spec.double_quant, bool):
        raise ConfigError(f"double_quant must be true or false, got {spec.double_quant!r}")
    if q == "none":
        if spec.double_quant:
            raise ConfigError("--double-quant needs --quantize-base nf4|fp4")
        return
    if not spec.lora_r:
        raise ConfigError(f"--quantize-base {q} needs --lora-r R: quantized weights cannot train (QLoRA trains "
                          "LoRA adapters on the frozen quantized base)")
    if spec.double_quant and q == "int8":
        raise ConfigError("--double-quant applies to 4-bit bases (nf4, fp4), not int8")
    if spec.precision != "bf16":
        raise ConfigError(f"--quantize-base {q} computes in bf16 (bnb_4bit_compute_dtype, the QLoRA recipe): "
                          f"use --precision bf16, not {spec.precision}")


def check_quantize_runnable(spec) -> None:
    """A QLoRA run that is measured or simulated needs bitsandbytes (the estimate does not)."""
    from .bnb import bnb_available  # the one check (found without importing it)

    if getattr(spec, "quantize_base", "none") != "none" and not bnb_available():
        raise ConfigError(f"--quantize-base {spec.quantize_base} needs bitsandbytes to measure or simulate "
                          "(pip install bitsandbytes); the estimate alone does not")


@dataclass(frozen=True)
class Linear:
    """One nn.Linear of the model, from the family inventory (weight shape (out, in))."""
    module: str          # its module path (the weight's name without ".weight")
    n_in: int
    n_out: int
    block: int | None
    role: str
    bias: bool

    @property
    def short(self) -> str:
        # an nn.Sequential child is named by its index ("ff.layers.0" in the book's GPT-2): the index alone
        # would also match a block ("trf_blocks.0") by peft's suffix match (peft/tuners/tuners_utils.py
        # check_target_module_exists: key == target or key.endswith("." + target)), so keep its parent's name
        parts = self.module.rsplit(".", 2)
        return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def linears(inventory) -> list[Linear]:
    """Every matmul weight of the inventory (TensorSpec.autocast and not a bias), in registration order."""
    biases = {t.name[:-len(".bias")] for t in inventory if t.is_bias}
    out = []
    for t in inventory:
        if t.kind == "param" and t.autocast and not t.is_bias and t.name.endswith(".weight"):
            module = t.name[:-len(".weight")]
            n_in, n_out = t.shape if t.conv1d else (t.shape[1], t.shape[0])  # Conv1D: (in, out)
            out.append(Linear(module, n_in, n_out, t.block, t.role, module in biases))
    return out


def quantized_linears(cfg):
    """The linears bitsandbytes replaces: all but the output head (transformers' get_keys_to_not_convert
    keeps the output embedding, and a tied head is the input embedding)."""
    return list(_quantized_linears(cfg))


def _quantized(cfg) -> tuple[Linear, ...]:
    """quantized_linears' walk, once per config (a QLoRA estimate asks three times)."""
    from .accounting import tensor_inventory

    return tuple(lin for lin in linears(tensor_inventory(cfg)) if lin.role != "head")


def linear_names(inventory) -> list[str]:
    """The distinct short names of the model's linear layers (what --lora-targets may name)."""
    return list(dict.fromkeys(lin.short for lin in linears(inventory)))


def lora_target_names(family, cfg, spec) -> tuple[str, ...]:
    """The short module names LoRA adapts, resolved as peft resolves them; ConfigError naming the model's
    linear layers for a name it does not have."""
    from .accounting import tensor_inventory

    inv = [t for t in tensor_inventory(cfg) if family.lora_module(t.name.rsplit(".", 1)[0])]
    names = linear_names(inv)
    text = (spec.lora_targets or "").strip()
    if not text:
        targets = tuple(family.lora_default_targets)
        if not targets:
            raise ConfigError(f"peft has no default LoRA targets for {family.arch}; give --lora-targets "
                              f"(its linear layers: {', '.join(names)})")
    elif text == ALL_LINEAR:
        head = {lin.short for lin in linears(inv) if lin.role == "head"}
        targets = tuple(n for n in names if n not in head)
    else:
        targets = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in targets if t not in names]
    if unknown or not targets:
        raise ConfigError(f"LoRA target(s) {', '.join(unknown) or repr(text)} not in the model; its linear layers: "
                          f"{', '.join(names)}")
    return targets


def adapted_linears(family, cfg, spec) -> list[Linear]:
    """The linears LoRA wraps (none without LoRA)."""
    if not spec.lora_r:
        return []
    return list(_adapted_linears(cfg, spec.lora_targets))


def adapted_in_block(family, cfg, spec, i) -> list[Linear]:
    """adapted_linears' of block i (None: outside the blocks), in their order."""
    if not spec.lora_r:
        return []
    return list(_adapted_by_block(cfg, spec.lora_targets).get(i, ()))


def _by_block(cfg, lora_targets: str) -> dict:
    """_adapted's linears grouped by block, once per config and targets (a sweep asks per block)."""
    out: dict = {}
    for lin in _adapted_linears(cfg, lora_targets):
        out.setdefault(lin.block, []).append(lin)
    return {k: tuple(v) for k, v in out.items()}


def _adapted(cfg, lora_targets: str) -> tuple[Linear, ...]:
    """adapted_linears' walk, once per config and targets (the backward sweep asks once per block, and the
    app's longest-context search re-estimates: llama-3-8b's 32 blocks took ~0.4 s uncached)."""
    from types import SimpleNamespace

    from .accounting import tensor_inventory
    from .arch import family_of

    family = family_of(cfg)
    targets = set(lora_target_names(family, cfg, SimpleNamespace(lora_targets=lora_targets)))
    return tuple(lin for lin in linears(tensor_inventory(cfg)) if lin.short in targets and family.lora_module(lin.module))


def _memo(fn):
    from .accounting import per_config

    return per_config(fn)


_adapted_linears = _memo(_adapted)
_quantized_linears = _memo(_quantized)
_adapted_by_block = _memo(_by_block)


def trainable_names(family, cfg, spec) -> set[str] | None:
    """Names of the base model's parameters that train; None: all of them (no freezing)."""
    from .accounting import tensor_inventory

    if spec.lora_r:
        return set()
    if spec.train_layers == "all":
        return None
    inv = [t for t in tensor_inventory(cfg) if t.kind == "param"]
    tied = family.tied(cfg)
    if spec.train_layers == "head":
        if tied:
            raise ConfigError("the output head is tied to the input embedding: training it trains the embedding "
                              "(and keeps every activation); use --train-layers last:N or all")
        return {t.name for t in inv if t.role in ("head", "norm.final")}
    n = int(spec.train_layers[5:])
    if n > cfg.layers:
        raise ConfigError(f"--train-layers last:{n}: the model has {cfg.layers} blocks")
    first = cfg.layers - n
    return {t.name for t in inv if (t.block is not None and t.block >= first) or t.role in ("head", "norm.final")}


def check_finetune(family, cfg, spec) -> None:
    """What the model decides (ConfigError, one line): targets it has, a trainable subset it allows."""
    if spec.lora_r:
        if not family.lora_supported:
            raise ConfigError(f"LoRA is estimated for the nn.Linear decoders so far, not {family.arch}")
        lora_target_names(family, cfg, spec)
    else:
        if spec.train_layers != "all" and not family.subset_supported:
            raise ConfigError(f"--train-layers is estimated for transformers' RMSNorm decoders so far, not {family.arch}")
        trainable_names(family, cfg, spec)


# ---------------------------------------------------------------- the Planner page's fine-tuning modes

# (mode, label): what the page's "Fine-tuning" control offers; tune_fields turns a choice into TrainSpec fields.
TUNE_MODES = {
    "full": "full training (every weight trains)",
    "freeze": "frozen layers (train the last N blocks and the head)",
    "lora": "LoRA (peft adapters on a frozen base)",
    "qlora": "QLoRA (LoRA on a 4-bit bitsandbytes base)",
}
# LoRA's rank where the page or the advice has to pick one: the QLoRA paper's and Unsloth's recipe is r=16..64
# on every linear layer; 16 is peft's documented example value (peft docs, "LoRA" conceptual guide).
DEFAULT_LORA_R = 16


def target_choices(cfg) -> dict[str, str]:
    """What --lora-targets may be on this model, for a picker: a short name that reads well in a link
    ("default": peft's default for the model type, "attention": every attention projection, "all-linear")
    -> the lora_targets value ("" = peft's default)."""
    from .accounting import tensor_inventory
    from .arch import family_of

    attn = list(dict.fromkeys(lin.short for lin in linears(tensor_inventory(cfg)) if lin.role.startswith("attn")))
    out = {"default": ""} if family_of(cfg).lora_default_targets else {}
    if attn:
        out["attention"] = ",".join(attn)
    out[ALL_LINEAR] = ALL_LINEAR
    return out


def describe_targets(cfg, choices: dict[str, str]) -> str:
    """The picker's help: what each choice adapts on this model."""
    from .arch import family_of

    default = ", ".join(family_of(cfg).lora_default_targets)
    words = {"default": f"peft's default for this model type ({default})", ALL_LINEAR: "every linear layer but the "
             "output head (peft's all-linear)"}
    return "; ".join(f"{k}: {words.get(k, v.replace(',', ', '))}" for k, v in choices.items())


def tune_fields(mode: str, *, last_n: int = 1, lora_r: int = DEFAULT_LORA_R, lora_targets: str = "",
                quantize: str = "nf4", double_quant: bool = True) -> dict:
    """TrainSpec's fine-tuning fields for one of TUNE_MODES (last_n 0: the head only)."""
    if mode not in TUNE_MODES:
        raise ConfigError(f"fine-tuning mode must be one of {', '.join(TUNE_MODES)}, got {mode!r}")
    if mode == "full":
        return {}
    if mode == "freeze":
        return {"train_layers": f"last:{last_n}" if last_n > 0 else "head"}
    fields = {"lora_r": lora_r, "lora_targets": lora_targets}
    if mode == "qlora":  # bitsandbytes computes in bf16 (check_quantize_settings)
        fields |= {"quantize_base": quantize, "double_quant": double_quant, "precision": "bf16"}
    return fields


def tune_mode(spec) -> str:
    """Which of TUNE_MODES a run is (the inverse of tune_fields)."""
    if getattr(spec, "quantize_base", "none") != "none":
        return "qlora"
    if spec.lora_r:
        return "lora"
    return "freeze" if spec.train_layers != "all" else "full"


def describe_tuning(spec) -> str:
    """The fine-tuning settings in words ("" for full training)."""
    if not spec.finetuning:
        return ""
    if not spec.lora_r:
        return "training only the head" if spec.train_layers == "head" else f"training the {spec.train_layers[5:]} last blocks and the head"
    text = f"LoRA r={spec.lora_r} on {spec.lora_targets or 'peft default targets'}" + (
        f", dropout {spec.lora_dropout}" if spec.lora_dropout else "")
    quant = getattr(spec, "quantize_base", "none")
    if quant != "none":
        text = f"QLoRA ({quant}{' + double quant' if spec.double_quant else ''} base), " + text
    return text
