"""A resume whose global batch changes (a run that sets ``trainer.accumulate_grad_batches``, not
``global_batch_size``) carries the data position exactly (``lit/reshard.py``, ``data/loaders.py``).

litdata rounds the position of an elastic resume down to a whole batch of the new world (processes x
micro batch): 1 process reading 6 sequences a step (micro batch 2, accumulation 3), resumed after one step on
4 processes reading 8 (accumulation 1), read sequences 0-5 again at its first step (0 is 6 rounded down to a
multiple of 4 x 2), and a resume on 2 processes read 4-5 again. The library now drops exactly the sequences
read. What is compared is exact: the sequences (SHA-256 of their tokens) a chain of runs reads over all its
parts, as a multiset, equal those the uninterrupted run of the first world read in as many sequences, each
once; and the global count every checkpoint records equals the loader's.

The data-level test reads litdata's loaders in process as rank r of W (``tests/test_reshard_workers.py``); the
last test runs the reproduction as real fits (FSDP2 on gloo, ``tests/test_reshard_resume.py``).
"""
from __future__ import annotations

import copy
import hashlib
import os
import re
from collections import Counter

import pytest

from helpers import ROOT, run_cli, smoke_args
from test_reshard_workers import MICRO, _loader


def _read(monkeypatch, data, world: int, accumulate: int, steps: int, state=None, workers: int = 0):
    """All sequences ``steps`` optimizer steps of ``world`` processes read (hashes, all ranks) and rank 0's
    loader state at the end."""
    seen, saved = [], None
    for rank in range(world):
        loader = _loader(monkeypatch, data, world, rank, workers, state)
        batches = iter(loader)
        for _ in range(steps * accumulate):
            seen += [hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16] for row in next(batches)]
        if rank == 0:
            saved = copy.deepcopy(loader.state_dict())
        del batches
    return seen, saved


@pytest.mark.parametrize("chain", [
    [(1, 0, 3, 1), (4, 0, 1, 1), (4, 0, 1, 1), (2, 0, 2, 1)],  # the reproduction, then the same world, another
    [(1, 2, 3, 1), (2, 1, 1, 2), (1, 0, 4, 2)],  # with loader workers: 6 -> 4 -> 8 sequences a step
], ids=["1x0-4x0-4x0-2x0", "1x2-2x1-1x0"])
def test_a_resume_that_changes_the_global_batch_reads_on_from_the_exact_position(monkeypatch, prepared_data, chain):
    """``chain``: (processes, loader workers, accumulation, steps) of each part, each resumed from the state
    the part before saved; every part after the first changes the global batch or the world."""
    total = sum(world * accumulate * MICRO * steps for world, _, accumulate, steps in chain)
    first = chain[0]
    assert total % (first[0] * first[2] * MICRO) == 0
    reference, _ = _read(monkeypatch, prepared_data, first[0], first[2], total // (first[0] * first[2] * MICRO),
                         workers=first[1])
    assert len(set(reference)) == total  # the uninterrupted run reads each sequence once
    read, state, done = [], None, 0
    for world, workers, accumulate, steps in chain:
        got, state = _read(monkeypatch, prepared_data, world, accumulate, steps, state, workers)
        read += got
        done += world * accumulate * MICRO * steps
        assert state["dataset"]["sample_in_epoch"] == done, (world, workers, accumulate)
    assert Counter(read) == Counter(reference)  # nothing repeated, nothing skipped


def test_the_recorded_count_follows_the_data_after_the_global_batch_changed():
    """Lightning's micro-batch counter no longer gives the position after such a resume (6 sequences read by 1
    process in 3 micro-batches, resumed on 4 processes of 1 micro-batch: counter 1, i.e. 8): the records of
    that epoch add the difference, so a later resume finds the count its loader holds."""
    from scalevec_lit.lit.reshard import KEY, position_offset, reshard_loops, world_record

    progress = {"current": {"ready": 3, "completed": 3, "started": 3, "processed": 3},
                "total": {"ready": 3, "completed": 3, "started": 3, "processed": 3}}
    loader = {"dataset": {"input_dir_path": "/d/train", "world_size": 1, "batch_size": 2, "sample_in_epoch": 6}}
    ckpt = {"epoch": 0, "loops": {"fit_loop": {"epoch_loop.batch_progress": progress,
                                               "state_dict": {"combined_loader": [loader]}}}}
    ckpt[KEY] = world_record(world_size=1, accumulate=3, micro_batch=2, loops=ckpt["loops"])
    line = reshard_loops(ckpt, world_size=4, accumulate=1, micro_batch=2)
    assert line == ("resuming a checkpoint of 1 process(es) on 4: the global batch changes from 6 to 8 sequences (set "
                    "global_batch_tokens or global_batch_size to keep it), 1 accumulation step(s) per rank (were 3); "
                    "data position: 6 sequences read in this epoch, the rest dealt out over 4 rank(s)")
    assert progress["current"]["ready"] == 1
    offset = position_offset(ckpt, world_size=4, micro_batch=2)
    assert offset == -2
    progress["current"]["ready"] = 3  # two steps later: 6 + 2 x 8 sequences
    later = world_record(world_size=4, accumulate=1, micro_batch=2, loops=ckpt["loops"], offset=offset)
    assert later["sequences"] == 22 and later["sequences_per_step"] == 8
    ckpt[KEY] = later
    loader["dataset"].update(world_size=4, sample_in_epoch=22)
    assert position_offset(ckpt, world_size=4, micro_batch=2) == -2  # resumed on the same world: still -2
    assert "data position: 22 sequences read" in reshard_loops(ckpt, world_size=2, accumulate=2, micro_batch=2)
    assert progress["current"]["ready"] == 6 and position_offset(ckpt, world_size=2, micro_batch=None) == -2


