"""The output folder of a command that writes one (``prepare``, ``export``, ``import``, ``convert``,
``inspect``; ``evaluate``'s files through ``outfile.py``): which files it owns, and writing them all or nothing.

``with output_folder(out, command="export", key="--out", inputs=[("--ckpt", ckpt)], overwrite=...) as tmp:``
the command writes everything into ``tmp``; when the block ends without an error the new files take the
place of the old ones, otherwise ``out`` is left exactly as it was. The rules:

- ``out`` must not be one of the inputs, be inside one or contain one (paths resolved, symlinks followed);
- ``out`` must be new, empty, or hold an earlier output of the same kind of command, listed in its manifest
  ``.scalevec_manifest.json`` (the command and every top-level entry it wrote). ``prepare`` owns prepared
  data (and reads the ``.prepare_manifest.json`` of older versions as its manifest); ``export``, ``import``
  and ``convert`` own model folders, each other's included; ``inspect`` owns its tables and figures. A folder
  holding anything else without such a manifest is refused, naming the files, and so is one whose manifest is
  damaged (which files are whose cannot be told); replacing an earlier output needs ``overwrite``;
- everything is written into a temporary sibling ``.<name>.tmp-<pid>`` (same file system). On success the
  entries the old manifest lists are removed and the new ones moved in: the whole folder is renamed into
  place when ``out`` did not exist or held only the command's own files, otherwise entry by entry, so that
  the user's other files in it stay. A new entry whose name is taken by a file the command did not write is
  refused before anything moves;
- on any error, ``KeyboardInterrupt`` included, the temporary sibling is removed, and so are the parent
  folders this call created: nothing is left behind. A process killed outright (SIGKILL) leaves its
  temporary sibling; the next command writing there names it (``warning:``) so that it can be deleted;
- a stop signal swallowed by code the command ran stops it before anything moves; one during the move waits.

Plain Python: must not import torch or Lightning.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

from . import stopsignal
from .errors import UserError, notice
from .processes import alive

MANIFEST = ".scalevec_manifest.json"
#: manifests of older versions: file name -> (command, the entries it wrote when the file lists none, a list:
#: as those versions read it, a legacy manifest without "writes" lists them; ``MANIFEST`` must list its own)
LEGACY_MANIFESTS = {".prepare_manifest.json": ("prepare", ["train", "val", "meta.json", ".prepare_manifest.json"])}
MODEL_COMMANDS = ("export", "import", "convert")
#: which earlier outputs a command may replace (with --overwrite)
OWNERS = {"prepare": ("prepare",), **{c: MODEL_COMMANDS for c in MODEL_COMMANDS}, "inspect": ("inspect",),
          "evaluate": ("evaluate",)}
SHOWN = 5  # names listed in a message


def _names(names: Iterable[str]) -> str:
    names = sorted(names)
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _inside(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or lies inside it (both resolved)."""
    return a == b or b in a.parents


def refuse_overlap(out: str | Path, inputs: Iterable[tuple[str, str | Path]], key: str, command: str) -> None:
    """A ``UserError`` when ``out`` is an input, lies inside one or contains one (symlinks resolved)."""
    o = Path(out).resolve()
    for input_key, inp in inputs:
        i = Path(inp).resolve()
        if _inside(o, i) or _inside(i, o):
            where = "is" if o == i else ("is inside" if _inside(o, i) else "contains")
            raise UserError(key, repr(str(out)), f"{where} the input {str(inp)!r} ({input_key}); {command} could "
                            "overwrite what it reads", "choose an output folder outside the input, e.g. a new "
                            "folder beside it")


@dataclass
class Holding:
    """What an output folder holds: whose (``command``), its entries and manifest (``ours``), the rest (``foreign``)."""

    command: Optional[str] = None
    ours: set[str] = field(default_factory=set)
    foreign: set[str] = field(default_factory=set)
    other: Optional[str] = None  # the command whose manifest it has, when that is not one of ours

    @property
    def data(self) -> set[str]:
        return self.ours - {MANIFEST, *LEGACY_MANIFESTS}


