"""The tracker's event log: every storage's birth and death during a tracked step, with what made it.

Off by default: LiveBytesTracker.log is None and the tracker then does exactly what it did before (one
`is not None` test per new storage). planner.measure.training and planner.measure.simulate attach an
EventLog to the tracked step; planner.measure.export turns it into a memory_viz snapshot, a chrome trace
and the record's `alive_at_peak`.

Each alloc event says: the op index (the tracker's dispatch count in the tracked step), the aten op, the
storage's bytes, the first tensor's shape and dtype, the phase, and the module path that was running:
- in the forward (and in a checkpointed block's recompute), the innermost module whose forward is running,
  from global module forward pre/post hooks (torch.nn.modules.module.register_module_forward_pre_hook /
  register_module_forward_hook), named as model.named_modules() names it;
- in the backward, the autograd node being run (torch._C._current_autograd_node(), e.g. "MmBackward0")
  and the module whose forward created that node: each output of a forward op is remembered (weakly) and,
  once autograd has given it a grad_fn, the node's `metadata["module"]` is set to the module path.
A free event names the storage when its last view dies (the tracker's weakref callback).

Categories (decided when the log is closed, from what was seen):
- parameter, buffer, input, optimizer state: the step's persistent tensors by identity (model.parameters(),
  model.buffers(), the batch, the optimizer's and GradScaler's state);
- gradient: a storage that was a parameter's .grad at a phase boundary or at the end;
- activation: allocated in the forward/loss and still alive when the backward starts (saved for it), or
  allocated in a backward recompute (a module forward running in the backward: checkpointing) and still
  alive when that recompute's outermost module returns;
- temporary: the rest (freed within its phase: workspaces, casts, optimizer temporaries).
"""
from __future__ import annotations

import weakref

import torch

PERSISTENT_CATEGORIES = ("parameter", "buffer", "input", "optimizer state")
CATEGORIES = ("parameter", "buffer", "input", "optimizer state", "gradient", "activation", "temporary")


def op_label(func) -> str:
    """aten::mm for torch.ops.aten.mm.default (the name the profiler and memory_viz use)."""
    try:
        return f"{func.namespace}::{func._opname}"
    except AttributeError:
        return str(func)


