"""scalevec_lit.callbacks: Lightning callbacks that observe and act on scale vectors.

Installed as the subpackage ``scalevec_lit.callbacks`` (YAML: ``class_path: scalevec_lit.callbacks.X``).
Callbacks read the model only through the scale registry (``scalevec_lit.scale.scale_parameters``) and
public module attributes, never private ones.

Names load lazily (importing the package is cheap): ``scalevec_lit.callbacks.X`` is the ``X`` of whichever
module of this folder lists it in its ``__all__``. A new callback is a new module with an ``__all__``;
nothing else to register.
"""
from __future__ import annotations

import importlib
import pkgutil


def _modules() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


def __getattr__(name: str):
    if not name.startswith("_"):
        for module_name in _modules():
            module = importlib.import_module(f"{__name__}.{module_name}")
            if name in getattr(module, "__all__", ()):
                return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    names = []
    for module_name in _modules():
        names += getattr(importlib.import_module(f"{__name__}.{module_name}"), "__all__", [])
    return sorted(names)
