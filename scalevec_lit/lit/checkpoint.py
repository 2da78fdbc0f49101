"""Deprecated alias: ``scalevec_lit.lit.checkpoint``'s names now live in ``scalevec_lit.checkpoint.verify``,
``scalevec_lit.checkpoint.match`` and ``scalevec_lit.callbacks.checkpoint``; kept for one release (0.2.0, removed in
0.3.0). The same objects. Nothing in the package imports this.

``SafeCheckpointIO`` and ``replace_directory`` are not re-exported: ``lit/`` may not import ``callbacks/``
(docs/development.md's layout table), so asking for them names their new home instead.
"""
import warnings

from ..checkpoint.match import SHAPE_KEYS, check_spec
from ..checkpoint.verify import CheckpointError, unreadable, verify_checkpoint

__all__ = ["CheckpointError", "SHAPE_KEYS", "check_spec", "unreadable", "verify_checkpoint"]

warnings.warn("scalevec_lit.lit.checkpoint is deprecated since 0.2.0 and will be removed in 0.3.0; import "
              "CheckpointError, unreadable, verify_checkpoint from scalevec_lit.checkpoint.verify, SHAPE_KEYS, "
              "check_spec from scalevec_lit.checkpoint.match and SafeCheckpointIO, replace_directory from "
              "scalevec_lit.callbacks.checkpoint instead", DeprecationWarning, stacklevel=2)


def __getattr__(name: str):
    if name in ("SafeCheckpointIO", "replace_directory"):
        raise ImportError(f"scalevec_lit.lit.checkpoint.{name} moved in 0.2.0; "
                          f"import {name} from scalevec_lit.callbacks.checkpoint instead")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
