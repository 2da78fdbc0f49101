"""``ExportError``: the user-facing error of reading, rebuilding and exporting a checkpoint (names the key, value
or path and the fix). ``export/errors.py`` re-exports it beside its own ``HFExportError``.

Imports nothing; must not import torch, Lightning or transformers.
"""
from __future__ import annotations


class ExportError(ValueError):
    """A user-facing checkpoint or export error: names the key, value or path and the fix."""
