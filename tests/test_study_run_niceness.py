"""A study run leads its own session (``study/stopping.py``); under the Linux scheduler's autogroups that
session is also its own scheduling group, where the runner's ``nice`` does not reach: ``nice -n 10 ... study
run`` beside other work gave each run a full share of the CPU. ``run_setup`` gives the run's autogroup the
runner's niceness."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.skipif(not Path("/proc/self/autogroup").exists(),
                                reason="this kernel schedules without autogroups: niceness alone applies")

CHILD = """
import os, subprocess, sys
from scalevec_lit.study.stopping import run_setup
os.nice(int(sys.argv[1]))
def group(**kw):
    cmd = ["cat", "/proc/self/autogroup"]
    return subprocess.run(cmd, start_new_session=True, capture_output=True, text=True, **kw).stdout.split()[-1]
print(os.nice(0), group(preexec_fn=run_setup()), group())
"""


def _groups(increment: int) -> tuple[int, ...]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(increment)], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    return tuple(int(x) for x in out.split())


def test_a_run_keeps_a_niced_runners_niceness_in_its_own_session():
    runner, run, plain = _groups(7)
    assert runner >= 7 and run == min(runner, 19)
    assert plain == 0  # a new session without run_setup: the default, whatever the runner's nice


def test_a_run_of_a_runner_not_niced_further_keeps_its_niceness():
    niceness = os.nice(0)  # 0 unless the suite itself runs niced
    assert _groups(0) == (niceness, niceness, 0)
