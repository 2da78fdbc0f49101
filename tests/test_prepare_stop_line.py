"""A stop or a failure while litdata's ``optimize`` runs (``data/workers.py``): litdata's progress bar leaves
stderr in the middle of a line (``Progress:   0%|  | 0/12``), and the command's one ``error:`` line must
start on a line of its own, so that a user (and a script reading lines that start with ``error:``) sees it.
The clean-clone suite met it: SIGINT to the process group mid-optimize printed the line glued to the bar."""
from __future__ import annotations

import signal
import sys

import pytest

from scalevec_lit.data.workers import signals_stay_ours
from scalevec_lit.stopsignal import StopSignal


@pytest.mark.parametrize("error", [StopSignal(signal.SIGINT), RuntimeError("a worker failed")])
def test_a_stop_or_failure_mid_optimize_ends_the_progress_line(capsys, error):
    with pytest.raises(type(error)):
        with signals_stay_ours():
            print("Progress:   0%|          | 0/12", end="", file=sys.stderr)
            raise error
    assert capsys.readouterr().err == "Progress:   0%|          | 0/12\n"


def test_a_prepare_that_ends_well_writes_nothing_more(capsys):
    with signals_stay_ours():
        print("Progress: 100%|##########| 12/12", end="", file=sys.stderr)
    assert capsys.readouterr().err == "Progress: 100%|##########| 12/12"
