"""Building a model on the meta device (shapes, no memory) when user classes compute from their arguments.

The model is first built on the meta device: at fit start (``spec.check_rebuildable``), by a sharded fit with
``model.parallel.meta_init`` (``lit/module.py``), by ``fit --print_plan`` and by every reader of a checkpoint
(``checkpoint/rebuild.py``). Under plain ``torch.device("meta")`` every tensor has a shape and no value, so a
user class whose ``__init__`` reads a value it computed from its arguments, e.g. a scale vector's
``float(torch.log(torch.tensor(init)))``, stopped with ``Tensor.item() cannot be called on meta tensors``.

``meta_device()`` is ``torch.device("meta")`` except that a tensor made from one Python number
(``torch.tensor(2.0)``, ``torch.as_tensor(2)``, ``torch.scalar_tensor(...)``) without a device is a real CPU
scalar: arithmetic on it has values, and a 0-dim CPU tensor mixes with meta tensors, so the parameters stay
on the meta device. What still needs a value there (a value read from a parameter or from a tensor of another
shape) is named by ``meta_culprit``: the user class whose code read it, and the rule.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

_FROM_NUMBER = {torch.tensor, torch.as_tensor, torch.scalar_tensor}
RULE = ("the model is first built on the meta device, where tensors have shapes but no values: in __init__, "
        "compute numbers with math (math.log(init)) or from tensors made of one Python number (torch.tensor(init)), "
        "and never read the value of a parameter or of a tensor made with a shape (torch.zeros, torch.full, ...)")


class _NumbersOnCpu(TorchFunctionMode):
    """Inside ``torch.device("meta")``: a tensor made from one Python number, with no device given, on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _FROM_NUMBER and kwargs.get("device") is None and args and \
                isinstance(args[0], (int, float, bool)):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_device() -> Iterator[None]:
    """``torch.device("meta")`` where tensors made from one Python number are CPU scalars (module docstring)."""
    with torch.device("meta"), _NumbersOnCpu():
        yield


def meta_culprit(err: BaseException) -> Optional[str]:
    """For an error raised while building on the meta device because a value was read there: the user class
    (not torch's, not this library's) whose code raised it, as ``module.QualName``; ``None`` otherwise."""
    if "meta" not in str(err).lower():
        return None
    found, tb = None, err.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module):
            cls = type(owner)
            if not cls.__module__.startswith(("torch.", "scalevec_lit.")):
                found = f"{cls.__module__}.{cls.__qualname__}"
        tb = tb.tb_next
    return found
