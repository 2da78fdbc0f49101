"""Deprecated alias: ``scalevec_lit.export.arch.glm4_moe``'s names now live in ``scalevec_lit.arch.glm4_moe``;
kept for one release (0.2.0, removed in 0.3.0). The same objects. Nothing in the package imports this.
"""
import warnings

from ...arch.glm4_moe import Glm4Moe

__all__ = ["Glm4Moe"]

warnings.warn("scalevec_lit.export.arch.glm4_moe is deprecated since 0.2.0 and will be removed in 0.3.0; "
              "import Glm4Moe from scalevec_lit.arch.glm4_moe instead",
              DeprecationWarning, stacklevel=2)
