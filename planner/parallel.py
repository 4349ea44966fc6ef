"""How a training run is spread over ranks (no torch): DDP, FSDP2, tensor parallel or FSDP2 + TP at a world size.

A ParallelSpec sits beside the TrainSpec (which stays the per-rank run: batch_size is the batch per
rank). DDP is torch.nn.parallel.DistributedDataParallel with its defaults (25 MiB buckets, the first
1 MiB, gradient_as_bucket_view=False); FSDP is FSDP2 (`torch.distributed.fsdp.fully_shard`) applied
to every transformer block and then to the root, as torchtitan does. TP is torchtitan's Colwise/Rowwise plan
over `tp` ranks (planner/measure/tensor_parallel.py); FSDP + TP is a 2-D mesh of world_size / tp data-parallel
groups of tp ranks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .accounting import per_config, tensor_inventory
from .config import ConfigError, ModelConfig

PARALLEL_MODES = ("ddp", "fsdp", "tp", "fsdp+tp")
TP_MODES = ("tp", "fsdp+tp")
MP_DTYPES = ("float32", "bfloat16", "float16")
_MP_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def mp_dtype(value: str | None) -> str | None:
    """A MixedPrecisionPolicy dtype from the command line (bf16 / bfloat16 ...), or None."""
    if value is None:
        return None
    v = _MP_ALIASES.get(value, value)
    if v not in MP_DTYPES:
        raise ConfigError(f"unknown mixed-precision dtype {value!r}; choose one of: bf16, fp16, fp32")
    return v


@dataclass(frozen=True)
class ParallelSpec:
    world_size: int
    parallel: str = "ddp"                   # ddp | fsdp
    reshard_after_forward: bool = True      # FSDP2: True ~ ZeRO-3, False ~ ZeRO-2
    mp_param_dtype: str | None = None       # FSDP2 MixedPrecisionPolicy(param_dtype=...)
    mp_reduce_dtype: str | None = None      # FSDP2 MixedPrecisionPolicy(reduce_dtype=...)
    cpu_offload: bool = False               # FSDP2 CPUOffloadPolicy: sharded params, grads, optimizer on host
    gradient_as_bucket_view: bool = False   # DDP: grads are views into the buckets (no second copy)
    tp: int | None = None                   # TP degree (tp: the world size; fsdp+tp: the 2-D mesh's inner size)
    loss_parallel: bool = False             # TP: the head's output stays sharded on the vocabulary (loss_parallel())
    sequence_parallel: bool = False         # TP: torchtitan's SequenceParallel on the norms (residual stream Shard(1))

    @property
    def tp_degree(self) -> int:
        return (self.tp or self.world_size) if self.parallel in TP_MODES else 1

    @property
    def dp_degree(self) -> int:
        return self.world_size // self.tp_degree

    def __post_init__(self) -> None:
        ws = self.world_size
        if isinstance(ws, bool) or not isinstance(ws, int):
            raise ConfigError(f"world size must be an integer, got {ws!r}")
        if ws < 1:
            raise ConfigError(f"world size must be at least 1, got {ws}")
        if self.parallel not in PARALLEL_MODES:
            raise ConfigError(f"unknown parallel mode {self.parallel!r}; choose one of: {', '.join(PARALLEL_MODES)}")
        for name in ("mp_param_dtype", "mp_reduce_dtype"):
            v = getattr(self, name)
            if v is not None and v not in MP_DTYPES:
                raise ConfigError(f"{name} must be one of {', '.join(MP_DTYPES)}, got {v!r}")
        if self.parallel in TP_MODES:
            self._check_tp()
        elif self.tp is not None or self.loss_parallel or self.sequence_parallel:
            raise ConfigError("--tp, --loss-parallel and --sequence-parallel only apply to --parallel tp or fsdp+tp")
        if self.parallel == "ddp":
            fsdp_only = [flag for flag, on in (("--reshard-after-forward false", not self.reshard_after_forward),
                                                ("--mp-param-dtype", self.mp_param_dtype is not None),
                                                ("--mp-reduce-dtype", self.mp_reduce_dtype is not None),
                                                ("--cpu-offload", self.cpu_offload)) if on]
            if fsdp_only:
                raise ConfigError(f"{', '.join(fsdp_only)} only applies to --parallel fsdp")
        elif self.gradient_as_bucket_view:
            raise ConfigError("--gradient-as-bucket-view only applies to --parallel ddp")
        elif self.parallel == "fsdp" and ws == 1:
            # FSDP2 on one rank skips its collectives (parameters are copied, not all-gathered; gradients
            # are not reduce-scattered): a different memory profile the planner does not model.
            raise ConfigError("--parallel fsdp needs a world size of at least 2 (one rank has nothing to shard; "
                              "estimate it without --parallel)")

    def _check_tp(self) -> None:
        ws, tp = self.world_size, self.tp
        if isinstance(tp, bool) or (tp is not None and not isinstance(tp, int)):
            raise ConfigError(f"--tp must be an integer, got {tp!r}")
        if self.parallel == "tp":
            if tp is not None and tp != ws:
                raise ConfigError(f"--parallel tp shards over every rank: --tp {tp} must equal --world-size {ws} "
                                  "(or use --parallel fsdp+tp)")
            if ws < 2:
                raise ConfigError("--parallel tp needs a world size of at least 2")
            unsupported = [f for f, on in (("--reshard-after-forward false", not self.reshard_after_forward),) if on]
        else:
            if tp is None:
                raise ConfigError("--parallel fsdp+tp needs --tp N (the tensor-parallel size; world size / N "
                                  "data-parallel groups)")
            if tp < 2 or ws % tp or ws // tp < 2:
                raise ConfigError(f"--parallel fsdp+tp needs --tp of at least 2 dividing --world-size {ws} into at "
                                  f"least 2 data-parallel groups; got --tp {tp}")
            unsupported = []
            if self.sequence_parallel:
                # issue #23: measured and simulated, but FSDP2 + TP + SP's per-rank formula is not written (~4 KB off)
                raise ConfigError("--sequence-parallel with --parallel fsdp+tp is not modelled yet (use --parallel tp)")
        if self.parallel == "tp":  # a MixedPrecisionPolicy is FSDP2's (fsdp+tp takes one)
            unsupported += [f for f, on in (("--mp-param-dtype", self.mp_param_dtype is not None),
                                            ("--mp-reduce-dtype", self.mp_reduce_dtype is not None)) if on]
        unsupported += [f for f, on in (("--cpu-offload", self.cpu_offload),
                                        ("--gradient-as-bucket-view", self.gradient_as_bucket_view)) if on]
        if unsupported:
            raise ConfigError(f"{', '.join(unsupported)} with --parallel {self.parallel} is not modelled yet")

    @property
    def label(self) -> str:
        if self.parallel in TP_MODES:
            lp = (" loss-parallel" if self.loss_parallel else "") + (" seq-parallel" if self.sequence_parallel else "")
            if self.parallel == "tp":
                return f"tp x{self.world_size}{lp}"
            mp = (f" mp {self.mp_param_dtype or '-'}/{self.mp_reduce_dtype or '-'}"
                  if self.mp_param_dtype or self.mp_reduce_dtype else "")
            return (f"fsdp x{self.dp_degree} + tp x{self.tp_degree}{lp}"
                    + ("" if self.reshard_after_forward else " no-reshard") + mp)
        if self.parallel == "ddp":
            return f"ddp x{self.world_size}" + (" bucket-view" if self.gradient_as_bucket_view else "")
        parts = [f"fsdp x{self.world_size}", "reshard" if self.reshard_after_forward else "no-reshard"]
        if self.mp_param_dtype or self.mp_reduce_dtype:
            parts.append(f"mp {self.mp_param_dtype or '-'}/{self.mp_reduce_dtype or '-'}")
        if self.cpu_offload:
            parts.append("offload")
        return " ".join(parts)


def check_parallel_run(spec, pspec: ParallelSpec) -> None:
    """What the combination of a run and a parallel layout cannot do (one clear reason)."""
    from .bnb import is_bnb

    if is_bnb(spec.optimizer):
        raise ConfigError(f"--optimizer {spec.optimizer} with --parallel is not modelled yet (bitsandbytes' 8-bit / "
                          "paged states per rank, and on FSDP's flat shards, are not in the per-rank estimate)")
    if pspec.parallel in TP_MODES:
        if (pspec.mp_param_dtype or pspec.mp_reduce_dtype) and spec.precision != "fp32":
            raise ConfigError(f"a MixedPrecisionPolicy (--mp-param-dtype/--mp-reduce-dtype) needs --precision fp32 "
                              f"(FSDP casts the fp32 weights itself); got --precision {spec.precision}")
        if spec.precision == "fp16-amp":
            raise ConfigError(f"fp16-amp with --parallel {pspec.parallel} is not modelled (GradScaler over DTensors); "
                              "use bf16-amp")
        if getattr(spec, "offload_optimizer", False):
            raise ConfigError(f"--offload-optimizer with --parallel {pspec.parallel} is not modelled yet")
        if spec.finetuning or spec.grad_accum > 1 or getattr(spec, "loss", "default") not in ("default", "labels"):
            raise ConfigError(f"--parallel {pspec.parallel} models full training with the default loss and "
                              "--grad-accum 1 only")
        return
    if pspec.parallel != "fsdp":
        return
    if (pspec.mp_param_dtype or pspec.mp_reduce_dtype) and spec.precision != "fp32":
        raise ConfigError(f"a MixedPrecisionPolicy (--mp-param-dtype/--mp-reduce-dtype) needs --precision fp32 "
                          f"(FSDP casts the fp32 weights itself); got --precision {spec.precision}")
    if spec.precision == "fp16-amp":
        raise ConfigError("fp16-amp with FSDP needs torch's ShardedGradScaler, which the planner does not run; "
                          "use bf16-amp or a MixedPrecisionPolicy")
    if pspec.cpu_offload and spec.optimizer_impl == "fused":
        raise ConfigError("--cpu-offload runs the optimizer on the host: the fused (device) optimizer does not apply")


_BLOCK_RE = re.compile(r"^(.*?)\.(\d+)\.")


def block_prefixes(cfg: ModelConfig) -> tuple[str, ...]:
    """The repeated blocks FSDP wraps one by one ("trf_blocks.0", "model.layers.3", ...), from the
    inventory's parameter names; empty when the model has no blocks to wrap."""
    return _block_prefixes(cfg)


