"""The per-node cache of remote prepared folders, and the downloader litdata streams ``s3://`` chunks with.

``mirror`` makes a local copy of a remote folder's small files in ``<cache_dir>/<name>-<hash of the URL>/``
(``meta.json``, ``tokenizer.json`` when prepare uploaded one, ``train/index.json``, ``val/index.json``),
all read through ``remote.Remote``. litdata is then given that folder as the cache of the URL
(``litdata.streaming.resolver.Dir(path=..., url=...)``) and downloads each chunk there when it needs it, through
``ChunkDownloader`` below (registered for ``s3://`` with litdata's ``register_downloader``), which is the
same ``Remote``: bounded retries, a ``RunError`` naming the object's URL, and the chunk's size and SHA-256
checked against ``meta.json`` as it arrives (``data.verify``: ``sizes`` checks only the size). A chunk
is published in the cache only once it is complete and checked (written beside itself, then renamed).

Cleaning: a remote folder prepared again (its ``meta.json`` differs from the cached one) empties its
cache folder first (under a lock: the ranks of a node start together); downloads left by a killed process (``*.tmp.<pid>``) are removed; and
``data.cache_size`` (e.g. ``"20GB"``) is litdata's ``max_cache_size``: chunks already read are deleted
once the folder holds more.

Must not import Lightning.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from ..processes import alive
from .remote import Remote, join

#: where remote prepared folders are cached when ``data.cache_dir`` is not set
DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "scalevec_lit", "data")
SPLITS = ("train", "val")
TOKENIZER = "tokenizer.json"


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def cache_bytes(size, key: str = "data.cache_size") -> Optional[int]:
    """``data.cache_size`` in bytes: a number of bytes or ``"50GB"``, ``"500MB"``, ``"2GiB"``; ``None``: no cap."""
    if size is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(size))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        from ..errors import UserError

        raise UserError(key, repr(size), "not a size", "give bytes or a size with a unit, e.g. 50GB, 500MB or 2GiB "
                        "(or leave it out: no cap)")
    return int(float(m.group(1)) * _UNITS[unit])


def cache_root(url: str, cache_dir: Optional[str] = None) -> Path:
    """The cache folder of ``url``: ``<cache_dir>/<last name of the URL>-<12 hex of its SHA-256>``."""
    base = Path(cache_dir or os.environ.get("SCALEVEC_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser()
    url = url.rstrip("/")
    name = re.sub(r"[^\w.-]", "_", url.rsplit("/", 1)[-1]) or "data"
    return base / f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _remove_stale(root: Path) -> None:
    """Remove ``*.tmp.<pid>`` downloads (``*.tmp.<thread>.<pid>`` from ``Remote.download``) of processes that are
    gone."""
    for tmp in root.rglob("*.tmp.*"):
        pid = tmp.name.rsplit(".", 1)[-1]
        if pid.isdigit() and not alive(int(pid)):
            tmp.unlink(missing_ok=True)


def mirror(remote: Remote, cache_dir: Optional[str] = None) -> tuple[Path, dict, dict[str, int]]:
    """Copy the small files of the remote prepared folder into its cache folder; ``(folder, meta, listing)``
    where ``listing`` is every object under the URL with its size."""
    listing = remote.listing()
    if "meta.json" not in listing:
        from ..errors import RunError

        what = "holds nothing (no such prefix)" if not listing else \
            f"holds {len(listing)} object(s) but no meta.json (not prepared there, or an interrupted prepare)"
        raise RunError(remote.key, remote.url, what, f"prepare it: python -m scalevec_lit prepare --input <text> "
                       f"--output {remote.url}, or correct the prefix", exit_code=2)  # missing: 2, as a local folder
    meta_bytes = remote.read("meta.json")
    try:
        meta = json.loads(meta_bytes)
    except ValueError as err:
        from ..errors import RunError

        raise RunError(remote.key, join(remote.url, "meta.json"), f"unreadable ({err})", "prepare that folder "
                       f"again with --output {remote.url} --overwrite") from None
    root = cache_root(remote.url, cache_dir)
    cached = root / "meta.json"
    with _locked(root.with_name(f".{root.name}.lock")):  # the ranks of a node start together
        if cached.is_file() and cached.read_bytes() != meta_bytes:
            shutil.rmtree(root, ignore_errors=True)  # prepared again since: the cached chunks are stale
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale(root)
        for split in SPLITS:
            rel = f"{split}/index.json"
            if rel not in listing:
                from ..errors import RunError

                raise RunError(remote.key, join(remote.url, rel), "missing (an interrupted prepare?)",
                               f"prepare that folder again with --output {remote.url} --overwrite")
            _write(root / rel, remote.read(rel))
        if TOKENIZER in listing:
            _write(root / TOKENIZER, remote.read(TOKENIZER))
        _write(cached, meta_bytes)  # last: a cache folder with meta.json is complete
    return root, meta, listing


def cached_tokenizer(remote: Remote, cache_dir: Optional[str] = None) -> Optional[Path]:
    """The ``tokenizer.json`` that prepare uploaded beside the remote folder's ``meta.json``, copied into its
    cache folder where ``mirror`` puts it; ``None`` when the folder holds no copy (prepared before copies)."""
    data = remote.read(TOKENIZER, missing_ok=True)
    if data is None:
        return None
    root = cache_root(remote.url, cache_dir)
    with _locked(root.with_name(f".{root.name}.lock")):
        _write(root / TOKENIZER, data)
    return root / TOKENIZER


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (POSIX ``flock``; released when the file closes, also by a killed process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: no lock
            pass
        yield


def register() -> None:
    """Make ``ChunkDownloader`` litdata's downloader of ``s3://`` (once per process)."""
    from litdata.streaming.downloader import register_downloader

    register_downloader("s3://", _downloader_class(), overwrite=True)
    _quiet_own_errors()


