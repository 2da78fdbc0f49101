"""A run resumed on another number of processes that then reads on into a new epoch
(``data/loaders.py``: ``elastic_state``, ``RelocatingLoader``, which forgets the resume at a new epoch).

As in ``tests/test_reshard_workers.py`` (data only, in process, litdata's loader read as rank r of W with 0, 1
or 2 loader worker processes), but on a small prepared folder whose epoch is 6 optimizer steps on any world,
so that a part of the chain after the resume on another world crosses the end of the epoch; a new epoch
starts the loader again, as Lightning's fit loop does. What is compared is exact, at every step (a multiset
of sequences over the ranks): the rest of the first epoch is what an uninterrupted run of the first world
read; a new epoch is what an uninterrupted run of the world that begins it reads. litdata deals an epoch out
by its readers (processes x loader workers: 2 x 0, 1 x 2 and 2 x 1 read one order, 1 x 0 and 2 x 2 others),
so after a resume from 2 readers on 1 the new epoch is 1 x 0's order, not the first world's; each epoch still
reads every sequence at most once. Without the reset of the resume at a new epoch, three chains fail."""
from __future__ import annotations

from pathlib import Path

import pytest

from scalevec_lit.data.prepare import DEFAULT_TEXT_DIR, prepare
from test_reshard_workers import GLOBAL, _read as read_steps


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A prepared folder whose train split holds a few global batches of 33-token sequences, in 12 chunks."""
    text = next(p for p in sorted(DEFAULT_TEXT_DIR.rglob("*.txt"))).read_text()[:6000]
    tmp = tmp_path_factory.mktemp("tiny")
    (tmp / "in").mkdir()
    (tmp / "in" / "a.txt").write_text(text)
    prepare(str(tmp / "in"), output_dir=tmp / "out", num_workers=1, segment_chars=400, chunk_tokens=132)
    return tmp / "out"


def _read(monkeypatch, data, world: int, workers: int, steps: int, state=None):
    return read_steps(monkeypatch, data, world, workers, steps, state, new_epochs=True)


@pytest.mark.parametrize("chain", [
    [(2, 0, 4), (1, 0, 4), (1, 0, 3)],  # resumed on 1 process at step 4; on past the epoch's end, then again
    [(2, 0, 4), (1, 0, 4), (2, 2, 4)],  # the new epoch begun on 1 x 0, resumed in it on 2 x 2
    [(2, 2, 2), (1, 2, 5), (2, 1, 4)],  # with loader workers; the second resume in the new epoch
    [(1, 2, 3), (2, 0, 7)],  # the same number of readers (2): the new epoch too is the first world's
], ids=["2x0-1x0-1x0", "2x0-1x0-2x2", "2x2-1x2-2x1", "1x2-2x0"])
def test_a_new_epoch_after_a_resume_on_another_world(monkeypatch, tiny, chain):
    """``chain``: (processes, loader workers, steps) of each part, each resumed from the state the one before
    saved; an epoch is 6 steps on any world here, so a part after the first crosses its end. The rest of the
    first epoch reads what an uninterrupted run of the first world read at each step; a new epoch, what an
    uninterrupted run of the world that begins it reads (litdata shuffles an epoch for its readers, processes
    x loader workers), also after a resume on yet another world inside it. Every epoch reads each sequence
    once."""
    total = sum(steps for *_, steps in chain)
    reference = {}
    for world, workers, _ in chain:
        if (world, workers) not in reference:
            reference[world, workers], starts, _ = _read(monkeypatch, tiny, world, workers, total)
            assert starts == {6, 12} & set(range(total))
    dealer, state, done, read = {0: chain[0][:2]}, None, 0, []
    for world, workers, steps in chain:
        got, starts, state = _read(monkeypatch, tiny, world, workers, steps, state)
        assert {done + s for s in starts} == {6, 12} & set(range(done + 1, done + steps)), (world, workers)
        dealer.update({(done + s) // 6: (world, workers) for s in starts})
        for step, sequences in enumerate(got, start=done):
            assert sequences == reference[dealer[step // 6]][step], (world, workers, step, dealer[step // 6])
        done += steps
        read += got
        assert state["current_epoch"] == 1 + (done - 1) // 6
    for epoch in range(0, total, 6):  # nothing repeated or skipped: each epoch reads 6 x 8 distinct sequences
        assert len({h for s in read[epoch:epoch + 6] for h in s}) == GLOBAL * len(read[epoch:epoch + 6])
