"""scalevec_lit: pre-train dense and MoE language models with first-class scale vectors.

Layers, one way: ``cli`` → ``lit`` (LightningModule) → ``model`` (plain torch) → ``scale`` (plain torch).
``scalevec_lit.callbacks`` (the top-level ``callbacks/`` folder of the repository) observes the module
through the scale registry.
"""
from __future__ import annotations

from pathlib import Path

__version__ = "0.2.0"

# ``scalevec_lit.callbacks`` is the repository's top-level ``callbacks/`` folder. A wheel copies it into the
# package and an editable install maps it (both through ``package-dir`` in pyproject.toml); a plain source
# checkout (the repository on PYTHONPATH) gets the same name by searching the repository root for
# subpackages too, after this folder: a one-line search path, not an import hook.
_here = Path(__file__).resolve().parent
if not (_here / "callbacks").is_dir() and (_here.parent / "callbacks" / "__init__.py").is_file():
    __path__.append(str(_here.parent))
