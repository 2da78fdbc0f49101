"""The data module's loaders: litdata's ``StreamingDataLoader`` that follows a moved folder on resume, keeps
the data position a global count after a resume on another world size (``elastic_state``) and stops with
the data's own error; the same validation batch count on every rank.

A failure while a chunk is fetched (a remote object gone, a checksum that differs, the endpoint down after
its retries: ``remote.py``) happens in litdata's prefetch thread or in a loader worker process, and reaches
the training loop as litdata's ``RuntimeError("Chunk prefetch thread crashed ...")`` or as torch's
re-raised worker error; ``user_error`` finds the ``RunError`` behind it, so the run stops with that one line.

``tokens_loader``: litdata's ``TokensLoader`` whose chunk ``delete`` (litdata's prefetch thread, when a
capped cache evicts a chunk already read) and ``close`` (the reading thread, when it moves to the next
chunk) take one lock. In litdata 0.2.76 both remove the chunk's memory map from the same dict unguarded,
and a fit from a bucket with ``data.cache_size`` stopped with ``KeyError: <chunk>`` in ``close`` when the
two met (seen at step 3 of a 12-step fit, 4,096-token chunks, a 40 KB cap).

``release``: what the data module's ``teardown`` calls. litdata's reader starts a chunk thread
(``PrepareChunksThread``, with asyncio download threads) the first time a remote dataset (a local one has
none) is read, and stops it only at the end of an epoch or when the reader is collected; but the shuffler's
``lru_cache`` (a class attribute: ``FullShuffle.get_chunks_and_intervals_per_workers``, ``Shuffle.get_len``)
keeps the shuffler, its cache and so the reader alive for the life of the process. A fit that stops mid-epoch
(``max_steps``, ``limit_val_batches``, an error) therefore left one such thread per dataset running, polling
and downloading, in a notebook, a sweep driver or a test session; and since litdata makes a new reader at each
iteration, each validation run capped by ``limit_val_batches`` left one more. ``Stream`` stops its last
reader's thread when it is iterated again; ``release`` stops and joins them and lets the readers go. litdata's
files (the cache) are left as they are, and a dataset released is read again from the start of a new reader.
A thread still downloading after ``JOIN_S`` seconds is left to end on its own, and one warning line on every
rank says so (``left_running``): a download is published only once complete (``remote.Remote.download``), so
the cache never holds a partial chunk.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import re
import threading
import time
import warnings
from typing import Any, Optional

from ..errors import RunError, UserError, notice


def user_error(err: BaseException) -> Optional[UserError]:
    """The ``UserError`` that caused ``err`` (its cause chain, or the text of a worker's traceback)."""
    seen = err
    while seen is not None:
        if isinstance(seen, UserError):
            return seen
        seen = seen.__cause__ or seen.__context__
    found = re.findall(r"(?:RunError|UserError): ([^\n]+)", str(err))  # a worker's traceback, as text
    if found:
        key, _, rest = found[-1].partition(": ")
        value, _, rest = rest.partition(": ")
        problem, _, fix = rest.partition("; ")
        return RunError(key, value, problem, fix)
    return None


@functools.lru_cache(maxsize=None)
def relocating_loader():
    """litdata's ``StreamingDataLoader``, whose restored position first goes through ``relocate`` and whose
    data errors stop the run as themselves."""
    from litdata import StreamingDataLoader

    class RelocatingLoader(StreamingDataLoader):
        relocate = None
        resumed_at = None  # the global sequence count an elastic resume started this epoch from (elastic_state)

        def load_state_dict(self, obj: dict[str, Any]) -> None:
            if hasattr(self.dataset, "_elastic_drop_first"):
                self.dataset._elastic_drop_first = None  # litdata sets it again on an elastic resume only
            with exact_position():
                super().load_state_dict(self.relocate(obj) if self.relocate is not None else obj)
            self.resumed_at = getattr(self.dataset, "_elastic_drop_first", None)

        def state_dict(self) -> dict[str, Any]:
            return elastic_state(super().state_dict(), self.resumed_at, self._num_samples_yielded_streaming)

        def __iter__(self):
            if not self.restore:  # a new epoch: litdata forgets the resume too
                self.resumed_at = None
            it = super().__iter__()
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    return
                except Exception as err:
                    found = user_error(err)
                    if found is None or found is err:
                        raise
                    raise found from None
                yield batch

    return RelocatingLoader


def elastic_state(state: dict[str, Any], resumed_at: Optional[int], yielded: int) -> dict[str, Any]:
    """The loader's ``state`` as a checkpoint should keep it when this epoch was resumed on another world
    (litdata's elastic resume, ``lit/reshard.py``) from the global count ``resumed_at``, ``yielded`` sequences
    per rank ago: marked elastic, at the global count ``resumed_at + yielded * world size``, so that the next
    resume, on any world, deals out the rest from there. litdata's own state is wrong then: with loader worker
    processes it loses the mark (the workers set it, not the main process), so a resume on the same world
    replays another order; and after a resume on the same world its count misses the sequences read before
    it (a later resume repeated them, or was refused as not matching the run's count). Otherwise unchanged."""
    dataset = state.get("dataset")
    if resumed_at is None or not isinstance(dataset, dict) or "sample_in_epoch" not in dataset:
        return state
    world = max(1, int(dataset.get("world_size", 1)))
    dataset = {**dataset, "resume_mode": "elastic", "sample_in_epoch": int(resumed_at) + int(yielded) * world,
               "num_samples_yielded": 0}  # litdata then deals out the rest from the global count, on any world
    return {**state, "dataset": dataset}


_EXACT = threading.local()  # > 0 while a Stream or a RelocatingLoader restores a position (this thread)


@functools.lru_cache(maxsize=None)
def _exact_drop() -> None:
    """litdata (0.2.76) rounds the position an elastic resume drops from the epoch down to a whole batch of
    the new world (processes x micro batch: ``_round_down_drop_first``), so when the global batch changes
    at the resume up to that many - 1 sequences are read again (6 read on 1 process, resumed on 4 with a
    micro batch of 2: all 6). The rest of the epoch is a list that litdata deals out batch by batch over the
    new ranks, so dropping the exact count keeps the ranks in step; inside ``exact_position`` the rounding is
    left out (elsewhere litdata's own is called)."""
    from litdata.streaming import dataloader, dataset, elastic

    for module in (dataset, elastic, dataloader):
        original = getattr(module, "_round_down_drop_first", None)
        if original is None or getattr(original, "exact_position", False):
            continue

        def drop_first(count, world_size, batch_size, _original=original):
            return max(0, int(count)) if getattr(_EXACT, "depth", 0) else _original(count, world_size, batch_size)

        drop_first.exact_position = True
        module._round_down_drop_first = drop_first


@contextlib.contextmanager
def exact_position():
    """litdata's elastic resume drops exactly the sequences read, in this thread, inside the block."""
    _exact_drop()
    _EXACT.depth = getattr(_EXACT, "depth", 0) + 1
    try:
        yield
    finally:
        _EXACT.depth -= 1


@functools.lru_cache(maxsize=None)
def _locked_tokens_loader():
    from litdata import TokensLoader

    class LockedTokensLoader(TokensLoader):
        """``TokensLoader`` whose ``delete`` and ``close`` of a chunk do not interleave (module docstring)."""

        def _lock(self) -> threading.Lock:
            lock = self.__dict__.get("_chunk_lock")
            if lock is None:
                lock = self.__dict__.setdefault("_chunk_lock", threading.Lock())
            return lock

        def __getstate__(self):
            state = dict(super().__getstate__())
            state.pop("_chunk_lock", None)  # a lock is not picklable: made again where used
            return state

        def delete(self, chunk_index: int, chunk_filepath: str) -> None:
            with self._lock():
                super().delete(chunk_index, chunk_filepath)

        def close(self, chunk_index: int) -> None:
            with self._lock():
                super().close(chunk_index)

    LockedTokensLoader.__module__, LockedTokensLoader.__qualname__ = __name__, "LockedTokensLoader"
    LockedTokensLoader.__name__ = "TokensLoader"  # litdata checks the loader by its class name against index.json
    return LockedTokensLoader


def tokens_loader(block_size: int, remote: bool):
    """litdata's ``TokensLoader``; for a remote folder (whose chunks are evicted) the locked one."""
    from litdata import TokensLoader

    return (_locked_tokens_loader() if remote else TokensLoader)(block_size=block_size)


def __getattr__(name: str):  # ``loaders.LockedTokensLoader``, ``loaders.Stream``: made on first use, picklable
    if name == "LockedTokensLoader":
        return _locked_tokens_loader()
    if name == "Stream":
        return _stream_class()
    raise AttributeError(name)


class FirstBatches:
    """The first ``n`` batches of ``loader``, re-iterable, with a length."""

    def __init__(self, loader, n: int) -> None:
        self.loader, self.n = loader, n

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.n)

    def __len__(self) -> int:
        return self.n


