"""bitsandbytes optimizers (issue #12): state bytes and step temporaries, in one place (no torch).

Used by full training (planner/estimate/training.py), fine-tuning (planner/estimate/finetune.py
optimizer_terms) and the spec's checks. Every figure is read off bitsandbytes 0.50's source
(bitsandbytes/optim/optimizer.py, bitsandbytes/backends/{cpu,cuda}/ops.py) and checked against the real
optimizer's live tensors on the CPU (tests/test_bnb_optim.py, `python -m planner bench finetune`).

    adamw-8bit        bnb.optim.AdamW8bit        8-bit blockwise states (32-bit under 4096 elements)
    paged-adamw-8bit  bnb.optim.PagedAdamW8bit   the same, large states in CUDA unified memory (GPU only)
    paged-adamw       bnb.optim.PagedAdamW       32-bit states, large ones in CUDA unified memory (GPU only)

State per parameter tensor of n elements (Optimizer2State.init_state):
  - n >= min_8bit_size (4096) and optim_bits 8: state1, state2 uint8 (n each; get_state_buffer) and
    absmax1, absmax2 fp32 (ceil(n/256) each: blocksize = 256);
  - otherwise (n < 4096, or the 32-bit optimizer): state1, state2 fp32, whatever the parameter's dtype
    (get_state_buffer: zeros_like(p, dtype=torch.float32));
  - `step` is a Python int, not a tensor; max_unorm = 0 (the default) makes no unorm_vec; bitsandbytes 0.50's
    AdamW8bit has no percentile_clipping (no gnorm_vec): the step's gnorm_scale is 1.0.
  - The 8-bit optimizers build two 256-entry fp32 quantization maps once, in Optimizer8bit.__init__
    (fill_qmap: create_dynamic_map signed and unsigned); every 8-bit parameter's qmap1 / qmap2 is that same
    tensor (init_state: state["qmap1"] = self.name2qmap["dynamic"]), so they count once: 2 * 256 * 4 B.
Paged (is_paged=True) on CUDA: get_state_buffer puts state1/state2 of a tensor with n >= 1e5 elements in
CUDA unified memory (functional.get_paged: cudaMallocManaged through cget_managed_ptr), outside PyTorch's
caching allocator: torch.cuda.max_memory_allocated never counts them, and the driver pages them between
GPU and host on demand (evicted under GPU memory pressure). They are reported apart (paged_state_bytes);
absmax, qmaps and the states of tensors under 1e5 elements are ordinary device tensors and count.
"""
from __future__ import annotations

from ..bnb import BNB_OPTIMIZERS, EIGHT_BIT, PAGED, bnb_available, check_spec, is_bnb, require_bitsandbytes  # noqa: F401 (re-exported)

# Optimizer2State's default min_8bit_size (bitsandbytes/optim/optimizer.py): smaller tensors keep fp32 states.
MIN_8BIT_SIZE = 4096
# init_state: blocksize = 256, one fp32 absmax per block of each 8-bit state.
BLOCKSIZE = 256
# fill_qmap: create_dynamic_map(signed=True) and (signed=False), 256 fp32 entries each, shared by all params.
QMAP_BYTES = 2 * 256 * 4
# get_state_buffer: `if not self.is_paged or p.numel() < 1e5: torch.zeros_like(...)`, else get_paged.
PAGED_MIN_NUMEL = 100_000
CUDA_BLOCK_BYTES = 512  # c10/cuda/CUDACachingAllocator.cpp (as planner/estimate/training.py)


