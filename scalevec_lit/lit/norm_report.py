"""The fit-start report of norm gains that are not scale vectors.

A 1-D parameter of a normalization module (``nn.RMSNorm``, ``nn.LayerNorm``, ``nn.GroupNorm``, a batch or
instance norm, or any module whose class name contains ``Norm``) that the scale registry does not hold trains as
a plain ``vector`` parameter: it has no role, no monitor tags and no role decay, and it is never folded.
``unregistered_norm_gains(model)`` finds them; ``report_unregistered_norm_gains(model)`` prints one warning that
names them (``blocks.*`` for the same parameter in every layer) and how to declare them:
``scalevec_lit.scale.OutputNorm`` for a norm on a sublayer's output, a ``scalevec_lit.scale.NormSite`` for a
norm that linear maps read. Scale sites and scale vectors themselves are never reported.

Plain torch (+ ``scalevec_lit.errors``): must not import Lightning.
"""
from __future__ import annotations

import re

from torch import nn

from ..errors import notice
from ..scale.registry import scale_parameters
from ..scale.sites import ScaleSite
from ..scale.vector import ScaleVector

_NORM_TYPES = (nn.RMSNorm, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase)
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
HOW = ("declare a norm on a sublayer's output as scalevec_lit.scale.OutputNorm(dim, strategy, layer=layer, "
       "site='<name>'), and a norm read by linear maps as a scalevec_lit.scale.NormSite whose branches are those maps "
       "(docs/subclassing.md)")


def _is_norm(module: nn.Module) -> bool:
    if isinstance(module, (ScaleSite, ScaleVector)):
        return False
    return isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower()


def _clean(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def unregistered_norm_gains(model: nn.Module) -> list[tuple[str, str]]:
    """``(parameter name, norm class name)`` of every 1-D parameter of a norm module that is not a scale vector,
    in module order, each parameter once."""
    registered = {id(sp.param) for sp in scale_parameters(model)}
    seen: set[int] = set()
    found = []
    for module_name, module in model.named_modules():
        if not _is_norm(module):
            continue
        for name, param in module.named_parameters(recurse=False):
            if param.ndim != 1 or id(param) in registered or id(param) in seen:
                continue
            seen.add(id(param))
            cls = next(c for c in type(module).__mro__ if not c.__module__.startswith("torch.distributed"))
            found.append((_clean(f"{module_name}.{name}" if module_name else name), cls.__name__))
    return found


def describe_unregistered(found: list[tuple[str, str]]) -> str:
    """The report's text: each parameter name once per layer pattern (``blocks.*.x.weight (RMSNorm, ×4)``)."""
    groups: dict[tuple[str, str], int] = {}
    for name, cls in found:
        key = (re.sub(r"^blocks\.\d+\.", "blocks.*.", name), cls)
        groups[key] = groups.get(key, 0) + 1
    names = ", ".join(f"{name} ({cls}{f', ×{n}' if n > 1 else ''})" for (name, cls), n in groups.items())
    return (f"norm gains that are not scale vectors: {names}; they train as plain vector parameters (no role, no "
            f"scale/ monitor tags, no role decay, never folded); {HOW}")


def report_unregistered_norm_gains(model: nn.Module) -> list[tuple[str, str]]:
    """Print one warning (rank zero) naming the norm gains that are not scale vectors; returns them."""
    found = unregistered_norm_gains(model)
    if found:
        notice(describe_unregistered(found), kind="warning")
    return found
