"""A user's own model, `--module path/to/file.py:make_model`, trained by TrainingStep's step (child side).

THIS RUNS THE USER'S CODE: the file is imported as a Python module (its folder first on sys.path, so it
can import its neighbours) and the named function is called. The file defines:

    make_model() -> torch.nn.Module                          required (the name after the colon)
    make_batch(batch_size, seq_len) -> (inputs, targets)     optional (a text model: both axes)
    make_batch(batch_size) -> (inputs, targets)              or this: a model without a sequence axis
    loss_fn(output, targets) -> scalar Tensor                optional

A model without a sequence (an image or tabular model) may instead be run with `--input-shape 3x224x224`
(`input_shape`): inputs are `torch.randn(batch_size, *input_shape)` in the run's weight dtype and targets class
ids in [0, C) of the output's shape without its last dimension C (made once, from the warm-up step's output,
before anything is tracked: the step holds them as it holds any batch). It replaces make_batch (a file that
defines make_batch is refused with it).

make_model and make_batch are called with the run's device as the default device and the run's weight
dtype (float32; bfloat16 for --precision bf16) as the default dtype; under simulation they run inside
FakeTensorMode, so parameters built with torch's ordinary constructors are fakes and take no memory.
`inputs` is a Tensor (called as model(inputs)), a tuple/list (model(*inputs)) or a dict (model(**inputs)).
Defaults: without make_batch, inputs and targets are token ids in [0, V) of shape (batch_size, seq_len),
where V is the num_embeddings of the module's input embedding (`get_input_embeddings()` where the module
has it, as Hugging Face models do, else its first nn.Embedding); a module without an embedding needs
make_batch. Without loss_fn the loss is cross-entropy with the classes in the output's last dimension,
`cross_entropy(output.flatten(0, -2), targets.flatten())` (the book's calc_loss_batch for a (b, s, V)
output); an output with `.logits` (a Hugging Face ModelOutput) or a tuple contributes its logits / first
element. Checkpointing is the module's own business (build it into make_model).
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
import torch.nn.functional as F

from ..models import TORCH_DTYPES
from ..spec import TrainSpec
from .training import TrainingStep, make_optimizer


@contextmanager
def _building(device: torch.device, dtype: torch.dtype):
    """The run's device and weight dtype as torch's defaults while the user's code builds tensors."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


class ModuleError(ValueError):
    """The user's module cannot be used; the message is one line naming the file and what went wrong."""


def exception_line(exc: BaseException, path: Path | None = None) -> str:
    """`Type: first line of the message (at file.py:line)`, the location being the innermost frame in `path`
    (or, without a path, the innermost frame outside torch and this package)."""
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0][:300]}" if msg else type(exc).__name__
    where = user_frame(exc.__traceback__, path)
    return f"{text} (at {where})" if where else text


def user_frame(tb, path: Path | None = None) -> str | None:
    torch_dir = str(Path(torch.__file__).resolve().parent)
    planner_dir = str(Path(__file__).resolve().parent.parent)
    best = None
    for frame in traceback.extract_tb(tb):
        name = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else frame.filename
        if path is not None:
            if name == str(path):
                best = frame
        elif not name.startswith((torch_dir, planner_dir)) and "/importlib/" not in name:
            best = frame
    return f"{Path(best.filename).name}:{best.lineno} in {best.name}" if best else None


