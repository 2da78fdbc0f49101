"""A stop signal whose ``StopSignal`` was swallowed while a guarded command ran still ends it with 128 + the
signal and its one line (``errors.run_guarded``): a ``__del__`` (Python only prints what it raises, and
``stopsignal`` not even that) or a library's ``except BaseException`` can take it, and the command then goes on.
Before, any command but ``prepare`` (which checks before it commits) then exited 0, or with its own error.
In process: the signal is raised by the test itself, inside the guarded function."""
from __future__ import annotations

import gc
import signal

import pytest

from scalevec_lit import stopsignal
from scalevec_lit.errors import UserError, run_guarded


class _Pipe:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # the handler runs here: its StopSignal cannot leave __del__


def _swallowed_by_a_del() -> None:
    pipe = _Pipe()
    del pipe
    gc.collect()


def _swallowed_by_a_catch_all() -> None:
    try:
        signal.raise_signal(signal.SIGTERM)
    except BaseException:  # noqa: BLE001 - a library that takes everything
        pass


def _guarded(fn, argv):
    with pytest.raises(SystemExit) as exit_:
        run_guarded(fn, argv)
    return exit_.value.code


def test_a_command_that_ran_to_its_end_exits_with_the_swallowed_signal(capsys):
    def export(argv):
        _swallowed_by_a_del()
        print("exported")
        return 0

    before = signal.getsignal(signal.SIGINT)
    assert _guarded(export, ["export", "--out", "x"]) == 130
    out, err = capsys.readouterr()
    assert out == "exported\n"
    assert err == ("error: stopped by SIGINT during export: the signal was taken by code that export ran (a "
                   "library's clean-up), which did not stop it, so export ran to its end (its output, if it writes "
                   "one, is complete); nothing to run again\n")
    assert signal.getsignal(signal.SIGINT) is before  # the handler in place before the command is back
    assert run_guarded(lambda argv: "next", ["inspect"]) == "next"  # the next command starts afresh


def test_a_catch_all_that_took_sigterm_and_a_plain_exit_0(capsys):
    def plan(argv):
        _swallowed_by_a_catch_all()
        raise SystemExit(0)  # e.g. fit --print_plan

    assert _guarded(plan, ["fit", "--print_plan"]) == 143
    assert capsys.readouterr().err.startswith("error: stopped by SIGTERM during fit: the signal was taken by code "
                                              "that fit ran (a library's clean-up), which did not stop it")


def test_an_error_after_a_swallowed_stop_is_the_stop(capsys):
    """The command failed after the signal was taken (perhaps because of it): the stop is what is reported."""
    def convert(argv):
        _swallowed_by_a_catch_all()
        raise RuntimeError("worker 3 ended")

    assert _guarded(convert, ["convert"]) == 143
    assert capsys.readouterr().err == ("error: stopped by SIGTERM during convert: nothing was written (an output "
                                       "folder is left as it was); run the same command again\n")


def test_without_a_signal_the_command_is_unchanged(capsys):
    def bad(argv):
        raise UserError("data.batch_size", 0, "must be positive", "set e.g. --data.batch_size=8")

    assert _guarded(bad, ["fit"]) == 2
    assert capsys.readouterr().err == "error: data.batch_size: 0: must be positive; set e.g. --data.batch_size=8\n"
    assert _guarded(lambda argv: exec("raise SystemExit(3)"), ["fit"]) == 3  # a command's own non-zero exit
    assert run_guarded(lambda argv: 7, ["inspect"]) == 7
    assert stopsignal._state["raised"] is None
