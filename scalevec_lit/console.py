"""The ``scalevec-lit`` console script: the same as ``python -m scalevec_lit`` (``__main__.py``).

``cli.main`` returns the ``ScaleVecCLI`` of a ``fit`` (for in-process use); a console script hands what its
function returns to ``sys.exit``, which would print that object and exit with 1 after a good run. This
returns the command's exit code instead, and installs the stop-signal handlers before the heavy imports,
as ``python -m scalevec_lit`` does.
"""
from __future__ import annotations

import sys


def main() -> int:
    from . import stopsignal

    stopsignal.install_for_imports(next((a for a in sys.argv[1:] if not a.startswith("-")), None))
    from .cli import main as run

    result = run()
    return result if isinstance(result, int) else 0
