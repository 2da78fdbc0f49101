"""``loaders.release`` (the data module's ``teardown``): a chunk thread still downloading after the wait is
reported in one warning line, by every rank; threads that end in time are not. A thread of the test stands
in for litdata's ``PrepareChunksThread`` (stopped by ``force_stop``), stuck in its download until the test
lets it go."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from scalevec_lit.data.loaders import release

LINE = ("data: {n} chunk download {threads} of litdata still running 0.1 s after the data module stopped them, "
        "left to end on {own} own when the download in flight completes or fails (a read stalled for "
        "data.storage_options timeout, 60 s by default, is retried up to its retries); the cache holds no partial "
        "chunk: a download is written to <chunk>.tmp.<thread>.<pid> and renamed only once complete and checked, and "
        "a temporary file its process left is removed by the next run over that cache; nothing to do unless it "
        "recurs: then the endpoint is slow or stalls, so check it, or lower data.storage_options timeout to give "
        "up on a stalled download sooner")


class ChunkThread(threading.Thread):
    """Ends at ``force_stop``, or, ``stuck`` in a download, only once ``done`` is set."""

    def __init__(self, stuck: bool) -> None:
        super().__init__(daemon=True)
        self.stuck, self.stopped, self.done = stuck, threading.Event(), threading.Event()
        self.start()

    def run(self) -> None:
        self.stopped.wait()
        if self.stuck:
            self.done.wait()

    def force_stop(self) -> None:
        self.stopped.set()


def _dataset(thread: ChunkThread) -> SimpleNamespace:
    """What ``release`` reaches of a litdata dataset: its reader's chunk thread."""
    return SimpleNamespace(cache=SimpleNamespace(_reader=SimpleNamespace(_prepare_thread=thread)), shuffler=None)


@pytest.fixture()
def threads():
    made: list[ChunkThread] = []

    def make(stuck: bool) -> ChunkThread:
        made.append(ChunkThread(stuck))
        return made[-1]

    yield make
    for t in made:  # the stuck downloads end
        t.done.set()
        t.join(5)
    assert not any(t.is_alive() for t in made)


def test_a_download_outlasting_the_wait_is_reported_in_one_line_and_a_prompt_end_is_not(threads, capfd, monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    prompt = [threads(False), threads(False)]  # threads that end in time: nothing said
    assert release([_dataset(t) for t in prompt] + [SimpleNamespace(cache=None, shuffler=None)], timeout=5.0) == []
    assert capfd.readouterr().err == ""
    assert not any(t.is_alive() for t in prompt)

    stuck, prompt = threads(True), threads(False)
    datasets = [_dataset(stuck), _dataset(prompt)]
    assert release(datasets, timeout=0.1) == [stuck]
    assert capfd.readouterr().err == "warning: " + LINE.format(n=1, threads="thread", own="its") + "\n"
    assert [ds.cache for ds in datasets] == [None, None]  # the readers are let go all the same
    assert not prompt.is_alive()
    stuck.done.set()  # the download completes: the thread ends on its own
    stuck.join(5)
    assert not stuck.is_alive()

    two = [threads(True), threads(True)]
    monkeypatch.setenv("RANK", "3")  # another rank says it too, naming itself
    assert release([_dataset(t) for t in two], timeout=0.1) == two
    assert capfd.readouterr().err == "warning: rank 3: " + LINE.format(n=2, threads="threads", own="their") + "\n"

