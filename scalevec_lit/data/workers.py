"""litdata's ``optimize`` (``prepare.py``) and the stop signals: a signal keeps meaning "stop" while it runs.

Plain Python (litdata is imported when the block starts); must not import Lightning.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress
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
    silently: the command reports), after killing the processes it started itself (in litdata's ordered mode,
    which ``prepare`` uses, each worker starts its own remover and uploaders, which the command cannot see:
    left, they waited on their queues for ever and held its output open), the workers still running when
    ``optimize`` fails or is stopped are ended (one forked as the signal came, not yet in ``multiprocessing``'s
    list, too) before the temporary folder is removed, and the handlers in place before are put back."""
    from litdata.processing.data_processor import DataProcessor

    if threading.current_thread() is not threading.main_thread():  # optimize itself needs the main thread
        yield
        return
    parent, before, before_pids = os.getpid(), set(multiprocessing.active_children()), child_pids()
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def stop(signum: int, frame) -> None:
        if os.getpid() != parent:  # one of optimize's forked processes
            kill_own_children()  # a worker's own remover and uploaders (ordered mode)
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
        # a worker forked just before the stop, not yet in multiprocessing's list: ended and reaped here
        strays = child_pids() - before_pids - {child.pid for child in children}
        for pid in strays:
            with suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        for child in children:
            child.terminate()  # SIGTERM: ``stop`` ends it at once
        for child in children:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()
        for pid in strays:
            _reap(pid, 10.0)
        _end_progress_line()
        raise
    finally:
        if litdata_handler is not None:
            DataProcessor._signal_handler = litdata_handler
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def child_pids() -> set[int]:
    """The processes this one started, those forked a moment ago included: a signal handler runs between two
    bytecodes, possibly after ``fork`` returned and before ``multiprocessing`` listed the new process, so on
    Linux they are read from ``/proc`` (their parent pid). Elsewhere, ``multiprocessing``'s list, of this
    process's own: a forked worker inherits its parent's list, its siblings in it, which it must not kill (one
    killed by its sibling in the middle of its own stop left its remover behind)."""
    me = os.getpid()
    if not os.path.isdir("/proc/self"):
        return {p.pid for p in multiprocessing.active_children() if getattr(p, "_parent_pid", me) == me}
    pids = set()
    with suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with suppress(OSError, IndexError, ValueError), open(f"/proc/{entry.name}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == me:
                        pids.add(int(entry.name))
    return pids


def kill_own_children() -> None:
    """SIGKILL every process this one started (``child_pids``), and reap it: left unreaped, it would be handed to
    init when this one ends, and a container's init may never reap it (the command's process group would keep
    a zombie)."""
    pids = child_pids()
    for pid in pids:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _reap(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` s for the child ``pid`` to end, then SIGKILL it; reaped either way."""
    deadline = time.monotonic() + timeout
    with suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.05)


def _end_progress_line() -> None:
    """prepare's progress bar (``unit_progress.py``) is left in the middle of a line; the one line starts on its own."""
    try:
        sys.stderr.write("\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed or gone: nothing to separate
        pass
