"""How the data module's loader workers (``data.num_workers``) start: from a fork server, never forked from
the rank itself.

A rank has threads when its loader starts workers: the peer watchdog (``lit/peers.py``), gloo's, TensorBoard's
writer, litdata's chunk thread of a remote folder. ``fork`` copies a process with its locks in whatever state
its other threads hold them, and the child has only the thread that forked. CPython 3.11's child first clears
the other threads' states, under the interpreter's thread-list lock, and only then makes that lock new: a
worker forked while another thread held it (a thread starting or ending, or reading the list) waits for ever
in ``PyOS_AfterFork_Child``. Its rank then waits for the worker's first batch with no timeout, the other ranks
wait in the step's first collective, and the fit never ends (seen once in about 60 six-step fits of 2 ranks
with one worker each; litdata gives the same advice for its Parquet loader's threads). Python 3.14 made the
fork server its default start method on Linux for this reason.

The fork server is a process of its own, started once per rank by ``fork`` + ``exec`` (nothing of the rank's
threads or locks), which imports torch, litdata and the data modules once and forks each worker from itself,
single-threaded. A worker gets what it needs pickled: the dataset (the library's dataset and item-loader
classes are importable by name, ``loaders.Stream``, ``loaders.LockedTokensLoader``), and ``start_worker``,
which registers the library's ``s3://`` downloader again in a worker that reads a remote folder (a
registration the rank made, which a worker no longer inherits). Platforms without a fork server (Windows)
keep their default, ``spawn``, which is as safe.
"""
from __future__ import annotations

import multiprocessing
from typing import Any

PRELOAD = ["torch", "litdata", "scalevec_lit.data.loaders", "scalevec_lit.data.cache"]


def worker_args(num_workers: int, remote: bool) -> dict[str, Any]:
    """A ``DataLoader``'s worker arguments: ``num_workers``; its ``multiprocessing_context``, the fork server
    where the platform has one (``None``, the default, without workers or without a fork server); and, for a
    remote folder, ``worker_init_fn=start_worker``."""
    context = None
    if num_workers > 0 and "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)  # read when the server starts (the first loader with workers)
    return dict(num_workers=num_workers, multiprocessing_context=context,
                worker_init_fn=start_worker if remote and num_workers > 0 else None)


def start_worker(worker_id: int) -> None:
    """In each loader worker of a remote folder, before its first item: the library's ``s3://`` downloader."""
    from .cache import register

    register()
