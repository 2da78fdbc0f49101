"""The export errors: ``ExportError`` (user-facing, names the key, value or path and the fix; defined by
``checkpoint/``, whose reading errors it also names) and ``HFExportError`` (no standard transformers
architecture holds the model).

Imports only ``checkpoint/errors.py``; must not import Lightning or transformers.
"""
from __future__ import annotations

from ..checkpoint.errors import ExportError

__all__ = ["ExportError", "HFExportError"]


class HFExportError(ExportError):
    """The model has a site that no standard transformers architecture holds."""
