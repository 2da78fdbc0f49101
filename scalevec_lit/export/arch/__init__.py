"""Deprecated alias: ``scalevec_lit.export.arch`` is ``scalevec_lit.arch`` (the Hugging Face architecture adapters'
former home), kept for one release (0.2.0, removed in 0.3.0). The same objects; new code imports ``scalevec_lit.arch``.
Its submodules (``base``, ``llama``, ``qwen3``, ``qwen3_moe``, ``mixtral``, ``glm4_moe``) are aliases of
``scalevec_lit.arch``'s. Nothing in the package imports this.
"""
import warnings

from ...arch import (NATIVE_HINT, HFArchitecture, ModelFacts, Refusals, architecture, architectures, facts_of,
                     head_norm_weight, register, unregister)

__all__ = ["HFArchitecture", "ModelFacts", "NATIVE_HINT", "Refusals", "architecture", "architectures", "facts_of",
           "head_norm_weight", "register", "unregister"]

warnings.warn("scalevec_lit.export.arch is deprecated since 0.2.0 and will be removed in 0.3.0; import "
              "HFArchitecture, ModelFacts, NATIVE_HINT, Refusals, architecture, architectures, facts_of, "
              "head_norm_weight, register, unregister from scalevec_lit.arch instead", DeprecationWarning, stacklevel=2)
