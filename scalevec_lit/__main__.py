"""python -m scalevec_lit  →  scalevec_lit.cli.main()"""
from .cli import main

main()
