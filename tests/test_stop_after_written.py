"""``stopsignal.py``'s rules around a finished output, in process (no signal leaves the test): a stop signal while
the output is moved in (``held``) waits for the move; once it is in (``written``) the line says so; a stop whose
``StopSignal`` a ``__del__`` swallowed is raised again before prepare commits (``raise_if_swallowed``)."""
from __future__ import annotations

import gc
import signal

import pytest

from scalevec_lit import stopsignal


@pytest.fixture
def guarded():
    """As ``errors.run_guarded`` sets things up for ``prepare``; everything put back afterwards."""
    nested = stopsignal.enter_command()
    previous = stopsignal.install("prepare")
    try:
        yield nested
    finally:
        stopsignal.leave_command()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stopsignal._state.update(written=None, command=None)


def test_a_signal_inside_held_is_answered_when_the_block_ends(guarded):
    seen = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    with stopsignal.held():
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)
        assert seen == []  # the move goes on
    assert seen == [signal.SIGUSR1]  # once, after it
    assert signal.getsignal(signal.SIGINT) is stopsignal._handler  # the others are back


def test_after_written_the_line_says_the_output_is_complete(guarded):
    assert stopsignal.describe(signal.SIGINT).startswith("stopped by SIGINT during prepare: nothing was written")
    with stopsignal.held():
        stopsignal.written("prepare", "data holds the complete prepared data")
    assert stopsignal.describe(signal.SIGINT) == ("stopped by SIGINT after prepare had finished: data holds the "
                                                  "complete prepared data; nothing to run again")
    for signum in stopsignal.STOP_SIGNALS:  # the line, then exit 128 + N at once
        assert signal.getsignal(signum) is stopsignal._exit_now


def test_written_is_ignored_outside_the_guarded_command(guarded):
    stopsignal._state["command"] = "fit"  # e.g. the data module preparing the corpus for a fit
    stopsignal.written("prepare", "data holds the complete prepared data")
    assert stopsignal._state["written"] is None
    assert signal.getsignal(signal.SIGINT) is stopsignal._handler


class _Pipe:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)  # the handler runs here: its StopSignal cannot leave __del__


def test_a_stop_swallowed_by_a_del_is_raised_again(guarded, capsys):
    stopsignal.raise_if_swallowed()  # nothing yet
    pipe = _Pipe()
    del pipe
    gc.collect()
    assert capsys.readouterr().err == ""  # not printed as "Exception ignored in ..."
    with pytest.raises(stopsignal.StopSignal) as err:
        stopsignal.raise_if_swallowed()
    assert err.value.exit_code == 143
    assert str(err.value) == ("stopped by SIGTERM during prepare: nothing was written (an output folder is left "
                              "as it was); run the same command again")