def _quiet_own_errors() -> None:
    """litdata's chunk thread prints a traceback (``PrepareChunksThread CRASHED``) for any error of a download,
    then the reader raises that error in the training thread; ours (an endpoint gone, a corrupt chunk) is one
    line there, so its traceback is not printed (anything else still is)."""
    from litdata.streaming import reader

    from ..errors import UserError

    original = reader.PrepareChunksThread._report_crash
    if getattr(original, "scalevec_quiet", False):
        return

    def report_crash(self, exc: BaseException) -> None:
        if not isinstance(exc, UserError):
            original(self, exc)

    report_crash.scalevec_quiet = True
    reader.PrepareChunksThread._report_crash = report_crash


@functools.lru_cache(maxsize=None)
def _downloader_class():
    from litdata.streaming.downloader import Downloader

    class ChunkDownloader(Downloader):
        """litdata's downloader for ``s3://``, through ``Remote``; checks each chunk against ``meta.json``."""

        def __init__(self, remote_dir: str, cache_dir: str, chunks: list, storage_options: Optional[dict] = None,
                     **kwargs: Any) -> None:
            options = dict(storage_options or {})
            self.verify = options.pop("verify", "auto")
            key = options.pop("key", "data.data_dir")
            super().__init__(remote_dir, cache_dir, chunks, options)
            self.remote = Remote(remote_dir, options, key=key)

        def _meta(self, local: Path) -> dict:
            """``meta.json`` beside the split's cache folder (``mirror`` wrote it)."""
            try:
                return json.loads((local.parent.parent / "meta.json").read_text())
            except (OSError, ValueError):
                return {}

        @staticmethod
        def _record(meta: dict, local: Path) -> Optional[dict]:
            """The chunk's record (bytes, sha256) in ``meta.json``."""
            try:
                record = meta["chunks"][local.parent.name]
            except (KeyError, TypeError):
                return None
            return next((r for r in record if r.get("name") == local.name), None)

        def download_file(self, remote_filepath: str, local_filepath: str) -> None:
            local = Path(local_filepath)
            if local.exists():
                return
            rel = remote_filepath[len(self.remote.url):].lstrip("/") if remote_filepath.startswith(self.remote.url) \
                else remote_filepath.rsplit("/", 1)[-1]
            from .integrity import _fix

            meta = self._meta(local)
            rec = self._record(meta, local) if local.name != "index.json" else None
            size = rec.get("bytes") if rec else None
            sha = rec.get("sha256") if rec and self.verify != "sizes" else None
            fix = _fix(self.remote.url.rsplit("/", 1)[0], meta)  # the prepare command that rebuilds the folder
            self.remote.download(rel, local, size=size, sha256=sha, fix=fix)

        async def adownload_file(self, remote_filepath: str, local_filepath: str) -> None:
            await asyncio.to_thread(self.download_file, remote_filepath, local_filepath)
            self._notify_published(local_filepath)

    ChunkDownloader.__module__ = __name__
    ChunkDownloader.__qualname__ = "ChunkDownloader"
    return ChunkDownloader


def __getattr__(name: str):  # ``cache.ChunkDownloader``: made on first use (litdata imported late), picklable
    if name == "ChunkDownloader":
        return _downloader_class()
    raise AttributeError(name)
