"""Fake-tensor kernels corrected to the CPU kernels' output dtypes (child side, simulation only).

FakeTensorMode computes most outputs' metadata with torch's Python decompositions (torch/_decomp/
decompositions.py), which follow the CUDA/reference kernels. On the CPU, ATen's normalisation kernels treat a
"mixed type" call differently: a bf16 or fp16 input with float32 parameters (what autocast produces after a
convolution or a linear: a bf16 activation into a BatchNorm / GroupNorm / LayerNorm whose weights stay fp32)
returns its statistics in float32 (aten/src/ATen/native/Normalization.cpp batch_norm_cpu, layer_norm_cpu in
layer_norm.cpp and group_norm.cpp: `param_scalar_type(input, mixed_type)`, float when mixed), while the
decompositions return them in the input's dtype:

- `native_batch_norm` (BatchNorm*d, InstanceNorm*d): save_mean and save_invstd. Measured (torch 2.13, CPU,
  bf16 input, fp32 weight or running stats): real float32 (C,) each, fake bfloat16: a CNN's forward and
  backward phase peaks simulated 2 * 2 * C bytes low per BatchNorm (issue #20: 192 B on its CNN).
- `native_layer_norm`: mean and rstd, real float32, fake the input's dtype.
- `native_group_norm`: mean and rstd (N, groups), real float32, fake the input's dtype; and
  `native_group_norm_backward`'s grad_input: real the input's dtype (always), fake float32 (the decomposition runs in
  float32 and the autograd engine then casts the gradient back with one more `_to_copy`, an op and a
  temporary the real step does not have).

`CpuKernelDtypes` is a dispatch mode stacked between the live-bytes tracker and FakeTensorMode while the
simulated steps run: it lets the fake kernel run, then, for these ops only and only for a CPU call whose inputs
are mixed as above, returns outputs of the CPU kernel's dtype (same shape, contiguous, as the CPU kernel
allocates them with at::empty). The tracker above it sees the CPU kernel's outputs; the fake kernel's own
outputs for the replaced slots are dropped at once and never reach it. A real (non-fake) call never passes
here: measurement runs the real kernels.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_REDUCED = (torch.bfloat16, torch.float16)


def mixed_type(x: torch.Tensor, *params) -> bool:
    """ATen's is_mixed_type (aten/src/ATen/native/mixed_dtypes_utils / Normalization.cpp): a reduced-precision
    input with every defined parameter float32 (at least one defined)."""
    defined = [p for p in params if isinstance(p, torch.Tensor)]
    return x.dtype in _REDUCED and bool(defined) and all(p.dtype == torch.float32 for p in defined)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new tensor of t's shape in `dtype` (contiguous, as the CPU kernel's at::empty makes it)."""
    return torch.empty(t.shape, dtype=dtype, device=t.device)


# op -> (indices of the stats outputs whose dtype the CPU kernel makes float32, index of the input, indices of the params)
_STATS = {
    _aten.native_batch_norm.default: ((1, 2), 0, (1, 2, 3, 4)),   # input, weight, bias, running_mean, running_var
    _aten.native_layer_norm.default: ((1, 2), 0, (2, 3)),        # input, normalized_shape, weight, bias
    _aten.native_group_norm.default: ((1, 2), 0, (1, 2)),        # input, weight, bias, N, C, HxW, group, eps
}


class CpuKernelDtypes(TorchDispatchMode):
    """See the module docstring. Only CPU calls change; everything else passes through untouched."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _STATS:
            stats, xi, pis = _STATS[func]
            x = args[xi]
            params = [args[i] if i < len(args) else None for i in pis]
            if x.device.type == "cpu" and mixed_type(x, *params):
                out = tuple(_as(o, torch.float32) if i in stats and o.dtype != torch.float32 else o
                            for i, o in enumerate(out))
        elif func is _aten.native_group_norm_backward.default:
            x = args[1]
            d_input = out[0]
            if x.device.type == "cpu" and d_input is not None and d_input.dtype != x.dtype:
                out = (_as(d_input, x.dtype),) + tuple(out[1:])
        return out
