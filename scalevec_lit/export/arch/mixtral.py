"""Deprecated alias: ``scalevec_lit.export.arch.mixtral``'s names now live in ``scalevec_lit.arch.mixtral``;
kept for one release (0.2.0, removed in 0.3.0). The same objects. Nothing in the package imports this.
"""
import warnings

from ...arch.mixtral import Mixtral

__all__ = ["Mixtral"]

warnings.warn("scalevec_lit.export.arch.mixtral is deprecated since 0.2.0 and will be removed in 0.3.0; "
              "import Mixtral from scalevec_lit.arch.mixtral instead",
              DeprecationWarning, stacklevel=2)
