"""``python -m scalevec_lit.export ...`` → ``main()`` (as ``python -m scalevec_lit export ...``)."""
from .cli import main

if __name__ == "__main__":
    import sys

    from ..errors import run_guarded

    run_guarded(main, sys.argv[1:])
