"""prepare's own progress bar: one per split, counting the work units its workers have tokenized.

prepare runs litdata's ``optimize`` with ``verbose=False`` (``prepare.py``): its ``verbose=True`` printed
litdata's own lines on stdout (an advertisement for its cloud, twice, "Setting multiprocessing start_method
to fork", "Storing the files under <the temporary folder>", the setup, each worker's data format, "is
terminating" and "is done") and an unlabelled ``Progress`` bar per split. ``verbose`` governs those lines
and nothing else: a worker's error still stops ``optimize`` with the worker's traceback, which prepare
reports. What the user needs of them, the progress, is this bar instead: ``prepare: tokenizing train:
42%|...| 5/12``. A worker marks each unit it finished with an empty file in a folder of prepare's own
(``mark_done``); a thread of the command counts them and draws the bar on stderr.

A thread beside ``fork``: a worker forked while the thread held a lock (stderr's, tqdm's) would inherit the
lock held, and hang on its next write. The thread draws only while holding ``_DRAWING``, which a fork takes
first (``os.register_at_fork``), so no worker is forked in the middle of a drawing; tqdm's own monitor
thread is off for this bar.

Plain Python (tqdm is imported when a bar starts); must not import Lightning.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

POLL_S = 0.2  # how often the bar counts the finished units
_DRAWING = threading.Lock()
if hasattr(os, "register_at_fork"):  # POSIX: a fork waits until the bar's thread is not drawing
    os.register_at_fork(before=_DRAWING.acquire, after_in_parent=_DRAWING.release,
                         after_in_child=_DRAWING.release)


def mark_done(folder: str, unit_id: int) -> None:
    """In a worker: unit ``unit_id`` is tokenized (an empty file in ``folder``, which the bar counts)."""
    Path(folder, str(unit_id)).touch()


def _count(folder: Path) -> int:
    try:
        return sum(1 for _ in os.scandir(folder))
    except OSError:
        return 0


@contextmanager
def unit_progress(split: str, total: int, folder: Path) -> Iterator[None]:
    """Draw ``prepare: tokenizing <split>`` over ``total`` units while the block runs, counting the files
    ``mark_done`` makes in ``folder`` (created here, empty). When the block fails or is stopped, the bar
    stays as it was, in the middle of its line (``workers.signals_stay_ours`` ends the line before the
    command's one ``error:`` line)."""
    from tqdm import tqdm

    class Bar(tqdm):
        monitor_interval = 0  # no tqdm monitor thread (see the module's docstring)

    folder.mkdir(parents=True, exist_ok=False)
    with _DRAWING:
        bar = Bar(total=total, desc=f"prepare: tokenizing {split}", unit="unit", dynamic_ncols=True)
    stop = threading.Event()

    def draw() -> None:
        while not stop.wait(POLL_S):
            done = _count(folder)
            if done > bar.n:
                with _DRAWING:
                    bar.update(done - bar.n)

    thread = threading.Thread(target=draw, name="prepare-progress", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        stop.set()
        thread.join()
        bar.disable = True  # left where it was: a later close() draws nothing
        raise
    stop.set()
    thread.join()
    with _DRAWING:
        bar.update(_count(folder) - bar.n)
        bar.close()
