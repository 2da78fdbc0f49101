"""The test harness's report of a run that does not end (``helpers.run_session``, behind ``run_cli``): a run
whose output is held open past its timeout (here by a child left behind after the leader exited, as a rank or
a loader worker could be) fails the test with every process still in its session and each one's Python
stack, and none of them is left running."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from helpers import run_session

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
