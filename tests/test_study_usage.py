"""``study`` with a missing or unknown part of its command line (``errors.CommandLineParser``): one line in the
library's style, ``error: <command>: <what is wrong or missing>; usage: <its usage in one line>``, exit 2, in place
of argparse's usage block and its own line; ``--help`` is argparse's, unchanged. In process."""
from __future__ import annotations

import pytest

from helpers import main_in_process

RUN_USAGE = ("usage: python -m scalevec_lit study run [-h] [--parallel PARALLEL] [--out OUT] [--dry-run] [--report] "
             "[--limit LIMIT] [--data DATA] [--allow-code-change] [--allow-data-change] [--mfu MFU] study")
STUDY_USAGE = "usage: python -m scalevec_lit study [-h] {run,plan,report} ..."

CASES = [
    (["study", "run"], f"error: study run: the argument study is missing; {RUN_USAGE}"),
    (["study", "bogus"], f"error: study: bogus: not a command of study; choose run, plan or report; {STUDY_USAGE}"),
    (["study", "rn"], "error: study: rn: not a command of study; choose run, plan or report (did you mean 'run'?); "
     f"{STUDY_USAGE}"),
    (["study"], f"error: study: no command given; choose run, plan or report; {STUDY_USAGE}"),
    (["study", "run", "s.yaml", "--parallel", "two"], f"error: study run: --parallel: invalid int value: 'two'; {RUN_USAGE}"),
    (["study", "plan", "s.yaml", "--bogus"], "error: study: --bogus: not an option it takes; see python -m "
     f"scalevec_lit study run --help (or plan, report) for a command's; {STUDY_USAGE}"),
    (["study", "report"], "error: study report: the argument dir is missing; usage: python -m scalevec_lit study "
     "report [-h] [--study STUDY] dir"),
]


@pytest.mark.parametrize("args, line", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_study_command_line_is_one_line(capfd, args, line):
    assert main_in_process(capfd, args) == (2, line + "\n")


def test_help_is_argparses(capfd):
    code, text = main_in_process(capfd, ["study", "run", "--help"])
    assert code == 0
    assert text.startswith("usage: python -m scalevec_lit study run [-h] [--parallel PARALLEL] [--out OUT]")
    assert "print the commands of the runs to do" in text and "error" not in text
