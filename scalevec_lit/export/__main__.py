"""``python -m scalevec_lit.export ...`` → ``main()`` (as ``python -m scalevec_lit export ...``)."""
from .cli import main

if __name__ == "__main__":
    main()