def _state_parts(optimizer: str, n: int) -> tuple[int, ...]:
    """Byte sizes of the state tensors bitsandbytes makes for one parameter tensor of n elements."""
    if optimizer in EIGHT_BIT and n >= MIN_8BIT_SIZE:
        blocks = -(-n // BLOCKSIZE)
        return (n, n, 4 * blocks, 4 * blocks)  # state1, state2 uint8; absmax1, absmax2 fp32
    return (4 * n, 4 * n)                      # state1, state2 fp32


def _paged(optimizer: str, n: int, part: int) -> bool:
    """Whether state part `part` of an n-element tensor lives in CUDA unified memory (state1/state2 only)."""
    return optimizer in PAGED and n >= PAGED_MIN_NUMEL and part < 2


def state_bytes(optimizer: str, numels) -> int:
    """Optimizer state bytes that count against the device (the allocator): every state tensor but the
    paged ones, plus the shared qmaps of the 8-bit optimizers."""
    total = QMAP_BYTES if optimizer in EIGHT_BIT else 0
    for n in numels:
        total += sum(b for i, b in enumerate(_state_parts(optimizer, n)) if not _paged(optimizer, n, i))
    return total


def paged_state_bytes(optimizer: str, numels) -> int:
    """Paged state (CUDA unified memory, not in max_memory_allocated): state1 + state2 of tensors >= 1e5."""
    return sum(b for n in numels for i, b in enumerate(_state_parts(optimizer, n)) if _paged(optimizer, n, i))


def cuda_rounding_bytes(optimizer: str, numels) -> int:
    """The caching allocator's 512-B rounding of each allocator-held state tensor (qmaps: 1,024 B each, exact)."""
    extra = 0
    for n in numels:
        for i, b in enumerate(_state_parts(optimizer, n)):
            if not _paged(optimizer, n, i):
                extra += -(-b // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES - b
    return extra


def tensor_temporary_bytes(optimizer: str, n: int, elem_bytes: int) -> int:
    """Transient bytes of one parameter's update on the CPU (bitsandbytes/backends/cpu/ops.py, measured
    op by op with the live-bytes tracker inside the kernel):
      grad = g.float() * gnorm_scale                     4n (a new fp32 tensor, any dtype)
      p_fp32 = p.data.float()                            4n below fp32 (a copy; fp32: p itself)
      8-bit: state1_fp32, state2_fp32 = dequantize(...)  8n
      the update's two fp32 temporaries at once          8n (8-bit: state2_fp32.sqrt() and its / correction2,
                                                            the local `denom`; 32-bit: state2.sqrt() and + eps,
                                                            then + eps and state1 / it)
    All are locals of the kernel, freed when it returns, so parameters do not overlap. The 8-bit path's
    re-quantization (quantize_blockwise: n uint8 + absmax) comes after the sqrt is freed: below the peak."""
    tmp = 4 * n + (4 * n if elem_bytes < 4 else 0) + 8 * n
    if optimizer in EIGHT_BIT and n >= MIN_8BIT_SIZE:
        tmp += 8 * n
    return tmp


def step_temporary_bytes(optimizer: str, tensors, device_type: str) -> tuple[int, str]:
    """(bytes, formula) of optimizer.step()'s transient peak over (numel, bytes per element) tensors.
    CUDA: the update is one bitsandbytes kernel per parameter, in place (backends/cuda/ops.py
    _optimizer_update_8bit_blockwise_impl / _optimizer_update_32bit_impl call the C kernel on the tensors'
    pointers and allocate nothing): the optimizer phase of all 114 8-bit rows run on an H200 matches to the byte in
    live bytes (tests/data/cuda/2026-11-27-h200)."""
    if device_type == "cuda":
        return 0, "0 (bitsandbytes CUDA kernels update in place)"
    worst = max((tensor_temporary_bytes(optimizer, n, eb) for n, eb in tensors), default=0)
    if optimizer in EIGHT_BIT:
        formula = "max_i n_i*(12 + 4*[e_p<4] + 8*[n_i>=4096]) (CPU kernel: fp32 grad, fp32 param, dequantized states, denom)"
    else:
        formula = "max_i n_i*(12 + 4*[e_p<4]) (CPU kernel: fp32 grad, fp32 param, sqrt and update)"
    return worst, formula


def notes(optimizer: str, numels, device_type: str) -> list[str]:
    if not is_bnb(optimizer):
        return []
    numels = list(numels)
    small = sum(1 for n in numels if n < MIN_8BIT_SIZE)
    out = []
    if optimizer in EIGHT_BIT:
        out.append(f"{optimizer} (bitsandbytes): 8-bit blockwise states (2 B per element + 8 B per 256) "
                   f"for {len(numels) - small} tensors, fp32 states for the {small} under {MIN_8BIT_SIZE} elements, "
                   "and 2 shared 256-entry fp32 quantization maps")
    if device_type == "cuda":
        out.append("bitsandbytes on CUDA: the update is one in-place kernel per parameter (backends/cuda/ops.py), so "
                   "no step temporaries are counted (bitsandbytes' source; the 8-bit grids on an H200 agree: docs/gpu.md)")
    if optimizer in PAGED and device_type == "cuda":
        out.append(f"paged: {paged_state_bytes(optimizer, numels):,} B of state (state1/state2 of tensors with >= "
                   f"{PAGED_MIN_NUMEL:,} elements) live in CUDA unified memory (cudaMallocManaged), outside the caching "
                   "allocator: not in peak_bytes; the driver pages them to the host under GPU memory pressure")
    return out
