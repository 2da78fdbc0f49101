"""A ``run.lock`` written by an older version has no ``proc_start``: when its pid is live, the lock's time tells
whether that process is the run that wrote it (it started before the lock was written) or another one that was
given the number since (it started after): that lock is stale and taken over with one line; the run's own lock
still refuses the folder. Time of the lock: its ``started``, else the file's modification time."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from scalevec_lit.errors import RunError
from scalevec_lit.runlock import LOCK, _proc_start, _started_at, acquire_folder, release_folder

pytestmark = pytest.mark.skipif(_proc_start(1) is None, reason="needs /proc (Linux) to read process start times")
STAMP = "%Y-%m-%d %H:%M:%S"


@pytest.fixture()
def other_process():
    """A live process that is not a run (what a reused pid points at)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _legacy_lock(folder, pid: int, started: str | None) -> None:
    held = {"pid": pid, "host": socket.gethostname(), "command": "python -m scalevec_lit fit ..."}
    (folder / LOCK).write_text(json.dumps({**held, **({"started": started} if started else {})}))


def test_a_legacy_lock_whose_pid_started_later_is_taken_over(tmp_path, other_process, capsys):
    time.sleep(1.1)  # a lock written after its process started (as a run writes its own) still refuses the folder
    _legacy_lock(tmp_path, other_process.pid, time.strftime(STAMP))
    with pytest.raises(RunError) as info:
        acquire_folder(tmp_path)
    assert f"another run (pid {other_process.pid}," in str(info.value) and "in use" in str(info.value)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == other_process.pid

    written = time.time() - 3600  # the old run wrote its lock an hour ago; its pid now runs `other_process`
    _legacy_lock(tmp_path, other_process.pid, time.strftime(STAMP, time.localtime(written)))
    began = _started_at(other_process.pid)
    assert acquire_folder(tmp_path) == tmp_path / LOCK
    err = capsys.readouterr().err
    assert err == (f"note: {tmp_path / LOCK}: taking over the lock of a run that is no longer running (pid "
                   f"{other_process.pid} now belongs to another process, started "
                   f"{time.strftime(STAMP, time.localtime(began))}, after the lock was written at "
                   f"{time.strftime(STAMP, time.localtime(written))}: the system reused the number)\n")
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert other_process.poll() is None  # the unrelated process is left alone
    release_folder(tmp_path)


def test_a_legacy_lock_without_a_time_is_dated_by_its_file(tmp_path, other_process, capsys):
    _legacy_lock(tmp_path, other_process.pid, None)
    old = time.time() - 3600
    os.utime(tmp_path / LOCK, (old, old))
    assert acquire_folder(tmp_path) == tmp_path / LOCK
    assert f"(pid {other_process.pid} now belongs to another process, started " in capsys.readouterr().err
    release_folder(tmp_path)
