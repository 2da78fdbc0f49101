"""Checkpoint verification without Lightning: every command that reads a checkpoint calls
``verify_checkpoint`` first (fit/validate/test ``--ckpt_path`` through ``SafeCheckpointIO``, ``export``).

A single-file checkpoint is a torch zip archive: its structure and the CRC32 of every member are checked
(one read of the file), so a truncated file or a flipped byte is refused with the file named, never loaded.
A distributed checkpoint folder must hold its shards.
"""
from __future__ import annotations

import zipfile
from pathlib import Path


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: truncated, corrupt, or from another model (exit 1)."""


class MissingCheckpointError(CheckpointError):
    """The checkpoint named on the command line does not exist (exit 2)."""


def unreadable(path: str | Path, err: BaseException) -> CheckpointError:
    folder = Path(path).parent
    others = sorted(p.name for p in folder.glob("*.ckpt") if p != Path(path)) if folder.is_dir() else []
    hint = f"resume from another checkpoint in {folder} ({', '.join(others[-3:])})" if others else "start afresh"
    return CheckpointError(f"checkpoint {str(path)!r} is truncated or corrupt ({type(err).__name__}: {err}); {hint}")


def verify_checkpoint(path: str | Path, full: bool = True) -> Path:
    """Check that ``path`` is a complete torch checkpoint; ``full`` also checks every member's CRC32
    (reads the whole file once). Raises ``CheckpointError`` naming the file."""
    p = Path(path)
    if not p.exists():
        raise MissingCheckpointError(f"--ckpt_path: {str(path)!r}: no such checkpoint; check the path, or use "
                                     "--ckpt_path last to resume the newest checkpoint of this run's folder")
    if p.is_dir():
        if not any(p.glob("*.distcp")) and not (p / "meta.pt").exists():
            raise unreadable(p, ValueError("a folder without distributed checkpoint shards (*.distcp)"))
        return p
    if not zipfile.is_zipfile(p):
        raise unreadable(p, ValueError("not a complete torch zip archive"))
    if full:
        try:
            with zipfile.ZipFile(p) as zf:
                bad = zf.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise unreadable(p, err) from err
        if bad is not None:
            raise unreadable(p, ValueError(f"checksum mismatch in member {bad!r}"))
    return p
