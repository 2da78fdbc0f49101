"""Deprecated alias: ``scalevec_lit.export.checkpoint``'s names now live in ``scalevec_lit.checkpoint``
(``read.py`` and ``rebuild.py``); kept for one release (0.2.0, removed in 0.3.0). The same objects. Nothing in the
package imports this.
"""
import warnings

from ..checkpoint import NATIVE_SPEC, load_model, model_from_state, read_checkpoint, read_checkpoint_extra

__all__ = ["NATIVE_SPEC", "load_model", "model_from_state", "read_checkpoint", "read_checkpoint_extra"]

warnings.warn("scalevec_lit.export.checkpoint is deprecated since 0.2.0 and will be removed in 0.3.0; import "
              "NATIVE_SPEC, load_model, model_from_state, read_checkpoint, read_checkpoint_extra from "
              "scalevec_lit.checkpoint instead", DeprecationWarning, stacklevel=2)