def same_batch_count_on_every_rank(loaders: list) -> list:
    """litdata gives the ranks of a distributed run validation shards of unequal length (e.g. 200 and 204
    blocks); a rank that runs one validation batch more than the others waits for them forever in FSDP's
    all-gather. Every rank therefore runs the smallest batch count of all ranks (full batches only), a
    loss of at most a batch or two per rank of the validation split."""
    import torch.distributed as dist

    counts = [len(loader) for loader in loaders]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, counts)
    fewest = [min(rank[i] for rank in every) for i in range(len(loaders))]
    if 0 in fewest:
        warnings.warn("a validation split holds fewer blocks than data.batch_size on some rank: validation runs no "
                      "batch there; lower data.batch_size or prepare a larger --val-fraction", stacklevel=2)
    return [FirstBatches(loader, n) for loader, n in zip(loaders, fewest)]


def _stop(dataset) -> list:
    """Stop the chunk thread of ``dataset``'s current reader (it returns at its next poll, 0.1 s, or after the
    download it is in) and let the reader go; the threads stopped."""
    reader = getattr(getattr(dataset, "cache", None), "_reader", None)
    thread = getattr(reader, "_prepare_thread", None)
    if thread is not None:
        thread.force_stop()
        reader._prepare_thread = None
    shuffler = getattr(dataset, "shuffler", None)
    if shuffler is not None:
        shuffler.cache = None  # the lru_cache keeps the shuffler, no longer the reader behind it
    dataset.cache = dataset.shuffler = None  # the next iteration makes both again, as litdata does at each one
    return [thread] if thread is not None else []


