"""The registry of Hugging Face adapters: the registered instances by architecture name, and the discovery of
the shipped ones (every module of this package other than ``base``, ``names`` and the private ones registers
its own).

Below ``base.py`` (whose refusals name the other architectures) and the package's ``__init__`` (which adds
to it through ``register``, the one place that checks what is added): imports nothing from either.
"""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Optional

#: architecture name (``'LlamaForCausalLM'``) -> its adapter (an ``HFArchitecture`` instance)
REGISTRY: dict = {}
_discovered = False
_NOT_ADAPTERS = ("base", "names")  # the base class and the native side of the name table


def unregister(architecture: str) -> None:
    """Remove an adapter (nothing when there is none of that name)."""
    REGISTRY.pop(architecture, None)


def architectures() -> list:
    """Every registered adapter, by ``priority`` (then registration order)."""
    _discover()
    return sorted(REGISTRY.values(), key=lambda a: a.priority)


def architecture(name: str) -> Optional[object]:
    """The adapter of the transformers class ``name`` (``'LlamaForCausalLM'``), None when none."""
    _discover()
    return REGISTRY.get(name)


def _discover() -> None:
    """Import every module of this package once (each registers its adapter)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name not in _NOT_ADAPTERS and not info.name.startswith("_"):
            importlib.import_module(f"{__package__}.{info.name}")
