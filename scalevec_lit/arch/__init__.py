"""Hugging Face architectures, one adapter each: the only place that knows a transformers architecture.

Each file of this package (other than ``base``, ``names`` and the private ``_plan`` and ``_registry``) holds one
adapter, an ``HFArchitecture`` subclass decorated with ``@register``: its weight names both ways, its
``config.json`` both ways, and what it holds or refuses (the fold plan); the registry itself is
``_registry.py``, the native side of the name table ``names.py``. Export (``export/hf.py``,
``export/hf_plan.py``) and reading a Hugging Face folder (``checkpoint/hf.py``, for ``import``, ``inspect`` and
``evaluate``) read only the registry below, so adding an architecture is one new file here; an adapter defined
elsewhere (user code) is added by calling ``scalevec_lit.arch.register`` on it.

Imports only ``scale/``, ``model/`` and ``errors.py``. Plain torch: must not import Lightning or transformers.
"""
from __future__ import annotations

from ._plan import NATIVE_HINT, ModelFacts, Refusals, facts_of, head_norm_weight
from ._registry import REGISTRY as _REGISTRY
from ._registry import architecture, architectures, unregister
from .base import HFArchitecture


def register(cls: type[HFArchitecture]) -> type[HFArchitecture]:
    """Add the adapter ``cls`` (a class decorator; returns ``cls``). ``cls`` is an ``HFArchitecture`` subclass with
    ``architecture`` and ``title`` set (else ``TypeError``); the registry holds one instance of it, made with no
    argument, and export and import consider it with the shipped ones, by ``priority``. Registering the same class
    again replaces it; another class with its architecture name is refused (``ValueError``: ``unregister`` first)."""
    if not (isinstance(cls, type) and issubclass(cls, HFArchitecture)) or not cls.architecture or not cls.title:
        raise TypeError(f"register: {cls!r} is not an HFArchitecture subclass with architecture and title set")
    old = _REGISTRY.get(cls.architecture)
    if old is not None and _qualified(type(old)) != _qualified(cls):  # the same class re-imported replaces itself
        raise ValueError(f"register: {cls.architecture} is already registered by {_qualified(type(old))}; "
                         f"unregister({cls.architecture!r}) first to replace it")
    _REGISTRY[cls.architecture] = cls()
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


__all__ = ["HFArchitecture", "ModelFacts", "NATIVE_HINT", "Refusals", "architecture", "architectures", "facts_of",
           "head_norm_weight", "register", "unregister"]