def _join(threads: list, timeout: float, when: str) -> list:
    """Wait at most ``timeout`` seconds in all for ``threads`` to end; those still alive, reported in one
    warning line (``when``: what stopped them)."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in threads if t.is_alive()]
    if left:
        notice(left_running(len(left), timeout, when), "warning", every_rank=True)
    return left


def left_running(n: int, timeout: float, when: str) -> str:
    """The line about ``n`` chunk threads still running ``timeout`` seconds after ``when``."""
    return (f"data: {n} chunk download thread{'s' if n > 1 else ''} of litdata still running {timeout:g} s after "
            f"{when}, left to end on {'their' if n > 1 else 'its'} own when the download in flight completes or "
            "fails (a read stalled for data.storage_options timeout, 60 s by default, is retried up to its "
            "retries); the cache holds no partial chunk: a download is written to <chunk>.tmp.<thread>.<pid> "
            "and renamed only once complete and checked, and a temporary file its process left is removed by "
            "the next run over that cache; nothing to do unless it recurs: then the endpoint is slow or stalls, "
            "so check it, or lower data.storage_options timeout to give up on a stalled download sooner")


@functools.lru_cache(maxsize=None)
def _stream_class():
    from litdata import StreamingDataset

    class Stream(StreamingDataset):
        """litdata's ``StreamingDataset`` whose reader's chunk thread ends when the reader is left: at the next
        iteration (litdata makes a new reader each time; a validation run capped by ``val_batches`` left the
        last one's thread running) and at ``release`` (module docstring)."""

        def __iter__(self):
            _join(_stop(self), JOIN_S, "a new pass over the data stopped the last one's")  # one reader at a time
            with exact_position():  # litdata builds the plan of an elastic resume here (in the loader worker)
                return super().__iter__()

    _exact_drop()  # a loader worker started from a fork server unpickles the dataset through here
    Stream.__module__, Stream.__qualname__, Stream.__name__ = __name__, "Stream", "Stream"
    return Stream


#: how long stopping a reader waits for its chunk thread (busy with a download: until it is done)
JOIN_S = 10.0


def stream(**kwargs):
    """A ``Stream`` (litdata's ``StreamingDataset`` with ``kwargs``)."""
    return _stream_class()(**kwargs)


def release(datasets, timeout: float = JOIN_S) -> list:
    """Stop the chunk thread of each litdata dataset in ``datasets`` and let its reader go; wait at most
    ``timeout`` seconds in all for the threads to end. The threads still alive then (one whose download
    outlasted the wait; it ends after it), reported in one warning line (``left_running``)."""
    return _join([t for ds in datasets for t in _stop(ds)], timeout, "the data module stopped them")
