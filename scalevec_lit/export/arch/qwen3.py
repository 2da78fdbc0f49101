"""Deprecated alias: ``scalevec_lit.export.arch.qwen3``'s names now live in ``scalevec_lit.arch.qwen3``;
kept for one release (0.2.0, removed in 0.3.0). The same objects. Nothing in the package imports this.
"""
import warnings

from ...arch.qwen3 import Qwen3

__all__ = ["Qwen3"]

warnings.warn("scalevec_lit.export.arch.qwen3 is deprecated since 0.2.0 and will be removed in 0.3.0; "
              "import Qwen3 from scalevec_lit.arch.qwen3 instead",
              DeprecationWarning, stacklevel=2)
