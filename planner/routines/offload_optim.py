"""`--offload-optimizer`: a plain-torch equivalent of torchao's CPUOffloadOptimizer (issue #24).

torchao's `CPUOffloadOptimizer(params, torch.optim.AdamW, fused=True)` (torchao/optim/cpu_offload.py, torchao 0.18.0;
defaults offload_gradients=False, minimal_size=4096) asserts a CUDA or XPU device ("CPU Offload currently only
supports CUDA & XPU"), so it cannot run on a CPU-only build. This class does what it does, tensor for tensor and in
the same order, with the "device" being the CPU (or, pinned, a CUDA device):

  __init__   per trainable parameter of >= minimal_size elements: `p_host = torch.empty_like(p, device="cpu")`,
             `p_host.grad = torch.empty_like(p_host)`, `p_host.copy_(p.detach())`, a post-accumulate-grad hook on p
             and its own `AdamW([p_host], fused=True)`; the smaller ones go to one device `AdamW(fused=True)` (d_opt).
  backward   the hook copies each grad into its host buffer as soon as it is accumulated
             (`p_host.grad.copy_(p.grad)`, in place: torchao's non_blocking D2H copy on its side stream).
  step       d_opt.step(); then, in the order the grads arrived, the host AdamW's step and `p.copy_(p_host)`.
  zero_grad  the device grads to None (the host grads are overwritten by the next copy).

On a CUDA device the host copies are pinned as torchao pins them (`pin_memory=True` for p_host and p_host.grad;
PyTorch's CachingHostAllocator rounds pinned requests up to a power of two); pinning needs CUDA, so on the CPU
pin_memory is False and the host bytes are the tensors' own sizes. torchao's side stream and its events (the copies
overlap backward on CUDA) are left out: the copies run inline on the current stream (a synchronous D2H / H2D copy
makes no device tensor, so the device's live bytes are the same; only the timing differs). `host_tensors()` names what lives on the host, so the live-bytes tracker counts it apart
(planner/measure/tracker.py host_scope).
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import is_fake

MINIMAL_SIZE = 4096  # torchao's default minimal_size (planner/estimate/offload.py uses the same)


class HostOffloadAdamW:
    """The optimizer a training step holds in place of torch.optim.AdamW under --offload-optimizer."""

    def __init__(self, params, optimizer_class=torch.optim.AdamW, minimal_size: int = MINIMAL_SIZE, **kwargs):
        # torchao sets fused=True for AdamW ("default to fused CPU AdamW"); Adam here is fused too (as a user passing
        # fused=True gets it), the step planner/estimate/offload.py models for both
        kwargs.setdefault("fused", True)
        self.param_d2h_map: dict[torch.Tensor, torch.Tensor] = {}
        self.optim_dict: dict[torch.Tensor, torch.optim.Optimizer] = {}
        self.queue: dict[torch.Tensor, None] = {}  # insertion order = the order the grads arrived
        retained = []
        for p in params:
            if not p.requires_grad:
                continue
            if p.numel() < minimal_size:
                retained.append(p)
                continue
            # torchao: pin_memory=True (pinning needs CUDA; a simulation's fake tensors own no memory to pin)
            pin = p.device.type == "cuda" and not is_fake(p)
            p_host = torch.empty_like(p, device="cpu", pin_memory=pin)
            p_host.grad = torch.empty_like(p_host, pin_memory=pin)
            p_host.copy_(p.detach())
            self.param_d2h_map[p] = p_host
            p.register_post_accumulate_grad_hook(self._backward_hook)
            self.optim_dict[p] = optimizer_class([p_host], **kwargs)
        self.d_opt = optimizer_class(retained, **kwargs) if retained else None
        self._pre_hooks: list = []  # Optimizer.register_step_pre_hook's (the simulation counts the steps with it)

    def register_step_pre_hook(self, hook) -> None:
        self._pre_hooks.append(hook)

    def _backward_hook(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self.param_d2h_map[p].grad.copy_(p.grad)
            self.queue.pop(p, None)  # torchao: a param seen again (accumulation) moves to the end
            self.queue[p] = None

    @torch.no_grad()
    def step(self, closure=None):
        for hook in self._pre_hooks:
            hook(self, (), {})
        if self.d_opt is not None:
            self.d_opt.step()
        for p in self.queue:
            self.optim_dict[p].step()
            p.copy_(self.param_d2h_map[p])
        self.queue.clear()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_d2h_map:
            p.grad = None
        if self.d_opt is not None:
            self.d_opt.zero_grad(set_to_none=set_to_none)

    @property
    def state(self) -> dict:
        """The device optimizer's state only (what `optimizer_bytes` reports as the device's)."""
        return self.d_opt.state if self.d_opt is not None else {}

    def all_states(self) -> list[dict]:
        """Every per-parameter state, the device's and the host optimizers'."""
        return list(self.state.values()) + [st for o in self.optim_dict.values() for st in o.state.values()]

    @property
    def param_groups(self) -> list:
        return (self.d_opt.param_groups if self.d_opt is not None else []) + \
            [g for o in self.optim_dict.values() for g in o.param_groups]

    def host_tensors(self) -> list[torch.Tensor]:
        """Everything on the host: the parameter copies, their grad buffers and the host AdamWs' states."""
        out = []
        for p_host in self.param_d2h_map.values():
            out += [p_host, p_host.grad]
        for o in self.optim_dict.values():
            out += [v for st in o.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        return out
