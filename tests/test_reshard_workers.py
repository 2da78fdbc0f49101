"""The data position when a run resumes on another number of processes and its loaders have worker processes
(``data.num_workers``), and when it is resumed again after that (``data/loaders.py``: ``elastic_state``).

In process, data only: the train loader of the data module (litdata's ``StreamingDataLoader`` over the
prepared corpus, shuffled, micro-batches of 2 sequences of 33 tokens) is read as rank r of W processes
(litdata's view of the world patched), with 0, 1 or 2 loader worker processes. A global batch is 8 sequences:
each rank reads 8 / (2 W) micro-batches per step. After some steps rank 0's loader state is taken (what a
checkpoint keeps) and every rank of the next world (another W, other workers) starts from it, as a resumed
fit does. What is compared is exact: at every step the chain reads the very sequences (as a multiset over
its ranks; SHA-256 of the tokens) that one uninterrupted run of the first world read at that step, and the
state's global count is the run's (``lit/reshard.py`` refuses a checkpoint whose count differs).

Before, a resume on another world was right, but the one after it was not: with worker processes litdata's
state lost its "elastic" mark, so a resume on the same world again read another order (2 x 2 -> 1 x 2 -> 1 x 2
repeated and skipped sequences from the third part on); without, its count missed the steps before a resume
on the same world (2 x 0 -> 1 x 0 -> 1 x 0 -> 1 x 0: the fourth part repeated sequences). The last test runs
the real fits (slow), with the helpers of ``tests/test_reshard_resume.py``."""
from __future__ import annotations

import copy
import hashlib

import pytest

from scalevec_lit.data.loaders import elastic_state, relocating_loader, stream, tokens_loader

MICRO, GLOBAL, SEQ = 2, 8, 32


def _loader(monkeypatch, data, world: int, rank: int, workers: int, state):
    from litdata.utilities.env import _DistributedEnv

    env = _DistributedEnv(world, rank, 1)
    monkeypatch.setattr(_DistributedEnv, "detect", classmethod(lambda cls: env))  # forked workers inherit it
    dataset = stream(input_dir=str(data / "train"), item_loader=tokens_loader(SEQ + 1, False), shuffle=True,
                     drop_last=True, seed=42)
    loader = relocating_loader()(dataset, batch_size=MICRO, num_workers=workers, drop_last=True)
    if state is not None:
        loader.load_state_dict(copy.deepcopy(state))  # each rank reads its own copy of the checkpoint
    return loader


def _read(monkeypatch, data, world: int, workers: int, steps: int, state=None, new_epochs: bool = False):
    """``steps`` optimizer steps of a ``world``-process run: the sequences of each step (sorted hashes of all
    ranks), the steps that began an epoch and rank 0's loader state at the end. With ``new_epochs`` a new
    epoch begins where the loader ends (at a step's end only: the data is cut so); without, the end of the
    data is an error."""
    accumulate = GLOBAL // (MICRO * world)
    seen: list[list[str]] = [[] for _ in range(steps)]
    starts: set[int] = set()
    saved = None
    for rank in range(world):
        loader = _loader(monkeypatch, data, world, rank, workers, state)
        batches = iter(loader)
        for step in range(steps):
            for micro in range(accumulate):
                try:
                    batch = next(batches)
                except StopIteration:
                    assert new_epochs and micro == 0, (world, rank, step, micro)
                    starts.add(step)
                    batches = iter(loader)
                    batch = next(batches)
                seen[step] += [hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16] for row in batch]
        if rank == 0:
            saved = copy.deepcopy(loader.state_dict())  # as a checkpoint at the end of a step
        del batches
    return [sorted(s) for s in seen], starts, saved


