"""The child side: the real steps (training, loading, a user's module), run only in a child process."""
from __future__ import annotations


def build_model(cfg, device="cpu", dtype: str = "float32"):
    """Instantiate the model for `cfg` directly in `dtype` on `device` ("meta" allocates nothing): its
    architecture file (planner/arch) says how.

    Building in the target dtype (rather than `.to(dtype)` afterwards) never holds an fp32 and a bf16
    copy at once, and gives the same parameter and buffer dtypes.
    """
    from ..arch import family_of

    return family_of(cfg).build(cfg, device, dtype)


def fake_mode_of(model):
    """The FakeTensorMode a simulated model's parameters belong to (planner/measure/simulate.py), else None."""
    from torch._subclasses.fake_tensor import FakeTensor

    p = next(model.parameters(), None)
    return p.fake_mode if isinstance(p, FakeTensor) else None
