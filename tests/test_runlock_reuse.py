"""``run.lock`` names one process, not only a pid: a lock whose pid the system has since given to another live
process is stale and taken over with a note, while a lock of the live run itself still refuses the folder."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from helpers import ROOT
from scalevec_lit.errors import RunError
from scalevec_lit.runlock import LOCK, _proc_start, acquire_folder, release_folder

pytestmark = [pytest.mark.skipif(_proc_start(1) is None, reason="needs /proc (Linux) to read process start times"),
              pytest.mark.slow]  # starts processes (a sleeper, a lock holder), each under a second


@pytest.fixture()
def other_process():
    """A live process that is not a run (what a reused pid points at)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_reused_by_another_process_does_not_block_the_folder(tmp_path, other_process, capsys):
    started = _proc_start(other_process.pid)
    boot, ticks = started.rsplit(":", 1)
    # the run that wrote the lock had this pid and started earlier; the pid now belongs to `other_process`
    lock = tmp_path / LOCK
    lock.write_text(json.dumps({"pid": other_process.pid, "host": socket.gethostname(), "started": "earlier",
                                "proc_start": f"{boot}:{int(ticks) - 500}"}))
    assert acquire_folder(tmp_path) == lock
    err = capsys.readouterr().err
    assert f"taking over the lock of a run that is no longer running (pid {other_process.pid} now belongs to " \
           "another process" in err
    assert "stop it" not in err
    assert json.loads(lock.read_text())["pid"] != other_process.pid
    assert other_process.poll() is None  # the unrelated process is left alone
    release_folder(tmp_path)
    assert not lock.exists()


def test_the_lock_of_a_live_run_still_refuses_the_folder(tmp_path):
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from scalevec_lit.runlock import acquire_folder; "
            f"acquire_folder({str(tmp_path)!r}); print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert json.loads((tmp_path / LOCK).read_text())["proc_start"] == _proc_start(holder.pid)
        with pytest.raises(RunError) as err:
            acquire_folder(tmp_path)
        assert f"another run (pid {holder.pid}," in str(err.value) and "in use" in str(err.value)
    finally:
        holder.kill()
        holder.wait()
