"""The scale registry: every scale parameter of a model with its (layer, site, branch, role, part) and the
weights that consume it.

``scale_parameters(model)`` is the one public surface that optimizer groups, role decay, the monitor,
folding and export read; nothing else decides roles or consumers, and nothing matches parameter names.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from torch import nn

from .sites import Consumer, ScaleInfo, ScaleSite
from .vector import ScaleVector


#: The kinds of optimizer parameter groups. ``scalevec_lit.lit.optim.build_param_groups`` makes one group per
#: kind, each dict carrying ``kind`` (and ``name``); callbacks that act on groups read the names from here.
#: A callback that decays the ``scale`` groups itself marks each such group ``group[DECAYED_BY] = <its name>``,
#: so that the module can tell, from its own groups, whether anything decays scale vectors.
MATRIX, EMBEDDING, HEAD, VECTOR, SCALE = "matrix", "embedding", "head", "vector", "scale"
GROUP_KINDS = (MATRIX, EMBEDDING, HEAD, VECTOR, SCALE)
DECAYED_BY = "scale_decay_by"


@dataclass(frozen=True)
class ScaleParam:
    """One scale parameter as ``scale_parameters`` yields it: where it lives and its role (``info``, with ``part``),
    its name in the model, the parameter, the vector and the site that own it, and the weights that read it."""

    info: ScaleInfo
    name: str  # the parameter's qualified name in the model (for checkpoints and logs only)
    param: nn.Parameter
    vector: ScaleVector  # the parameterization that owns it (call it for the effective γ)
    site: ScaleSite  # the site that owns the vector
    #: the weights that read the vector (``W diag γ`` columns or ``diag u W`` rows); ``None`` when no linear
    #: map absorbs it directly (output role, a normalized u, per-expert scales)
    consumers: Optional[tuple[Consumer, ...]] = None


def scale_sites(model: nn.Module) -> Iterator[ScaleSite]:
    """Every scale site of ``model``, in module order."""
    for module in model.modules():
        if isinstance(module, ScaleSite):
            yield module


def scale_parameters(model: nn.Module) -> Iterator[ScaleParam]:
    """Yield every scale parameter of ``model``, in module order, once each."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    seen: set[int] = set()
    for site in scale_sites(model):
        for info, vector in site.scale_vectors():
            consumers = site.consumers(vector)
            for part, param in vector.parts().items():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                full = ScaleInfo(info.layer, info.site, info.branch, info.role, part)
                yield ScaleParam(full, names.get(id(param), ""), param, vector, site,
                                 tuple(consumers) if consumers is not None else None)
