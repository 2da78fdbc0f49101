"""``errors.py`` and ``stopsignal.py`` import one way: both print notices through ``notices.py``, which imports
neither, and ``stopsignal.py`` does not reach up into ``errors.py`` (issue 33: no import circle)."""
from __future__ import annotations

import ast

from helpers import ROOT


def _imported(path) -> set[str]:
    """The sibling modules of ``scalevec_lit/`` a file imports (``from . import x``, ``from .x import y``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
    return found


def test_stopsignal_and_notices_do_not_import_errors():
    pkg = ROOT / "scalevec_lit"
    assert "errors" not in _imported(pkg / "stopsignal.py")
    assert _imported(pkg / "notices.py") == set()
    assert "notices" in _imported(pkg / "stopsignal.py")


def test_errors_reexports_the_notices():
    from scalevec_lit import errors, notices

    assert errors.notice is notices.notice and errors.is_rank_zero is notices.is_rank_zero
