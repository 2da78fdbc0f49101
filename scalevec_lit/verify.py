"""Deprecated alias: ``scalevec_lit.verify``'s names now live in ``scalevec_lit.checkpoint.verify``; kept for one
release (0.2.0, removed in 0.3.0). The same objects. Nothing in the package imports this.
"""
import warnings

from .checkpoint.verify import (OUT_OF_ROOM, CheckpointError, MismatchedCheckpointError, MissingCheckpointError,
                                checkpoint_files, unreadable, verify_checkpoint, write_failure)

__all__ = ["OUT_OF_ROOM", "CheckpointError", "MismatchedCheckpointError", "MissingCheckpointError", "checkpoint_files",
           "unreadable", "verify_checkpoint", "write_failure"]

warnings.warn("scalevec_lit.verify is deprecated since 0.2.0 and will be removed in 0.3.0; import OUT_OF_ROOM, "
              "CheckpointError, MismatchedCheckpointError, MissingCheckpointError, checkpoint_files, unreadable, "
              "verify_checkpoint, write_failure from scalevec_lit.checkpoint.verify instead",
              DeprecationWarning, stacklevel=2)