class DamagedManifest(Exception):
    """A manifest that is there but cannot be read: which files are whose cannot be told."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


def read_manifest(path: Path, command: Optional[str] = None, files=None) -> tuple[str, set[str]]:
    """``(command, the plain names it lists)`` from the manifest file ``path`` (``command``, ``files``: a legacy
    manifest's, where it names neither); ``DamagedManifest`` when it cannot be read (not JSON, not our layout)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DamagedManifest(path, f"{type(err).__name__}: {str(err)[:120]}") from None
    files = data.get("files", data.get("writes", files)) if isinstance(data, dict) else None
    command = data.get("command", command) if isinstance(data, dict) else None
    if isinstance(command, str) and isinstance(files, list) and all(isinstance(f, str) for f in files):
        return command, {f for f in files if f and "/" not in f and f not in (".", "..")}
    raise DamagedManifest(path, "it does not list a command and its files")


def inspect(folder: Path, command: str, ignore: Optional[Path] = None) -> Holding:
    """What ``folder`` (resolved, an existing folder) holds, as seen by ``command`` (``ignore``: its own
    temporary folder when that had to go inside); its manifest lists itself."""
    entries = {p.name for p in folder.iterdir() if p != ignore}
    owner, listed = None, set()
    for name, (legacy_command, legacy_files) in [(MANIFEST, (None, ())), *LEGACY_MANIFESTS.items()]:
        if (folder / name).is_file():
            owner, listed = read_manifest(folder / name, legacy_command, legacy_files)
            listed.add(name)
            break
    if owner not in OWNERS[command]:
        return Holding(None, set(), entries, owner)
    return Holding(owner, entries & listed, entries - listed)


class Claim:
    """What the folder rule (``OutputFolder``) and the file rule (``outfile.OutputFile``) share: a command's
    output, its inputs, the temporary sibling it writes into and the parent folders made for it. A subclass
    gives ``check()`` (refuse what may not be written) and ``_commit()`` (move the new files in)."""

    def __init__(self, out: str | Path, *, command: str, key: str = "--out",
                 inputs: Iterable[tuple[str, str | Path]] = (), overwrite: bool = False) -> None:
        self.out, self.command, self.key, self.overwrite = Path(out), command, key, overwrite
        self.inputs = [(k, p) for k, p in inputs if p is not None]
        self.real = self.out.resolve()
        self.tmp: Optional[Path] = None
        self.created: list[Path] = []  # parent folders made by this claim (removed again on failure)
        self.writers = command  # who may have left a temporary sibling of ``out`` (named in the warning)

    def _error(self, problem: str, fix: str) -> UserError:
        return UserError(self.key, repr(str(self.out)), problem, fix)

    def begin(self) -> Path:
        """Check, then make the temporary sibling (and the missing parent folders); returns the sibling."""
        self.check()
        try:
            self.tmp = make_temporary(self.real, self.created, f"{self.writers} writing {self.out}")
        except BaseException:
            self.abandon()
            raise
        return self.tmp

    def abandon(self) -> None:
        """Remove the temporary sibling and the parent folders this claim created."""
        discard(self.tmp, self.created)
        self.tmp = None

    def commit(self) -> list[str]:
        """``_commit()``, the names moved in; first a stop swallowed meanwhile stops it, one during it waits."""
        with stopsignal.held():
            stopsignal.raise_if_swallowed()  # e.g. taken by a library's clean-up: nothing moves, exit 128 + N
            names = self._commit()
            stopsignal.written(self.command, f"{self.out} holds the complete output of {self.command}")
        return names

    @contextmanager
    def all_or_nothing(self) -> Iterator[Path]:
        """``begin()``'s folder; then ``commit()``, or on any error (``KeyboardInterrupt`` too) ``abandon()``."""
        tmp = self.begin()
        try:
            yield tmp
            self.commit()
        except BaseException:
            self.abandon()
            raise


class OutputFolder(Claim):
    """One command's claim on its output folder (see the module docstring); ``output_folder`` uses it."""

    def __init__(self, out: str | Path, *, command: str, key: str = "--out",
                 inputs: Iterable[tuple[str, str | Path]] = (), overwrite: bool = False) -> None:
        if "://" in str(out):  # Path("s3://b/x") is the local folder s3:/b/x; prepare uploads (data/publish.py)
            raise UserError(key, repr(str(out)), f"a URL: {command} writes a local folder", "write it to a local "
                            "folder and copy that to the bucket (only prepare --output takes an s3:// URL)")
        super().__init__(out, command=command, key=key, inputs=inputs, overwrite=overwrite)
        self.writers = f"{command} or another command"  # export, import and convert write each other's folders

    def check(self) -> Holding:
        """Refuse an output that overlaps an input, is a file, or holds what this command may not replace."""
        refuse_overlap(self.out, self.inputs, self.key, self.command)
        if not self.real.exists():
            return Holding()
        if not self.real.is_dir():
            raise self._error("is a file, not a folder", "give a new or empty folder")
        try:
            held = inspect(self.real, self.command, ignore=self.tmp)
        except DamagedManifest as err:
            raise self._error(
                f"its manifest {err.path.name} is damaged ({err.reason}), so which files here {self.command} wrote "
                "cannot be told", f"restore {err.path.name} (e.g. from a backup), or move the files you want to keep "
                "out of the folder and delete it, or choose another folder") from None
        if held.command is None and held.foreign:
            whose = f"the output of {held.other}, which {self.command} does not replace" if held.other else \
                f"files that {self.command} did not write"
            raise self._error(
                f"holds {whose} ({_names(held.foreign)})",
                f"choose a new or empty folder ({self.command} never deletes or replaces files it did not write; "
                f"it owns only what its manifest {MANIFEST} lists)")
        if held.data and not self.overwrite:
            what = "prepared data" if held.command == "prepare" else f"the output of {held.command}"
            raise UserError(self.key, f"{str(self.out)!r} exists and is not an empty folder",
                            f"it already holds {what} ({_names(held.data)})",
                            f"pass --overwrite to replace it (only the files its manifest {MANIFEST} lists are "
                            "removed) or choose another folder")
        return held

    def _commit(self) -> list[str]:
        """Move the new entries in place of the old ones; returns the new entries (the manifest last)."""
        assert self.tmp is not None
        held = self.check()  # again: another process may have written there in the meantime
        new = sorted(p.name for p in self.tmp.iterdir() if p.name != MANIFEST)
        clash = sorted(held.foreign & {*new, MANIFEST})
        if clash:
            raise self._error(f"holds {_names(clash)}, which {self.command} did not write and would have to "
                              "replace", "move it out of the folder or choose another folder")
        note = (f"written by scalevec_lit {self.command}; a later {'/'.join(OWNERS[self.command])} --overwrite "
                "removes exactly these entries and nothing else")
        (self.tmp / MANIFEST).write_text(json.dumps({"command": self.command, "files": new, "note": note}, indent=2))
        if not self.real.exists():
            os.rename(self.tmp, self.real)
        elif not (held.ours and not held.foreign and self.tmp.parent != self.real and self._swap()):
            inside = self.tmp.parent == self.real  # entry by entry: user's files beside ours, an empty folder, a mount point
            trash = self.real / f".scalevec.old-{os.getpid()}" if inside else free_sibling(self.real, "old")
            move_in(self.tmp, self.real, sorted(held.ours), [*new, MANIFEST], trash)
        self.tmp = None
        return [*new, MANIFEST]

    def _swap(self) -> bool:
        """Put the temporary folder in the place of ``real`` (which holds only our files); ``False`` when
        ``real`` cannot be renamed (a mount point, a folder in use), with nothing changed."""
        assert self.tmp is not None
        os.chmod(self.tmp, self.real.stat().st_mode & 0o7777)
        old = free_sibling(self.real, "old")
        try:
            os.rename(self.real, old)
        except OSError:
            return False
        try:
            os.rename(self.tmp, self.real)
        except BaseException:
            os.rename(old, self.real)
            raise
        _remove(old)
        return True


def _remove(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError as err:
        notice(f"{path}: the replaced files could not be removed ({err}); delete the folder", "warning")


# -- what the folder rule and the file rule (outfile.py) share ---------------------------------------------
def free_sibling(path: Path, kind: str) -> Path:
    """A name for a temporary folder beside ``path``: ``.<name>.<kind>-<pid>``, then ``-2``, ``-3``... while
    that is taken (a file, a folder or a dangling link)."""
    base = path.parent / f".{path.name}.{kind}-{os.getpid()}"
    sibling, n = base, 1
    while sibling.exists() or sibling.is_symlink():
        n += 1
        sibling = base.with_name(f"{base.name}-{n}")
    return sibling


def warn_stale(path: Path, what: str) -> None:
    """Name (``warning:``) the temporary siblings of ``path`` left by a process that is gone (killed outright):
    ``<sibling>: left by an interrupted <what> (process N is gone); delete it``. They are not deleted."""
    for kind in ("tmp", "old"):
        prefix = f".{path.name}.{kind}-"
        for sibling in path.parent.glob(f"{glob.escape(prefix)}*"):
            pid = sibling.name[len(prefix):].split("-")[0]
            if pid.isdigit() and not alive(int(pid)):
                notice(f"{sibling}: left by an interrupted {what} (process {pid} is gone); delete it", "warning")


def make_temporary(path: Path, created: list[Path], what: str) -> Path:
    """Make the folders missing above ``path`` (each appended to ``created`` as it is made), name the stale
    siblings (``warn_stale``), then make and return the temporary sibling; when the parent may not be written
    to and ``path`` is a folder (an output folder of ours), ``path/.scalevec.tmp-<pid>`` instead."""
    for parent in reversed([p for p in [path.parent, *path.parent.parents] if not p.exists()]):
        parent.mkdir()
        created.append(parent)
    warn_stale(path, what)
    tmp = free_sibling(path, "tmp")
    try:
        tmp.mkdir()
    except PermissionError:  # a folder of ours in a parent we may not write to: work inside it
        if not path.is_dir():
            raise
        tmp = path / f".scalevec.tmp-{os.getpid()}"
        tmp.mkdir()
    return tmp


def move_in(tmp: Path, dest: Path, old: list[str], new: list[str], trash: Path) -> None:
    """Replace the entries ``old`` of ``dest`` (moved into ``trash``, made when there are any) with the entries
    ``new`` of ``tmp``, all or nothing (any error undoes each move); then ``tmp`` and ``trash`` are removed."""
    moved_old, moved_new = [], []
    try:
        if old:
            trash.mkdir()
        for name in old:
            os.rename(dest / name, trash / name)
            moved_old.append(name)
        for name in new:
            os.rename(tmp / name, dest / name)
            moved_new.append(name)
    except BaseException:
        for name in reversed(moved_new):
            os.rename(dest / name, tmp / name)
        for name in reversed(moved_old):
            os.rename(trash / name, dest / name)
        if old:
            _remove(trash)
        raise
    tmp.rmdir()
    if old:
        _remove(trash)


def discard(tmp: Optional[Path], created: list[Path]) -> None:
    """Remove ``tmp`` (if any), then the folders in ``created``, deepest first, up to one that is not empty."""
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    for parent in reversed(created):
        try:
            parent.rmdir()
        except OSError:
            break
    created.clear()


@contextmanager
def output_folder(out: str | Path, *, command: str, key: str = "--out", inputs: Iterable[tuple[str, str | Path]] = (),
                  overwrite: bool = False) -> Iterator[Path]:
    """Write ``out`` all or nothing: yields the temporary folder to write into (see the module docstring)."""
    with OutputFolder(out, command=command, key=key, inputs=inputs, overwrite=overwrite).all_or_nothing() as tmp:
        yield tmp