@per_config
def _block_prefixes(cfg: ModelConfig) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for t in tensor_inventory(cfg):
        m = _BLOCK_RE.match(t.name)
        if t.kind == "param" and m:
            seen[f"{m.group(1)}.{m.group(2)}"] = None
    return tuple(seen)


def check_wrappable(cfg: ModelConfig, pspec: ParallelSpec) -> None:
    if pspec.parallel in TP_MODES:
        from .arch import family_of

        fam = family_of(cfg)
        if not getattr(fam, "tp_supported", False):
            raise ConfigError(f"--parallel {pspec.parallel} is modelled for Llama-style decoders with separate q/k/v "
                              f"and gate/up projections (llama, qwen2); not for {cfg.arch}")
        tp = pspec.tp_degree
        if cfg.num_attention_heads % tp or cfg.num_key_value_heads % tp:
            raise ConfigError(f"tensor parallel over {tp} ranks shards attention heads: {tp} must divide "
                              f"num_attention_heads ({cfg.num_attention_heads}) and num_key_value_heads "
                              f"({cfg.num_key_value_heads})")
        uneven = [f"{k} ({getattr(cfg, k)})" for k in ("vocab_size", "intermediate_size") if getattr(cfg, k) % tp]
        if uneven:
            # DTensor pads uneven shards for its all-gathers; the vocabulary-parallel head's all-gather of
            # uneven shards fails in torch 2.13 (measured), and published vocabularies divide by 8.
            raise ConfigError(f"tensor parallel over {tp} ranks needs {tp} to divide {' and '.join(uneven)}")
        if getattr(cfg, "tie_word_embeddings", False):
            raise ConfigError("tensor parallel with a tied embedding and head is not modelled (torchtitan unties them)")
        return
    if pspec.parallel == "fsdp" and not block_prefixes(cfg):
        raise ConfigError("cannot apply FSDP: the model has no repeated blocks (e.g. model.layers.N) to fully_shard")


def sequence_parallel_applies(layout: str | None) -> bool:
    """Whether the app offers --sequence-parallel for a layout: torchtitan's SequenceParallel is modelled with
    --parallel tp only (with fsdp+tp ParallelSpec refuses it: its per-rank formula is not written)."""
    return layout == "tp"
