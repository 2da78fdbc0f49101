"""What a stopped ``prepare`` ends: every process its litdata workers started, none of their siblings.

In litdata's ordered mode (``prepare`` uses it, so that the same inputs give the same chunks) each worker starts
its own remover and uploader processes, which the command does not see. A stop signal ends a worker through
``workers.stop``, which first kills the processes that worker started (``kill_own_children``); before, they
were left waiting on their queues for ever, holding the command's output open (``tests/test_exit_codes.py``'s
signal tests then timed out). A process is found by its parent pid in ``/proc``, so one forked a moment
before the stop is found too. And a worker never counts a sibling: a worker that handles the signal right after
its fork, before ``multiprocessing`` resets its state, still holds its parent's list of children, its siblings
in it (one killed by its sibling in the middle of its own stop left its remover behind).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = [pytest.mark.slow,  # starts processes
              pytest.mark.skipif(sys.platform != "linux", reason="children are read from /proc")]


SCRIPT = """
import json, multiprocessing, os, subprocess, sys, time
from scalevec_lit.data.workers import child_pids, kill_own_children

def sleeper():
    time.sleep(120)

if __name__ == "__main__":
    sibling = multiprocessing.get_context("fork").Process(target=sleeper)
    sibling.start()
    read, write = os.pipe()
    pid = os.fork()  # a worker in the moment after its fork: its parent's multiprocessing state, the sibling listed
    if pid == 0:
        try:
            own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            counted = sorted(child_pids())
            kill_own_children()
            try:
                os.kill(own.pid, 0)
                ended = "still there (alive, or a zombie nobody reaped)"
            except ProcessLookupError:
                ended = "killed and reaped"
            os.write(write, json.dumps([counted, own.pid, ended]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        counted, own, ended = json.loads(got.read())
    status = os.waitpid(pid, 0)[1]
    print(json.dumps({"counted": counted, "own": own, "ended": ended, "status": status, "sibling": sibling.pid,
                      "sibling_alive": sibling.is_alive()}))
    sibling.kill()
    sibling.join()
"""


def test_a_worker_kills_the_processes_it_started_and_not_its_sibling(tmp_path):
    """Run in a process of its own (single-threaded: pytest's may have threads, and a fork then is unsafe)."""
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["counted"] == [got["own"]], got  # its own process only, not the sibling it inherited
    assert (got["ended"], got["status"], got["sibling_alive"]) == ("killed and reaped", 0, True), got
