"""Deprecated alias: ``scalevec_lit.export.hf_names``'s names now live in ``scalevec_lit.arch.names``;
kept for one release (0.2.0, removed in 0.3.0). The same objects. Nothing in the package imports this.
"""
import warnings

from ..arch.names import Ref, native_tensor, site_of

__all__ = ["Ref", "native_tensor", "site_of"]

warnings.warn("scalevec_lit.export.hf_names is deprecated since 0.2.0 and will be removed in 0.3.0; "
              "import Ref, native_tensor, site_of from scalevec_lit.arch.names instead",
              DeprecationWarning, stacklevel=2)
