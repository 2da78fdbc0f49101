"""Deprecated alias: ``scalevec_lit.export.arch.base``'s names now live in ``scalevec_lit.arch.base``;
kept for one release (0.2.0, removed in 0.3.0). The same objects. Nothing in the package imports this.
"""
import warnings

from ...arch.base import UNSUPPORTED, HFArchitecture, refuse

__all__ = ["UNSUPPORTED", "HFArchitecture", "refuse"]

warnings.warn("scalevec_lit.export.arch.base is deprecated since 0.2.0 and will be removed in 0.3.0; "
              "import UNSUPPORTED, HFArchitecture, refuse from scalevec_lit.arch.base instead",
              DeprecationWarning, stacklevel=2)
