"""The test harness's report of a run that does not end (``helpers.run_session``, behind ``run_cli``): a run
whose output is held open past its timeout (here by a child left behind after the leader exited, as a rank or
a loader worker could be) fails the test with every process still in its session and each one's Python
stack, and none of them is left running."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import finish, run_session

pytestmark = pytest.mark.slow  # starts processes

LEADER = textwrap.dedent("""
    import subprocess, sys
    child = "import time\\ndef wait_for_ever():\\n    time.sleep(600)\\nwait_for_ever()\\n"
    subprocess.Popen([sys.executable, "-c", child])  # inherits stdout and stderr
    print("leader done", flush=True)
""")


def test_a_run_held_open_by_a_child_fails_with_the_child_and_its_stack(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        run_session([sys.executable, "-c", LEADER], tmp_path, timeout=5)
    text = str(failed.value)
    assert text.startswith("did not end within 5 s (leader exit status: 0)"), text
    listed = [line.split(":")[0].strip() for line in text.split("still in its session:\n")[1].split("stdout (end)")[0].splitlines()
              if "wait_for_ever" in line or "import time" in line]
    assert len(listed) == 1, text  # the child, by its command line
    assert "leader done" in text
    assert "in wait_for_ever" in text, text  # faulthandler's stack of the child's thread
    assert _ended(int(listed[0]))


def _ended(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever adopted it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_run_that_ends_returns_its_output(tmp_path):
    res = run_session([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                      tmp_path, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")


def test_a_run_writing_to_a_file_that_hangs_fails_with_its_stack_from_the_file(tmp_path):
    """``finish(proc, timeout, log)``: for a process started by a test itself, its output in a file (a pipe is
    held open by a stopped rank): the report reads the stacks from that file."""
    log = tmp_path / "out.txt"
    code = "import time\ndef stuck_here():\n    print('started', flush=True)\n    time.sleep(600)\nstuck_here()\n"
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONFAULTHANDLER": "1"}, start_new_session=True)
    with pytest.raises(pytest.fail.Exception) as failed:
        finish(proc, 3, log)
    text = str(failed.value)
    assert text.startswith("did not end within 3 s (leader exit status: -6)"), text
    assert "started" in text and "in stuck_here" in text, text
    assert proc.wait(10) == -6  # aborted, its stack printed
