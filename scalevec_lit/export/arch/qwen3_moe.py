"""Deprecated alias: ``scalevec_lit.export.arch.qwen3_moe``'s names now live in ``scalevec_lit.arch.qwen3_moe``;
kept for one release (0.2.0, removed in 0.3.0). The same objects. Nothing in the package imports this.
"""
import warnings

from ...arch.qwen3_moe import Qwen3Moe

__all__ = ["Qwen3Moe"]

warnings.warn("scalevec_lit.export.arch.qwen3_moe is deprecated since 0.2.0 and will be removed in 0.3.0; "
              "import Qwen3Moe from scalevec_lit.arch.qwen3_moe instead",
              DeprecationWarning, stacklevel=2)
