"""scalevec_lit: pre-train dense and MoE language models with first-class scale vectors.

Layers, one way: ``cli`` → ``lit`` (LightningModule) → ``model`` (plain torch) → ``scale`` (plain torch).
``scalevec_lit.callbacks`` (the top-level ``callbacks/`` folder of the repository) observes the module
through the scale registry.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"


class _SourceCallbacksFinder(importlib.abc.MetaPathFinder):
    """In a source checkout, ``scalevec_lit.callbacks`` lives in the top-level ``callbacks/`` folder (an
    installed wheel copies it into the package). This finder maps the name to the folder, exactly as the
    packaging's ``package-dir`` does, so running from the repository root works the same."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != f"{__name__}.callbacks":
            return None
        return importlib.util.spec_from_file_location(
            fullname, self.folder / "__init__.py", submodule_search_locations=[str(self.folder)]
        )


_here = Path(__file__).resolve().parent
_src_callbacks = _here.parent / "callbacks"
if not (_here / "callbacks").is_dir() and (_src_callbacks / "__init__.py").is_file():
    sys.meta_path.insert(0, _SourceCallbacksFinder(_src_callbacks))
