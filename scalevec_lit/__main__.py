"""python -m scalevec_lit  →  scalevec_lit.cli.main()

The stop signals are handled before anything heavy is imported (Lightning takes seconds), so Ctrl-C or
SIGTERM at any moment is one line and exit code 128 + the signal (``stopsignal.py``). While the modules are
imported nothing has been written, and an exception raised in the middle of a library's import can turn
into another error (numpy retries a failed import until the recursion limit), so a signal then ends the
process at once, after its line.
"""
import sys

from . import stopsignal

stopsignal.install_for_imports(next((a for a in sys.argv[1:] if not a.startswith("-")), None))
from .cli import main  # noqa: E402 - after the handlers, on purpose

result = main()
sys.exit(result if isinstance(result, int) else 0)  # a command's exit code (`study run`), not dropped
