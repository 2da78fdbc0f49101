"""python -m scalevec_lit  →  scalevec_lit.cli.main()

The stop signals are handled before anything heavy is imported (Lightning takes seconds), so Ctrl-C or
SIGTERM at any moment is one line and exit code 128 + the signal (``stopsignal.py``).
"""
import sys

from . import stopsignal

stopsignal.install(next((a for a in sys.argv[1:] if not a.startswith("-")), None))
try:
    from .cli import main
except (stopsignal.StopSignal, KeyboardInterrupt) as err:
    stop = err if isinstance(err, stopsignal.StopSignal) else stopsignal.StopSignal(2)
    print(f"error: {stop}", file=sys.stderr, flush=True)
    raise SystemExit(stop.exit_code) from None

main()
