"""litdata's ``optimize`` (``prepare.py``) and the stop signals: a signal keeps meaning "stop" while it runs.

Plain Python (litdata is imported when the block starts); must not import Lightning.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from ..stopsignal import STOP_SIGNALS, StopSignal, raise_if_swallowed


@contextmanager
def signals_stay_ours() -> Iterator[None]:
    """Around litdata's ``optimize``: a stop signal keeps meaning "stop" and its workers do not outlive it.

    litdata's ``DataProcessor.run`` makes SIGINT call its ``_signal_handler`` (which ends the process at once
    with ``os._exit(0)``: a stopped prepare reported success and left its temporary sibling) and does not put
    the previous handler back; its worker processes are forked, so they inherit whatever handles the signals.
    Here that handler calls the one that was in place (``stopsignal``'s, under ``run_guarded``: the one line,
    exit 128 + N), every stop signal is handled so that a forked worker just ends (``os._exit(128 + N)``,
    silently: the command reports), the workers still running when ``optimize`` fails or is stopped are ended
    before the temporary folder is removed, and the handlers in place before are put back."""
    from litdata.processing.data_processor import DataProcessor

    if threading.current_thread() is not threading.main_thread():  # optimize itself needs the main thread
        yield
        return
    parent, before = os.getpid(), set(multiprocessing.active_children())
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def stop(signum: int, frame) -> None:
        if os.getpid() != parent:  # one of optimize's forked processes
            os._exit(128 + signum)
        handler = previous.get(signum, signal.SIG_DFL)
        if callable(handler):
            handler(signum, frame)
        elif handler != signal.SIG_IGN:
            raise StopSignal(signum)

    litdata_handler = DataProcessor.__dict__.get("_signal_handler")
    DataProcessor._signal_handler = lambda self, signum, frame: stop(signum, frame)
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    try:
        yield
        raise_if_swallowed()  # a signal whose exception a __del__ swallowed stops here, its workers ended
    except BaseException:
        children = [p for p in multiprocessing.active_children() if p not in before]
        for child in children:
            child.terminate()  # SIGTERM: ``stop`` ends it at once
        for child in children:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()
        _end_progress_line()
        raise
    finally:
        if litdata_handler is not None:
            DataProcessor._signal_handler = litdata_handler
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _end_progress_line() -> None:
    """litdata's progress bar leaves stderr in the middle of a line; the command's one line starts on its own."""
    try:
        sys.stderr.write("\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed or gone: nothing to separate
        pass
