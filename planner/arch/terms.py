"""The vocabulary a family file speaks (no torch, no planner imports): the tensors a model registers
(TensorSpec: name, shape, role) and the tensors its step holds (Term: a named formula and its bytes), with
the byte widths a run decides (Widths). planner/accounting.py sums TensorSpecs; planner/estimate/ sums Terms.

Symbols: b batch, s sequence, h hidden, a heads, d head dim, f FFN width, V vocab, c context length,
L layers. Byte widths: e_r residual stream (the weights' dtype: embeddings output it), e_m matmul
inputs/outputs (the autocast dtype under AMP, else e_r), e_ce the loss (fp32 under CPU autocast,
where cross_entropy is on the fp32 list), e_k dropout keep-mask (fp32 noise on CPU, 1-byte bool on CUDA).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

# Bytes per element of each dtype the planner reasons about (torch's element sizes).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "bool": 1}


@dataclass(frozen=True)
class TensorSpec:
    name: str                 # state_dict key (parameters and persistent buffers) or buffer name
    shape: tuple[int, ...]
    kind: str                 # "param" or "buffer"
    persistent: bool = True   # non-persistent buffers are not in the state_dict
    autocast: bool = False    # a weight that torch.autocast casts (and caches) for a matmul
    dtype: str | None = None  # fixed dtype (RoPE's inv_freq is built with .float()); None = the weights' dtype
    block: int | None = None  # the block (layer) index it belongs to; None: outside the blocks
    role: str = ""            # what it does (planner/arch/base.py lists the roles); the estimator reads roles
    trainable: bool = True    # requires grad (gets a .grad and optimizer state)
    is_bias: bool = False     # a bias (autocast casts it, but no matmul saves it)
    conv1d: bool = False      # transformers' Conv1D weight: shape (in, out), not nn.Linear's (out, in)

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class Term:
    name: str       # what the tensors are
    formula: str    # how the bytes follow from the config (symbols above)
    bytes: int
    per_layer: bool = False  # True: the figure is one block's; the model holds L of them
    where: str = "block"     # "embed" (before the blocks) or "head" (after them): decides when it is freed;
                             # "mlp": a block's MLP part (freed first in backward); "kept": alive all step
    part: str = ""           # finer place for the backward sweep: "norm.mlp" = the pre-MLP norm's tensors


@dataclass(frozen=True)
class Widths:
    e_r: int
    e_m: int
    e_ce: int
    e_k: int
    amp: bool

    @classmethod
    def of(cls, spec, loss_upcast: bool = False) -> "Widths":
        """loss_upcast: the loss runs on an fp32 copy of the logits (transformers' ForCausalLMLoss
        does `logits.float()`, transformers/loss/loss_utils.py), whatever the weights' dtype."""
        e_r = 2 if spec.precision == "bf16" else 4
        amp = spec.autocast_dtype is not None
        e_m = 2 if amp else e_r
        # CPU autocast lists cross_entropy_loss as fp32 (autocast_mode.cpp); CUDA autocast runs
        # log_softmax in fp32 via fp32_set_opt_dtype. Either way the loss buffers are fp32 under AMP.
        e_ce = 4 if (amp or loss_upcast) else e_r
        # Dropout: CPU multiplies by a saved noise tensor of the input dtype; CUDA's fused
        # native_dropout saves a bool mask (aten/src/ATen/native/Dropout.cpp).
        e_k = 1 if spec.device_type == "cuda" else e_m
        return cls(e_r, e_m, e_ce, e_k, amp)


@dataclass(frozen=True)
class MatOp:
    """One matmul of a block's forward: rows x n_in -> n_out (2*rows*n_in*n_out FLOPs), at a stage of the block's
    dataflow, with the inventory parameters that are its weight (whether it trains)."""
    label: str
    stage: str          # attn.in | attn.out | mlp.in | mlp.out (the inventory's roles); priced by planner/estimate/compute.py
    rows: int
    n_in: int
    n_out: int
    params: tuple[str, ...]
    qkv: str = ""       # attn.in: which of the attention's inputs it makes: q, k, v or qkv (fused)
    adapter_rank: int = 0  # LoRA: the adapters' rank on this linear (0: none)

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.n_in * self.n_out