def _fit(data, root, world: int, accumulate: int, steps: int, *extra: str):
    """A tiny FSDP2 fit (gloo) of ``world`` processes accumulating ``accumulate`` micro-batches of 2 (no
    ``global_batch_size``), a checkpoint every step, each rank's sequences logged (``reshard_probe.py``)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "ckpt.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 1,"
        " save_last: false, save_top_k: -1}\n"
        f"    - class_path: reshard_probe.SampleLog\n      init_args: {{out: {root / 'samples'}}}\n")
    args = smoke_args(data, root, steps, "--config", str(root / "ckpt.yaml"), f"--trainer.devices={world}",
                      "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
                      "--trainer.strategy.data_parallel_size=auto", "--trainer.strategy.tensor_parallel_size=1",
                      "--trainer.strategy.process_group_backend=gloo", "--trainer.limit_val_batches=0",
                      "--model.config.n_layer=1", "--model.config.n_embd=32", "--model.config.n_head=2",
                      "--model.config.n_kv_head=1", "--model.config.seq_len=32", "--data.batch_size=2",
                      f"--trainer.accumulate_grad_batches={accumulate}", *extra)
    res = run_cli(args, cwd=root, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"})
    assert res.returncode == 0, res.stderr[-4000:]
    steps_read: dict[int, list[str]] = {}
    for f in sorted((root / "samples").glob("rank*.jsonl")):
        for rec in map(__import__("json").loads, f.read_text().splitlines()):
            steps_read.setdefault(rec["step"], []).extend(rec["rows"])
    return res, steps_read


@pytest.mark.slow
def test_one_process_of_6_sequences_a_step_resumed_on_4_of_8_reads_on_from_sequence_6(prepared_data, tmp_path):
    """The reproduction: 1 process, micro batch 2, accumulation 3 (6 sequences a step), its step-1 checkpoint
    resumed on 4 processes with accumulation 1 (8 a step) for 2 steps, whose last checkpoint is resumed on 2
    processes with accumulation 2 (8) for 1 step: 6 + 16 + 8 sequences, as many as 5 steps of the
    uninterrupted run, and the same ones. Before, the first step on 4 processes read step 0's 6 again."""
    _, reference = _fit(prepared_data, tmp_path / "ref", 1, 3, 5)
    assert sorted(reference) == list(range(5)) and len({h for s in reference.values() for h in s}) == 30
    read = list(reference[0])
    lines = []
    ckpt = tmp_path / "ref" / "checkpoints" / "step000001.ckpt"
    for world, accumulate, end in ((4, 1, 3), (2, 2, 4)):
        run = tmp_path / f"w{world}"
        res, got = _fit(prepared_data, run, world, accumulate, end, f"--ckpt_path={ckpt}")
        lines += re.findall(r"note: resuming a checkpoint of .*? over \d+ rank\(s\)", res.stderr)
        assert sorted(got) == list(range(end - len(got), end)) and len(got) == (2 if world == 4 else 1)
        new = [h for step in sorted(got) for h in got[step]]
        assert not set(new) & set(read), (world, sorted(got))  # before: step 1 on 4 processes read step 0 again
        read += new
        ckpt = run / "checkpoints" / f"step{end:06d}.ckpt"
    assert lines == [
        "note: resuming a checkpoint of 1 process(es) on 4: the global batch changes from 6 to 8 sequences (set "
        "global_batch_tokens or global_batch_size to keep it), 1 accumulation step(s) per rank (were 3); data "
        "position: 6 sequences read in this epoch, the rest dealt out over 4 rank(s)",
        "note: resuming a checkpoint of 4 process(es) on 2: the same global batch of 8 sequences, 2 accumulation "
        "step(s) per rank (were 1); data position: 22 sequences read in this epoch, the rest dealt out over 2 "
        "rank(s)"]
    assert Counter(read) == Counter(h for s in reference.values() for h in s)  # none repeated, none skipped
