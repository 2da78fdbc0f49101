"""The export errors: ``ExportError`` (user-facing, names the key, value or path and the fix) and
``HFExportError`` (no standard transformers architecture holds the model).

Imports nothing (the other export modules import it); must not import torch, Lightning or transformers.
"""
from __future__ import annotations


class ExportError(ValueError):
    """A user-facing export error: names the key, value or path and the fix."""


class HFExportError(ExportError):
    """The model has a site that no standard transformers architecture holds."""
