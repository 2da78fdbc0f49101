"""Checkpoint verification without Lightning: every command that reads a checkpoint calls
``verify_checkpoint`` first (fit/validate/test ``--ckpt_path`` through ``SafeCheckpointIO``, ``export``).

A single-file checkpoint is a torch zip archive: its structure and the CRC32 of every member are checked
(one read of the file), so a truncated file or a flipped byte is refused with the file named, never loaded.
The structure is checked twice, by Python's ``zipfile`` and by torch's own reader (they read the end of the
archive differently: a damaged zip64 locator passes the first and stops the second). A distributed checkpoint
folder must hold its shards, whole and with the checksums recorded when it was written (``folder.py``); a
folder of ``.ckpt`` files is not a checkpoint, and the error names its newest.
A member name that is not valid UTF-8 is refused like any other damage. ``write_failure`` turns a checkpoint
write that ran out of room (torch says ``unexpected pos``) into one line with the fix.
"""
from __future__ import annotations

import errno
import os
import zipfile
from pathlib import Path
from typing import Optional

from .folder import folder_problem


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: truncated, corrupt, or from another model (exit 1)."""


class MissingCheckpointError(CheckpointError):
    """The checkpoint named on the command line does not exist (exit 2)."""


class MismatchedCheckpointError(CheckpointError):
    """A sound checkpoint of another model than the recipe's (exit 2: it does not fit the recipe)."""


def unreadable(path: str | Path, err: BaseException) -> CheckpointError:
    folder = Path(path).parent
    others = sorted(p.name for p in folder.glob("*.ckpt") if p != Path(path)) if folder.is_dir() else []
    hint = f"resume from another checkpoint in {folder} ({', '.join(others[-3:])})" if others else "start afresh"
    return CheckpointError(f"checkpoint {str(path)!r} is truncated or corrupt ({type(err).__name__}: {err}); {hint}")


def checkpoint_files(folder: Path) -> list[Path]:
    """The ``.ckpt`` files (and distributed checkpoint folders) in ``folder``, oldest first."""
    found = [q for q in folder.iterdir() if q.suffix == ".ckpt" and not q.name.endswith(".tmp")]
    return sorted(found, key=lambda q: (q.stat().st_mtime, q.name))


def verify_checkpoint(path: str | Path, full: bool = True) -> Path:
    """Check that ``path`` is a complete torch checkpoint; ``full`` also checks every member's CRC32
    (reads the whole file once). Raises ``CheckpointError`` naming the file."""
    p = Path(path)
    if "://" in str(path) and not p.exists():  # Path("s3://b/x") is the local s3:/b/x
        raise MissingCheckpointError(f"--ckpt_path: {str(path)!r}: a URL: checkpoints are read from a file system, "
                                     "not from a bucket; copy it to a local or shared folder and give that path")
    if not p.exists():
        raise MissingCheckpointError(f"--ckpt_path: {str(path)!r}: no such checkpoint; check the path, or use "
                                     "--ckpt_path last to resume the newest checkpoint of this run's folder")
    if p.is_dir():
        if not any(p.glob("*.distcp")) and not (p / "meta.pt").exists():
            files = checkpoint_files(p)
            if files:
                raise MissingCheckpointError(
                    f"--ckpt_path: {str(path)!r}: is a folder of {len(files)} checkpoint(s), not a checkpoint; give "
                    f"one of them (the newest is {str(files[-1])!r}), or --ckpt_path last to resume the newest "
                    "checkpoint of this run's own folder")
            raise unreadable(p, ValueError("a folder without distributed checkpoint shards (*.distcp)"))
        problem = folder_problem(p, full=full)  # its shards whole, its checksums (``folder.py``)
        if problem is not None:
            raise unreadable(p, ValueError(problem))
        return p
    try:
        is_zip = zipfile.is_zipfile(p)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:  # a damaged end record can raise here
        raise unreadable(p, err) from None
    if not is_zip:
        raise unreadable(p, ValueError("not a complete torch zip archive"))
    try:
        import torch

        torch._C.PyTorchFileReader(str(p))  # reads only the end of the archive, as torch.load will
    except (RuntimeError, OSError) as err:
        raise unreadable(p, ValueError(f"torch cannot open the zip archive: {str(err).split('. ')[0]}")) from None
    try:
        with zipfile.ZipFile(p) as zf:  # reads the directory (its member names); ``full``: every member's CRC
            bad = zf.testzip() if full else None
    except UnicodeDecodeError as err:  # a damaged byte in a member name (torch's names are flagged UTF-8)
        raise unreadable(p, ValueError(f"a member name in its zip directory is not valid UTF-8 (byte "
                                       f"{err.object[err.start:err.start + 1].hex()} at {err.start})")) from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise unreadable(p, err) from err
    if bad is not None:
        raise unreadable(p, ValueError(f"checksum mismatch in member {bad!r}"))
    return p


#: errno of a write that ran out of room: the device (ENOSPC), a quota (EDQUOT), a file-size limit (EFBIG)
OUT_OF_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _causes(err: BaseException, limit: int = 32):
    """``err``, its causes and contexts, and each rank's error inside torch's ``CheckpointException``
    (``failures``: rank -> (exception, traceback)), which is how a distributed checkpoint write fails."""
    stack, seen = [err], 0
    while stack and seen < limit:
        cause = stack.pop()
        seen += 1
        yield cause
        stack.extend(c for c in (cause.__context__, cause.__cause__) if c is not None)
        for failure in (getattr(cause, "failures", None) or {}).values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException):
                stack.append(inner)


def write_failure(err: BaseException, path: str | Path) -> Optional[Exception]:
    """The one-line ``RunError`` for a checkpoint write that ran out of room, or ``None``. torch's zip writer
    reports a short write as ``RuntimeError('... unexpected pos ...')``, with the ``OSError`` as its context;
    a distributed (DCP) write as a ``CheckpointException`` holding each rank's ``OSError``."""
    from ..errors import RunError

    causes = list(_causes(err))
    cause = next((c for c in causes if isinstance(c, OSError) and c.errno in OUT_OF_ROOM), None)
    path = Path(path)
    if cause is not None:
        room = (f"the file outgrew the largest file allowed there (a file-size limit: `ulimit -f`, or the file "
                f"system's own) while writing it in {path.parent}" if cause.errno == errno.EFBIG else
                f"no space left on the device of {path.parent} while writing it")
        room = f"{room} ({os.strerror(cause.errno)})"
    elif any(isinstance(c, RuntimeError) and "unexpected pos" in str(c) for c in causes) and \
            any(getattr(c, "failures", None) for c in causes):
        # a DCP write: each rank's error reaches the others pickled, without the OSError it had as context
        room = (f"a shard's write stopped short in {path.parent} (torch: 'unexpected pos'): no space left on its "
                "device, or a file-size limit or quota reached")
    else:
        return None
    return RunError("checkpoint", str(path), f"{room}; the checkpoints written before "
                    "are intact", "free space there, or point the checkpoints elsewhere "
                    "(--trainer.default_root_dir=<a folder with room>), then resume with --ckpt_path last")