class EventLog:
    """What LiveBytesTracker calls when attached as `tracker.log` (see the module docstring)."""

    def __init__(self, step=None):
        # events: ("a", uid, nbytes, op_index, func, module, phase, shape, dtype) | ("f", uid, op_index)
        #         | ("p", phase, op_index). A uid names one storage's life (a storage's id() is reused).
        self.events: list[tuple] = []
        self.initial: dict[int, tuple] = {}   # uid -> (nbytes, category, module) alive at start
        self.uid_of: dict[int, int] = {}      # id(storage) of a live storage -> its uid
        self._next_uid = 0
        self.op_index = 0
        self.func = None
        self.phase = "setup"
        self.stack: list[str] = []
        self.names: dict[int, str] = {}
        self.category: dict[int, str] = {}
        self.looks: dict[int, tuple] = {}     # uid -> (shape, dtype) of an initial storage
        self.owner: dict[int, str] = {}       # persistent storage -> module path (a parameter's module)
        self._pending: list[tuple[weakref.ref, str]] = []
        self._fwd_alloc: list[int] = []       # uids allocated in forward/loss (activation if alive at backward)
        self._recompute: list[int] = []       # uids allocated in a backward recompute
        self._live: set[int] = set()          # uids alive now
        self._hooks: list = []
        self.step = step
        if step is not None:
            self.names = {id(m): (name or type(m).__name__) for name, m in step.model.named_modules()}

    # -- set-up -----------------------------------------------------------------------------------------
    def start(self, tracker) -> None:
        """Take the tracker's live storages as the initial state, classify them, install the module hooks."""
        step = self.step
        cats: dict[int, tuple[str, str]] = {}
        if step is not None:
            for mname, m in step.model.named_modules():
                for p in m.parameters(recurse=False):
                    cats.setdefault(id(p.untyped_storage()), ("parameter", mname or "model"))
                for b in m.buffers(recurse=False):
                    cats.setdefault(id(b.untyped_storage()), ("buffer", mname or "model"))
            param_module = {id(p): mname or "model" for mname, m in step.model.named_modules()
                            for p in m.parameters(recurse=False)}
            for p, state in step.optimizer.state.items():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        cats.setdefault(id(v.untyped_storage()), ("optimizer state", param_module.get(id(p), "optimizer")))
            for t in (getattr(step, "inputs", None), getattr(step, "targets", None)):
                if isinstance(t, torch.Tensor):
                    cats.setdefault(id(t.untyped_storage()), ("input", "(batch)"))
            for t in _tensors(getattr(step, "inputs", None)) + _tensors(getattr(step, "targets", None)):
                cats.setdefault(id(t.untyped_storage()), ("input", "(batch)"))
            scaler = getattr(step, "scaler", None)
            if scaler is not None:
                for t in (scaler._scale, scaler._growth_tracker):
                    if t is not None:
                        cats.setdefault(id(t.untyped_storage()), ("optimizer state", "(GradScaler)"))
        looks = {}
        if step is not None:
            for t in step.persistent_tensors():
                looks.setdefault(id(t.untyped_storage()), (list(t.shape), str(t.dtype).removeprefix("torch.")))
        self.looks: dict[int, tuple] = {}     # uid -> (shape, dtype) of an initial storage
        for key, (_ref, nbytes) in tracker.live.items():
            cat, owner = cats.get(key, ("parameter", "(persistent)"))  # e.g. QLoRA quant stats
            uid = self._new_uid(key)
            self.initial[uid] = (nbytes, cat, owner)
            if key in looks:
                self.looks[uid] = looks[key]
            self.category[uid] = cat
            self.owner[uid] = owner
        self._scan_grads()
        from torch.nn.modules import module as nn_module

        self._hooks = [nn_module.register_module_forward_pre_hook(self._pre),
                       nn_module.register_module_forward_hook(self._post)]

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._flush_pending()
        self._scan_grads()
        self._end_recompute()

    # -- module hooks ---------------------------------------------------------------------------------
    def _pre(self, module, _args):
        self.stack.append(self.names.get(id(module), type(module).__name__))

    def _post(self, module, _args, _out):
        if self.stack:
            self.stack.pop()
        if not self.stack and self.phase == "backward":
            self._end_recompute()

    def _end_recompute(self) -> None:
        for key in self._recompute:
            if key in self._live and key not in self.category:
                self.category[key] = "activation"
        self._recompute = []

    # -- called by the tracker ---------------------------------------------------------------------------
    def before_op(self, func) -> None:
        if self._pending:
            self._flush_pending()
        self.func = func

    def after_op(self, out) -> None:
        self.op_index += 1
        if self.stack and self.phase in ("forward", "loss"):
            path = self.stack[-1]
            for t in _tensors(out):
                try:
                    self._pending.append((weakref.ref(t), path))
                except TypeError:
                    pass

    def _flush_pending(self) -> None:
        for ref, path in self._pending:
            t = ref()
            node = getattr(t, "grad_fn", None) if t is not None else None
            if node is not None:
                try:
                    node.metadata.setdefault("module", path)
                except (AttributeError, RuntimeError):
                    pass
        self._pending = []

    def _new_uid(self, key: int) -> int:
        uid = self._next_uid
        self._next_uid += 1
        self.uid_of[key] = uid
        self._live.add(uid)
        return uid

    def alloc(self, key: int, tensor: torch.Tensor, nbytes: int) -> None:
        uid = self._new_uid(key)
        if self.stack:
            module = self.stack[-1]
            if self.phase == "backward":
                self._recompute.append(uid)
        elif self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                module = f"{node.metadata.get('module', '?')} ({node.name()})"
            else:
                module = "(autograd)"
        else:
            module = f"({self.phase})"
        if self.phase in ("forward", "loss"):
            self._fwd_alloc.append(uid)
        self.events.append(("a", uid, nbytes, self.op_index, self.func, module, self.phase,
                            tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")))

    def free(self, key: int) -> None:
        uid = self.uid_of.pop(key, None)
        if uid is None:
            return
        self._live.discard(uid)
        self.events.append(("f", uid, self.op_index))

    def set_phase(self, phase: str) -> None:
        self._flush_pending()
        self._scan_grads()
        if phase == "backward" and self.phase in ("forward", "loss"):
            for key in self._fwd_alloc:
                if key in self._live:
                    self.category.setdefault(key, "activation")
            self._fwd_alloc = []
        if self.phase == "backward" and phase != "backward":
            self._end_recompute()
        self.phase = phase
        self.events.append(("p", phase, self.op_index))

    def _scan_grads(self) -> None:
        step = self.step
        if step is None:
            return
        for mname, m in step.model.named_modules():
            for p in m.parameters(recurse=False):
                g = p.grad
                if g is not None:
                    uid = self.uid_of.get(id(g.untyped_storage()))
                    if uid is not None:
                        self.category[uid] = "gradient"
                        self.owner.setdefault(uid, mname or "model")

    def category_of(self, uid: int) -> str:
        return self.category.get(uid, "temporary")


def _tensors(obj) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]
