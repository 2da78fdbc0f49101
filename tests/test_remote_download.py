"""Two threads of one process downloading the same chunk into the same cache (two data modules over one
bucket in a notebook, or a reader's chunk thread finishing its download while the next reader's starts):
each writes its own temporary file, both succeed and the chunk is the object's bytes. With one temporary
name per process they shared a file and the second rename failed (``FileNotFoundError``)."""
from __future__ import annotations

import hashlib
import os
import threading

from scalevec_lit.data.remote import Remote

DATA = bytes(range(256)) * 300  # the object, read in three parts


class _Body:
    """An object's body read in three parts; the last read waits until both threads have written all theirs."""

    def __init__(self, both_written: threading.Barrier) -> None:
        third = len(DATA) // 3
        self.parts, self.both_written = [DATA[:third], DATA[third:2 * third], DATA[2 * third:]], both_written

    def read(self, n: int) -> bytes:
        if self.parts:
            return self.parts.pop(0)
        self.both_written.wait(10)
        return b""


class _Client:
    def __init__(self) -> None:
        self.both_written = threading.Barrier(2)

    def get_object(self, Bucket: str, Key: str) -> dict:  # noqa: N803 - boto3's names
        return {"Body": _Body(self.both_written)}


def test_two_threads_download_the_same_chunk(tmp_path):
    remote = Remote("s3://corpus/shakespeare", {})
    remote._client, remote._pid = _Client(), os.getpid()
    dest = tmp_path / "train" / "chunk-0-0.bin"
    errors: list = []

    def download() -> None:
        try:
            remote.download("train/chunk-0-0.bin", dest, size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest())
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=download) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and dest.read_bytes() == DATA
    assert sorted(p.name for p in dest.parent.iterdir()) == ["chunk-0-0.bin"]  # no temporary file left


def test_a_gone_process_download_is_removed(tmp_path):
    """``mirror`` removes the temporary downloads of processes that no longer run, in either name."""
    import subprocess
    import sys

    from scalevec_lit.data.cache import _remove_stale

    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    split = tmp_path / "train"
    split.mkdir()
    names = ["chunk-0-0.bin", f"chunk-0-1.bin.tmp.{gone.pid}", f"chunk-0-2.bin.tmp.123.{gone.pid}",
             f"chunk-0-3.bin.tmp.{os.getpid()}", f"chunk-0-4.bin.tmp.{threading.get_ident()}.{os.getpid()}"]
    for name in names:
        (split / name).write_bytes(b"x")
    _remove_stale(tmp_path)
    assert sorted(p.name for p in split.iterdir()) == [names[0], names[3], names[4]]