def load_function(path: Path, func: str) -> tuple[Callable, ModuleType]:
    """Import the file and return (its function `func`, the module)."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ModuleError(f"module file not found: {path}")
    name = "planner_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModuleError(f"{path.name} cannot be imported as a Python module (use a .py file)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    except BaseException as exc:  # noqa: BLE001 - the user's code: any failure is one line
        raise ModuleError(f"importing {path.name} failed: {exception_line(exc, path)}") from None
    fn = getattr(mod, func, None)
    if fn is None:
        raise ModuleError(f"{path.name} defines no {func}")
    if not callable(fn):
        raise ModuleError(f"{path.name}: {func} is a {type(fn).__name__}, not a function")
    return fn, mod


def batch_arity(make_batch: Callable) -> int:
    """How many positional arguments make_batch takes: 1 (batch_size: a model without a sequence) or 2."""
    import inspect

    try:
        params = [p for p in inspect.signature(make_batch).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        varargs = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(make_batch).parameters.values())
    except (TypeError, ValueError):
        return 2
    return 1 if len(params) == 1 and not varargs else 2


def input_vocab(model: torch.nn.Module) -> int | None:
    """num_embeddings of the module's input embedding, or None if it has none."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except Exception:  # noqa: BLE001 - not a Hugging Face model after all
            emb = None
        if isinstance(emb, torch.nn.Embedding):
            return emb.num_embeddings
    return next((m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)


def cast_floating(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers that are not in `dtype` are cast in place (those made under the default
    dtype already are). Module.to() cannot swap FakeTensor parameters, so each tensor's data is replaced."""
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                module._buffers[name] = b.to(dtype)


class ModuleTrainingStep(TrainingStep):
    """TrainingStep's step (accumulation, autocast, GradScaler, optimizer, phases) over a user's module."""

    def __init__(self, path: Path, func: str, spec: TrainSpec, seed: int = 0,
                 guard: Callable[[Callable[[], object]], object] = lambda call: call(),
                 input_shape: list[int] | tuple[int, ...] | None = None):
        """`guard(call)` runs each call of user code (the simulator turns fake-tensor errors into messages);
        `input_shape`: a model without a sequence, fed randn(batch_size, *input_shape) (see the module docstring)."""
        torch.manual_seed(seed)
        path = Path(path).expanduser().resolve()
        make_model, mod = load_function(path, func)
        self.cfg, self.spec = None, spec
        self.device = torch.device(spec.device)
        self.current_phase = "build"
        dtype = TORCH_DTYPES[spec.param_dtype]

        def user(call: Callable[[], object], what: str) -> object:
            try:
                return guard(call)
            except ModuleError:
                raise
            except Exception as exc:  # noqa: BLE001 - the user's code: any failure is one line
                raise ModuleError(f"{what} raised {exception_line(exc, path)}") from None

        with _building(self.device, dtype):
            model = user(make_model, f"{func}()")
        if not isinstance(model, torch.nn.Module):
            raise ModuleError(f"{func}() returned {type(model).__name__}, not a torch.nn.Module")
        user(lambda: cast_floating(model, dtype), "casting the model to the run's dtype")
        self.model = model
        self.model.train()
        if not any(True for _ in self.model.parameters()):
            raise ModuleError(f"the module from {func}() has no parameters to train")
        self.optimizer = make_optimizer(self.model.parameters(), spec)
        self.scaler = torch.amp.GradScaler(spec.device_type) if spec.precision == "fp16-amp" else None
        make_batch = getattr(mod, "make_batch", None)
        self.loss_fn = getattr(mod, "loss_fn", None)
        self.input_shape = tuple(int(n) for n in input_shape) if input_shape else None
        if self.input_shape is not None:
            if make_batch is not None:
                raise ModuleError(f"--input-shape replaces make_batch, and {path.name} defines make_batch: give one")
            with _building(self.device, dtype):
                self.inputs = torch.randn((spec.batch_size,) + self.input_shape)
            self.targets = None  # class ids from the first (warm-up) step's output: compute_loss
        elif make_batch is not None:
            one = batch_arity(make_batch) == 1
            args = (spec.batch_size,) if one else (spec.batch_size, spec.seq_len)
            with _building(self.device, dtype):
                batch = user(lambda: make_batch(*args), f"make_batch({', '.join(map(str, args))})")
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise ModuleError(f"make_batch must return (inputs, targets), got {type(batch).__name__}")
            self.inputs, self.targets = batch
            if not isinstance(self.inputs, (torch.Tensor, tuple, list, dict)):
                raise ModuleError(f"make_batch's inputs must be a Tensor, tuple, list or dict, "
                                  f"got {type(self.inputs).__name__}")
        else:
            vocab = input_vocab(self.model)
            if vocab is None:
                raise ModuleError(f"the module has no nn.Embedding to draw token ids for; define "
                                  f"make_batch(batch_size, seq_len) in {path.name}")
            shape = (spec.batch_size, spec.seq_len)
            self.inputs = torch.randint(0, vocab, shape, device=self.device)
            self.targets = torch.randint(0, vocab, shape, device=self.device)
        if self.loss_fn is None and self.input_shape is None and not isinstance(self.targets, torch.Tensor):
            raise ModuleError(f"targets must be a Tensor for the default cross-entropy loss; "
                              f"define loss_fn(output, targets) in {path.name} for other targets")
        self.current_phase = "setup"

    def compute_loss(self, on_phase: Callable[[str], None]) -> torch.Tensor:
        x = self.inputs
        out = self.model(**x) if isinstance(x, dict) else self.model(*x) if isinstance(x, (tuple, list)) else self.model(x)
        on_phase("loss")
        logits = getattr(out, "logits", None)
        if logits is None:
            logits = out[0] if isinstance(out, (tuple, list)) else out
        if self.targets is None:  # --input-shape: class ids for the output's last dimension, made once
            with torch.no_grad():
                self.targets = torch.randint(0, logits.shape[-1], logits.shape[:-1], device=logits.device)
        if self.loss_fn is not None:
            return self.loss_fn(out, self.targets)
        return F.cross_entropy(logits.flatten(0, -2), self.targets.flatten())
