"""``scalevec_lit.export.arch``: the Hugging Face architecture adapters' former home, kept for existing scripts
(``scalevec_lit.export.arch.register(MyArchitecture)`` still works). The adapters live in ``scalevec_lit.arch``;
this module re-exports its public names, the same objects: new code imports ``scalevec_lit.arch``.
"""
from ..arch import (NATIVE_HINT, HFArchitecture, ModelFacts, Refusals, architecture, architectures, facts_of,
                    head_norm_weight, register, unregister)

__all__ = ["HFArchitecture", "ModelFacts", "NATIVE_HINT", "Refusals", "architecture", "architectures", "facts_of",
           "head_norm_weight", "register", "unregister"]
