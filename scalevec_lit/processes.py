"""Whether a process is still running, by its id: what tells a stale lock (``runlock.py``) or a temporary file
left by a killed command (``outdir.py``, ``data/cache.py``) from one in use.

Plain Python: must not import torch or Lightning.
"""
from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists (ours or another user's) and is not a zombie (ended, not yet
    reaped by its parent). An id that no process can have (0 or less, or past the largest) runs nothing."""
    if pid <= 0:  # os.kill would signal a process group (0) or every process (-1)
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's
        return True
    try:  # "<pid> (<name>) <state> ...": the name may hold ") " itself
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):  # no /proc (another system), or ended meanwhile: os.kill said it was there
        return True
