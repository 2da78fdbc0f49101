"""The data module's loaders: litdata's ``StreamingDataLoader`` that follows a moved folder on resume and
stops with the data's own error; the same validation batch count on every rank.

A failure while a chunk is fetched (a remote object gone, a checksum that differs, the endpoint down after
its retries: ``remote.py``) happens in litdata's prefetch thread or in a loader worker process, and reaches
the training loop as litdata's ``RuntimeError("Chunk prefetch thread crashed ...")`` or as torch's
re-raised worker error; ``user_error`` finds the ``RunError`` behind it, so the run stops with that one line.
"""
from __future__ import annotations

import functools
import itertools
import re
import warnings
from typing import Any, Optional

from ..errors import RunError, UserError


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

        def load_state_dict(self, obj: dict[str, Any]) -> None:
            super().load_state_dict(self.relocate(obj) if self.relocate is not None else obj)

        def __iter__(self):
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
