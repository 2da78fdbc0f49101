"""The command-line options ``import`` and ``convert`` share (``--allow-function-change``, ``--tokenizer``,
``--overwrite``), each command giving its own words where the meaning differs.

Imports nothing of the package.
"""
from __future__ import annotations

import argparse


def add_output_options(parser: argparse.ArgumentParser, *, function_change: str, tokenizer: str) -> None:
    """Add ``--allow-function-change`` (help ``function_change``), ``--tokenizer`` (help ``tokenizer``) and
    ``--overwrite`` to ``parser``."""
    parser.add_argument("--allow-function-change", action="store_true", help=function_change)
    parser.add_argument("--tokenizer", default=None, help=tokenizer)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export/import/convert in --out (removes only the files its manifest "
                             "lists; other files stay)")
