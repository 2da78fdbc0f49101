"""A distributed (DCP) checkpoint folder checked before it is read: every file it needs is there and whole,
and no byte has changed since it was written.

- **Structure** (any DCP folder, also one written before this check existed): ``.metadata`` is readable and
  every shard file it names is there and at least as long as the bytes it says that file holds; ``meta.pt``
  (Lightning's loop state) is a complete torch zip archive.
- **Checksums** (folders ``SafeModelCheckpoint`` writes): ``checksums.json`` records the size and CRC32 of
  every file, computed after every rank has written and before the folder is renamed into place; a read
  checks them (``full``), so a flipped byte in a shard is refused instead of resumed into other weights.

The work can be shared out: ``rank`` of ``world`` hashes and checks every ``world``-th file (sorted by name),
so each process reads about 1/``world`` of the folder.

How much is hashed is ``verify`` (``SafeModelCheckpoint(verify=...)``, at the save and at the resume):
``checksums`` every file's CRC32; ``sizes`` the sizes only (``checksums.json`` holds ``{"sizes": ...}``; a
resume checks sizes and structure, never reads the files); ``auto`` (default) CRC32s when the folder holds at
most ``AUTO_CHECKSUM_BYTES`` per process, sizes above (the CRC32 runs at about 1.25 GB/s per rank: a 24 GB
folder on 8 ranks would cost about 2.4 s per rank per save and a second read of the whole folder at the
resume: ``benchmarks/checkpoint_checksums.py``).
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Optional

#: the file of a DCP folder that holds every other file's size and CRC32
CHECKSUMS = "checksums.json"
_BLOCK = 1 << 24
VERIFY_MODES = ("auto", "sizes", "checksums")
#: ``verify=auto`` records and checks CRC32s for a folder of at most this many bytes per process (each hashes
#: its share: about 1.7 s at 1.25 GB/s), sizes only above it
AUTO_CHECKSUM_BYTES = 2 << 30


def crc32_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS)


def check_verify(verify: str, key: str = "SafeModelCheckpoint.verify") -> str:
    """``verify`` if it is one of ``VERIFY_MODES``, else the one-line ``UserError`` naming ``key``."""
    if verify not in VERIFY_MODES:
        from ..errors import UserError

        limit = f"{AUTO_CHECKSUM_BYTES >> 30} GiB per process"
        raise UserError(key, verify, f"not one of {', '.join(VERIFY_MODES)}", "use auto (the default: CRC32s for a "
                        f"checkpoint folder of at most {limit}), sizes or checksums")
    return verify


def hashes(folder: str | Path, verify: str = "auto", world: int = 1) -> bool:
    """Whether ``verify`` hashes the files of ``folder`` shared out over ``world`` processes (``auto``: the folder
    holds at most ``AUTO_CHECKSUM_BYTES`` per process; a ``stat`` of each file, nothing read)."""
    if check_verify(verify) != "auto":
        return verify == "checksums"
    folder = Path(folder)
    return sum((folder / name).stat().st_size for name in _files(folder)) <= AUTO_CHECKSUM_BYTES * max(1, world)


def _entry(path: Path, crc: bool) -> list[int]:
    return [path.stat().st_size, crc32_of(path)] if crc else [path.stat().st_size]


def checksum_share(folder: str | Path, rank: int = 0, world: int = 1, crc: bool = True) -> dict[str, list[int]]:
    """``{file name: [size, crc32]}`` of this rank's share of the files in ``folder`` (``crc=False``:
    ``[size]``, nothing read)."""
    folder = Path(folder)
    return {name: _entry(folder / name, crc) for name in _files(folder)[rank::max(1, world)]}


def write_checksums(folder: str | Path, shares: list[dict[str, list[int]]]) -> None:
    """Write ``checksums.json`` from the ranks' shares: the CRC32s when every share holds them, else the sizes
    only; a file no share covers (a listing that lagged on a shared file system) is measured here."""
    folder = Path(folder)
    entries: dict[str, list[int]] = {}
    for share in shares:
        entries.update(share)
    crc = all(len(entry) == 2 for entry in entries.values())
    for name in _files(folder):
        if name not in entries:
            entries[name] = _entry(folder / name, crc)
    record = ({"crc32": dict(sorted(entries.items()))} if crc else
              {"sizes": {name: entry[0] for name, entry in sorted(entries.items())}})
    with open(folder / CHECKSUMS, "w") as fh:
        json.dump(record, fh, indent=0)
        fh.flush()
        os.fsync(fh.fileno())


def _structure(folder: Path, full: bool) -> Optional[str]:
    if any(folder.glob("*.distcp")) or (folder / ".metadata").exists():
        if not (folder / ".metadata").is_file():
            return "its .metadata (the index of the shards) is missing"
        try:
            from torch.distributed.checkpoint import FileSystemReader

            metadata = FileSystemReader(str(folder)).read_metadata()
        except Exception as err:  # noqa: BLE001 - any damage to the index
            return f"its .metadata cannot be read ({type(err).__name__}: {str(err)[:200]})"
        needed: dict[str, int] = {}
        for info in (metadata.storage_data or {}).values():
            end = int(info.offset) + int(info.length)
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
        for name, end in sorted(needed.items()):
            if not (folder / name).is_file():
                return f"its shard file {name} is missing"
            size = (folder / name).stat().st_size
            if size < end:
                return f"its shard file {name} holds {size} bytes, .metadata needs {end}"
    meta = folder / "meta.pt"
    if meta.exists():
        try:
            with zipfile.ZipFile(meta) as zf:
                bad = zf.testzip() if full else None
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            return f"its meta.pt is not a complete torch archive ({type(err).__name__}: {err})"
        if bad is not None:
            return f"its meta.pt fails its checksum in member {bad!r}"
    return None


def folder_problem(folder: str | Path, full: bool = True, rank: int = 0, world: int = 1) -> Optional[str]:
    """What is wrong with the DCP folder ``folder`` (this rank's share of the checksums), or ``None``; ``full``
    reads the files and checks the CRC32s recorded (a record of sizes only: the sizes)."""
    folder = Path(folder)
    problem = _structure(folder, full)
    if problem is not None:
        return problem
    record = folder / CHECKSUMS
    if not record.is_file():
        return None  # written before checksums were recorded: the structure is all that can be checked
    try:
        saved = json.loads(record.read_text())
        entries = saved["crc32"] if "crc32" in saved else {k: [v, None] for k, v in saved["sizes"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"its {CHECKSUMS} cannot be read ({type(err).__name__}: {err})"
    for name in sorted(entries)[rank::max(1, world)]:
        size, crc = entries[name]
        path = folder / name
        if not path.is_file():
            return f"its file {name} is missing ({CHECKSUMS} lists it)"
        if path.stat().st_size != size:
            return f"its file {name} holds {path.stat().st_size} bytes, {size} were written"
        if full and crc is not None and crc32_of(path) != crc:
            return f"its file {name} fails its CRC32 (the bytes changed since it was written)"
    return None


def step_on_disk(path: str | Path) -> Optional[int]:
    """The ``global_step`` of the complete checkpoint at ``path`` (a DCP folder: its ``meta.pt``; a file: read
    memory-mapped, so its tensors are not read), or ``None`` when there is none there or it cannot be read."""
    import torch

    p = Path(path)
    try:
        if p.is_dir():
            meta = torch.load(p / "meta.pt", map_location="cpu", weights_only=False)
        elif p.is_file():
            meta = torch.load(p, map_location="cpu", weights_only=False, mmap=True)
        else:
            return None
        return int(meta["global_step"])
    except Exception:  # noqa: BLE001 - any unreadable checkpoint is not a complete one
        return None


def newest_checkpoint(paths) -> Optional[str]:
    """The checkpoint ``--ckpt_path last`` resumes among ``paths``: the newest by modification time, as Lightning
    takes it; among files of the same time (an ``async_save`` ``last.ckpt``, a link to or a copy of its step's
    file; two saves within a second on a file system that keeps whole seconds), the highest step on disk, then
    a ``last*`` name, then the name: one choice, the same on every rank (Lightning's own tie-break is a set's
    order, which differs from process to process)."""
    times = {str(p): Path(p).stat().st_mtime_ns for p in paths}
    if not times:
        return None
    newest = max(times.values())
    tied = [p for p, t in times.items() if t == newest]
    if len(tied) == 1:
        return tied[0]

    def rank(p: str) -> tuple:
        step = step_on_disk(p)
        return (-1 if step is None else step, Path(p).name.startswith("last"), Path(p).name)

    return max(tied, key=rank)
