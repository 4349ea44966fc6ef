"""Activation checkpointing policies (issue #24; no torch): which blocks are checkpointed and what a checkpointed
block keeps.

  full        every block under torch.utils.checkpoint(use_reentrant=False): only its input is kept (the
              planner's `--checkpointing` since the start; estimated in planner/estimate/training.py)
  every:K     blocks 0, K, 2K, ... checkpointed, the others keep their saved tensors: transformers'
              activation_checkpointing_enable(every_n_layers=K) (modeling_utils.py _set_gradient_checkpointing:
              layer_index % every_n_layers == 0), the same rule for the book's GPT-2
  selective   every block checkpointed with torch.utils.checkpoint's create_selective_checkpoint_contexts and
              torchtitan's op policy (torchtitan/models/llama3/infra/parallelize.py `_save_list` and
              `_custom_policy`): the outputs of matmuls (aten.mm, every second one recomputed) and of the fused
              attention kernels the list names are saved, pointwise ops are recomputed; on CUDA the kernel SDPA
              dispatches decides (planner/arch/decoder.py cuda_sdpa_kernel): cuDNN's (bf16 / fp16) and the math
              kernel's composite ops (fp32 with enable_gqa) are not in the list, so they are recomputed
every:K and selective are measured and simulated (the real step) and estimated (planner/estimate/ckpt_policy.py,
from the full-checkpointing estimate and the family's selective_ops: planner/arch/<family>.py; with gradient
accumulation, a later micro-batch's sweep with every .grad alive; with fine-tuning, planner/estimate/finetune.py
policy_terms / policy_kept, QLoRA through its fp32 twin, and the book's GPT-2 in its own walk,
planner/arch/gpt2_book.py _checkpointed).
"""
from __future__ import annotations

import re

from .validation import ConfigError

POLICIES = ("full", "every:K", "selective")
_EVERY_RE = re.compile(r"^every:(\d+)$")


def check_policy(policy: str) -> None:
    if policy in ("full", "selective"):
        return
    m = _EVERY_RE.match(policy or "")
    if m is None or int(m.group(1)) <= 0:
        raise ConfigError(f"unknown checkpointing policy {policy!r}; choose one of: full, every:K (K >= 1), selective")


def policy_of(spec) -> str:
    """The checkpointing policy in force ("full" without checkpointing too: nothing to tell apart)."""
    return getattr(spec, "checkpoint_policy", "full") if spec.checkpointing else "full"


def every_k(policy: str) -> int:
    """K of every:K (1 for full and selective: every block)."""
    m = _EVERY_RE.match(policy)
    return int(m.group(1)) if m else 1


def checkpointed_blocks(policy: str, layers: int) -> list[int]:
    k = every_k(policy)
    return [i for i in range(layers) if i % k == 0]


def selective_saved(ops) -> int:
    """Bytes torchtitan's policy keeps of one block's forward: ops are the block's (label, kind, bytes, flops) in
    order (planner/arch/<family>.py selective_ops); every "mm" output whose count in the block is odd and every
    "sdpa" output (the fused attention kernels in the list; a CUDA kernel outside it is "sdpa-recomputed") is
    saved (torchtitan/models/llama3/infra/parallelize.py
    _custom_policy: `meta[mm_count_key] % 2 == 0` recomputes every second mm); other kinds (addmm, bmm,
    _grouped_mm: not in _save_list) are recomputed."""
    return sum(nbytes for _, _, nbytes, _ in saved_ops(ops))


def saved_ops(ops) -> list:
    out, mm = [], 0
    for op in ops:
        if op[1] == "mm":
            mm += 1
            if mm % 2:
                out.append(op)
        elif op[1] == "sdpa":
            out.append(op)
    return out


def with_adapters(ops, adapters: dict, n: int, r: int, e_out: int) -> list:
    """The block's ops with LoRA's: peft's lora.Linear.forward runs the base layer, then lora_B(lora_A(dropout(x)))
    (peft/tuners/lora/layer.py), two bias-free Linears, so two more aten.mm after each adapted op (whose label is
    the module's short name): lora_A's (n, r) output and lora_B's (n, n_out), in the adapters' matmul dtype e_out
    (the autocast dtype under AMP, else the adapters' fp32). They take part in the every-second-mm count: measured,
    llama V1000 h64 L4 b2 s64 LoRA r8 on q_proj, v_proj under selective, fp32 and bf16-AMP, the forward 4 * 247,808
    and 4 * 124,928 B above full checkpointing's = the odd mm outputs (q, q's lora_B, v, v's lora_B, gate, down)
    and the SDPA kernel's. adapters: short name -> (n_in, n_out)."""
    out = []
    for op in ops:
        out.append(op)
        if op[0] in adapters:
            n_in, n_out = adapters[op[0]]
            out += [(f"{op[0]} lora_A", "mm", n * r * e_out, 2 * n * n_in * r),
                    (f"{op[0]} lora_B", "mm", n * n_out * e_out, 2 * n * r * n_out)]
    return out


def recompute_flops(policy: str, ops, layers: int) -> int:
    """FLOPs the backward's recompute adds, from the block's matmul and attention FLOPs (pointwise ops are a
    rounding error next to them): full recomputes every block's forward, every:K the checkpointed blocks'
    (ceil(L/K) of them), selective every block's ops but the saved ones."""
    block = sum(f for *_, f in ops)
    if policy == "selective":
        return layers * (block - sum(f for *_, f in saved_ops(ops)))
    return len(checkpointed_blocks(policy, layers)) * block
