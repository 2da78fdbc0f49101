"""One-line notices on stderr (``note: ...``, ``warning: ...``), printed by rank zero only.

The lowest layer of the command line's messages: ``errors.py`` (user errors, exit codes) and ``stopsignal.py``
(stop signals) both print through it, and it imports neither. Plain Python: no torch, no Lightning.
"""
from __future__ import annotations

import os
import sys


def is_rank_zero() -> bool:
    return all(os.environ.get(k, "0") == "0" for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def notice(message: str, kind: str = "note", every_rank: bool = False) -> None:
    """One line on stderr (rank zero only): ``note: ...`` or ``warning: ...``. ``every_rank``: about this
    process alone, printed by every rank, another rank's line naming it (``warning: rank 3: ...``)."""
    if is_rank_zero():
        print(f"{kind}: {message}", file=sys.stderr, flush=True)
    elif every_rank:
        rank = next(os.environ[k] for k in ("RANK", "SLURM_PROCID", "LOCAL_RANK") if os.environ.get(k, "0") != "0")
        print(f"{kind}: rank {rank}: {message}", file=sys.stderr, flush=True)
