"""One-line notices on stderr (``note: ...``, ``warning: ...``), printed by rank zero only.

The lowest layer of the command line's messages: ``errors.py`` (user errors, exit codes) and ``stopsignal.py``
(stop signals) both print through it, and it imports neither. Plain Python: no torch, no Lightning.
"""
from __future__ import annotations

import os
import sys


def is_rank_zero() -> bool:
    return all(os.environ.get(k, "0") == "0" for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def notice(message: str, kind: str = "note") -> None:
    """One line on stderr (rank zero only): ``note: ...`` or ``warning: ...``."""
    if is_rank_zero():
        print(f"{kind}: {message}", file=sys.stderr, flush=True)
