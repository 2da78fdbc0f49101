"""scalevec_lit.callbacks: Lightning callbacks that observe and act on scale vectors.

Installed as the subpackage ``scalevec_lit.callbacks`` (YAML: ``class_path: scalevec_lit.callbacks.X``).
Callbacks read the model only through the scale registry (``scalevec_lit.scale.scale_parameters``) and
public module attributes, never private ones. Names are imported lazily (importing the package is cheap).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "ScaleVectorMonitor": "scale_monitor",
    "RoleWeightDecay": "role_decay",
    "MoELoadMonitor": "moe_monitor",
    "SafeModelCheckpoint": "checkpoint",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
