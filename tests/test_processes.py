"""``processes.alive``: the one answer to "does process N still run" that the run lock (``runlock.py``) and the
stale temporary files of ``outdir.py``/``outfile.py`` and ``data/cache.py`` ask: a zombie (ended, not yet
reaped) does not run, and neither does an id no process can have (instead of ``os.kill`` signalling a process
group, every process, or raising ``OverflowError``)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from scalevec_lit.processes import alive


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]


@pytest.mark.slow  # starts a process (under a second)
def test_a_running_process_runs_and_an_ended_one_does_not():
    assert alive(os.getpid())
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert alive(child.pid)
    finally:
        child.kill()
    if Path(f"/proc/{child.pid}/stat").is_file():  # killed, not yet reaped: a zombie
        deadline = time.monotonic() + 10
        while _state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(child.pid) == "Z"
        assert not alive(child.pid)
    child.wait()
    assert not alive(child.pid)


@pytest.mark.parametrize("pid", [0, -1, 2**31, 10**20])
def test_an_id_no_process_can_have_runs_nothing(pid):
    assert alive(pid) is False
