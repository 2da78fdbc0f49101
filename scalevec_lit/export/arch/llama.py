"""Deprecated alias: ``scalevec_lit.export.arch.llama``'s names now live in ``scalevec_lit.arch.llama``;
kept for one release (0.2.0, removed in 0.3.0). The same objects. Nothing in the package imports this.
"""
import warnings

from ...arch.llama import Llama

__all__ = ["Llama"]

warnings.warn("scalevec_lit.export.arch.llama is deprecated since 0.2.0 and will be removed in 0.3.0; "
              "import Llama from scalevec_lit.arch.llama instead",
              DeprecationWarning, stacklevel=2)
