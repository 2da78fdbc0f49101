"""The data module's loader workers (``data.num_workers``) start from a fork server, never forked from the
process that reads (``data/loader_workers.py``): a rank has threads by then (the peer watchdog, gloo's,
TensorBoard's writer), and a worker forked while one of them held CPython's thread-list lock waited for ever
in ``PyOS_AfterFork_Child``, with its rank waiting for the first batch and the other ranks in the first
collective: a 2-rank fit that never ended. Here: every worker of the train and validation loaders is a
child of the fork server, none of this process, and one worker reads the batches a loader without
workers reads."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from scalevec_lit.data.datamodule import TokenDataModule


def _processes() -> list[tuple[int, int, str]]:
    """``(pid, parent pid, name)`` of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                stat = (entry / "stat").read_text()
                name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
                found.append((int(entry.name), int(rest[1]), name))
        except (OSError, ValueError):
            continue
    return found


def _workers_and_their_parents() -> list[tuple[int, int]]:
    """``(worker pid, its parent pid)`` of torch's loader workers (named ``pt_data_worker``) below this process."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, parent, _ in procs:
        children.setdefault(parent, []).append(pid)
    below, todo = set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            below.add(child)
            todo.append(child)
    return [(pid, parent) for pid, parent, name in procs if pid in below and name == "pt_data_worker"]


def test_train_and_validation_workers_start_from_the_fork_server(prepared_data):
    plain = TokenDataModule(str(prepared_data), seq_len=32, batch_size=4)
    with_workers = TokenDataModule(str(prepared_data), seq_len=32, batch_size=4, num_workers=1)
    for split in ("train", "val"):
        want = list(getattr(plain, f"{split}_dataloader")())[:3]
        loader = getattr(with_workers, f"{split}_dataloader")()
        it = iter(loader)
        got = [next(it) for _ in range(3)]
        workers = _workers_and_their_parents()
        assert len(workers) == 1, workers
        (_, parent), = workers
        assert parent != os.getpid(), workers  # not forked from here
        assert "forkserver" in Path(f"/proc/{parent}/cmdline").read_bytes().decode(errors="replace"), parent
        del it
        assert loader.multiprocessing_context.get_start_method() == "forkserver"
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)), split  # one worker

def test_without_workers_nothing_changes(prepared_data):
    loader = TokenDataModule(str(prepared_data), seq_len=32, batch_size=4).train_dataloader()
    assert loader.multiprocessing_context is None and loader.worker_init_fn is None
