"""The scale registry: every scale parameter of a model with its (layer, site, branch, role, part).

``scale_parameters(model)`` is the one public surface that optimizer groups, role decay, the monitor,
folding and export read; nothing else decides roles and nothing matches parameter names.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from torch import nn

from .sites import ScaleInfo, ScaleSite
from .vector import ScaleVector


@dataclass(frozen=True)
class ScaleParam:
    info: ScaleInfo
    name: str  # the parameter's qualified name in the model (for checkpoints and logs only)
    param: nn.Parameter
    vector: ScaleVector  # the parameterization that owns it (call it for the effective γ)
    site: ScaleSite  # the module that owns the vector


def scale_parameters(model: nn.Module) -> Iterator[ScaleParam]:
    """Yield every scale parameter of ``model``, in module order, once each."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    seen: set[int] = set()
    for module in model.modules():
        if not isinstance(module, ScaleSite):
            continue
        for info, vector in module.scale_vectors():
            for part, param in vector.parts().items():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                full = ScaleInfo(info.layer, info.site, info.branch, info.role, part)
                yield ScaleParam(full, names.get(id(param), ""), param, vector, module)


def scale_vectors(model: nn.Module) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
    """Yield every scale vector (one entry per parameterization, not per part)."""
    for module in model.modules():
        if isinstance(module, ScaleSite):
            yield from module.scale_vectors()