@pytest.mark.parametrize("chain", [
    [(2, 2, 2), (1, 2, 2), (1, 2, 2)],  # workers on both sides; then the same world again
    [(1, 2, 2), (2, 1, 2), (2, 1, 2)],  # fewer workers, more processes; then the same again
    [(2, 0, 2), (1, 0, 2), (1, 0, 1), (1, 0, 1), (2, 2, 2)],  # no workers: twice the same world, then workers
], ids=["2x2-1x2-1x2", "1x2-2x1-2x1", "2x0-1x0-1x0-1x0-2x2"])
def test_every_step_reads_what_the_uninterrupted_run_read(monkeypatch, prepared_data, chain):
    """``chain``: (processes, loader workers, steps) of each part of the run, each part resumed from the
    state the one before saved."""
    total = sum(steps for *_, steps in chain)
    reference, starts, _ = _read(monkeypatch, prepared_data, chain[0][0], chain[0][1], total)
    assert not starts
    assert all(len(set(s)) == GLOBAL for s in reference) and len({h for s in reference for h in s}) == GLOBAL * total
    state, done = None, 0
    for world, workers, steps in chain:
        got, _, state = _read(monkeypatch, prepared_data, world, workers, steps, state)
        for step, sequences in enumerate(got, start=done):
            assert sequences == reference[step], (world, workers, step)
        done += steps
        assert state["dataset"]["sample_in_epoch"] == done * GLOBAL  # the count reshard_loops checks


def test_elastic_state_keeps_the_global_count_and_the_mark():
    state = {"dataset": {"num_samples_yielded": 16, "world_size": 2, "sample_in_epoch": 40, "num_workers": 2},
             "current_epoch": 1, "num_samples_yielded": 16, "latest_worker_idx": 1}
    before = copy.deepcopy(state)
    assert elastic_state(state, None, 16) is state  # not resumed on another world: litdata's own state
    assert elastic_state(state, 32, 16) == {
        "dataset": {"num_samples_yielded": 0, "world_size": 2, "sample_in_epoch": 64, "num_workers": 2,
                    "resume_mode": "elastic"},
        "current_epoch": 1, "num_samples_yielded": 16, "latest_worker_idx": 1}
    assert state == before  # the loader's own state (litdata keeps updating it) is not changed
    old = {"dataset": {"num_samples_yielded": 4, "world_size": 1}}  # a state without a global count
    assert elastic_state(old, 8, 4) is old


@pytest.mark.slow
def test_real_fits_with_loader_workers_resume_on_another_world_and_again(prepared_data, tmp_path):
    """The same through Lightning (FSDP2 on gloo, distributed checkpoints, ``tests/test_reshard_resume.py``):
    2 processes with 1 loader worker each, resumed at step 2 on 1 process with 2 workers, resumed again at
    step 4 on that same world. Each step reads the uninterrupted run's sequences, and its loss is the
    uninterrupted run's within the bound derived there (one sequence repeated or skipped is 100 times it)."""
    from collections import Counter

    from test_reshard_resume import RTOL, _fit, _steps

    ref = tmp_path / "ref"
    _fit(prepared_data, ref, 2, 6, "--data.num_workers=1")
    reference = _steps(ref / "samples")
    chain: dict[int, list] = {}
    ckpt = ref / "checkpoints" / "step000002.ckpt"
    for part, end in enumerate((4, 6)):
        run = tmp_path / f"part{part}"
        res = _fit(prepared_data, run, 1, end, f"--ckpt_path={ckpt}", "--data.num_workers=2")
        assert ("note: resuming a checkpoint of 2 process(es) on 1" in res.stderr) == (part == 0)
        got = _steps(run / "samples")
        assert sorted(got) == [end - 2, end - 1]
        chain.update(got)
        ckpt = run / "checkpoints" / f"step{end:06d}.ckpt"
    for step in range(2, 6):
        mine, theirs = chain[step], reference[step]
        assert Counter(h for rows, *_ in mine for h in rows) == Counter(h for rows, *_ in theirs for h in rows), step
        loss, expected = (sum(x[1] for x in s) / len(s) for s in (mine, theirs))
        assert abs(loss - expected) <= RTOL * abs(expected), (step, loss, expected)
