"""litdata's chunk threads end with the data module that started them: reading a remote folder (a real
S3-compatible server on 127.0.0.1, ``tests/s3_server.py``) starts one ``PrepareChunksThread`` per dataset,
with asyncio download threads, and litdata's shuffler cache kept the reader, and so the thread, alive for
the rest of the process. ``TokenDataModule.teardown`` (Lightning calls it after a fit) and ``on_exception``
(a fit stopped by an error) stop them; a new iteration stops the last one's; a second fit still works."""
from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref

import lightning as L
import pytest
import torch

from s3_server import session_server

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # a server process


@pytest.fixture()
def s3(request, tmp_path_factory):
    return session_server(request, tmp_path_factory)


def _litdata_threads(before: set) -> list[str]:
    """The threads started since ``before`` that are litdata's: its readers' chunk threads and the asyncio
    download threads of their event loops."""
    from litdata.streaming.reader import PrepareChunksThread

    return sorted(t.name for t in set(threading.enumerate()) - before
                  if isinstance(t, PrepareChunksThread) or t.name.startswith("asyncio_"))


def _left(before: set, grace: float = 5.0) -> list[str]:
    """``_litdata_threads`` once the asyncio threads of a stopped loop had ``grace`` seconds to leave (litdata
    shuts their executor down without waiting); a chunk thread must be gone at once."""
    chunk = [n for n in _litdata_threads(before) if not n.startswith("asyncio_")]
    deadline = time.monotonic() + grace
    while _litdata_threads(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return chunk + [n for n in _litdata_threads(before) if n.startswith("asyncio_")]


def _module(s3, tmp_path, **kw):
    from scalevec_lit.data.datamodule import TokenDataModule

    return TokenDataModule(s3.url, seq_len=32, batch_size=4, storage_options=s3.options,
                           cache_dir=str(tmp_path / "cache"), **kw)


def test_teardown_stops_the_chunk_threads_and_a_second_read_works(s3, tmp_path):
    before = set(threading.enumerate())
    dm = _module(s3, tmp_path)
    dm.setup("fit")
    train, val = dm.train_dataloader(), dm.val_dataloader()
    first = list(itertools.islice(iter(train), 3))
    for _ in range(3):  # capped validation runs: each new iteration stops the last one's thread
        assert len(list(itertools.islice(iter(val), 2))) == 2
    chunk_threads = [n for n in _litdata_threads(before) if not n.startswith("asyncio_")]
    assert len(chunk_threads) == 2, chunk_threads  # one per dataset (train, val), not one per iteration
    readers = [weakref.ref(ds.cache._reader) for ds in dm._streams]
    dm.teardown("fit")
    assert _left(before) == []
    gc.collect()
    assert [r() for r in readers] == [None, None]  # no cache keeps litdata's readers
    cached = sorted(p.name for p in dm._local[0].glob("train/*.bin"))
    assert cached  # the chunks downloaded stay in the cache

    again = list(itertools.islice(iter(dm.train_dataloader()), 3))  # a second fit's loaders
    assert len(again) == 3 and all(torch.equal(a, b) for a, b in zip(first, again))
    assert len(next(iter(dm.val_dataloader()))) == 4
    assert set(cached) <= {p.name for p in dm._local[0].glob("train/*.bin")}
    dm.teardown("fit")
    assert _left(before) == []


class _Tiny(L.LightningModule):
    """Records the batches it trains on; raises at ``fail_at``."""

    def __init__(self, fail_at: int = -1) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.fail_at, self.seen = fail_at, []

    def training_step(self, batch, i):
        if self.global_step == self.fail_at:
            raise RuntimeError("stopped on purpose")
        self.seen.append(batch.clone())
        return batch.float().mean() * self.w.sum() * 0.0 + self.w.sum()

    def validation_step(self, batch, i):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(dm, root, model) -> None:
    trainer = L.Trainer(accelerator="cpu", max_steps=4, val_check_interval=2, limit_val_batches=1,
                        num_sanity_val_steps=0, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=root)
    trainer.fit(model, datamodule=dm)


def test_fits_from_the_bucket_leave_no_thread(s3, tmp_path):
    """Two fits with the same data module in one process, and one stopped by an error: no litdata thread
    outlives any of them, and the second fit reads the same batches as the first."""
    before = set(threading.enumerate())
    dm = _module(s3, tmp_path)
    one, two = _Tiny(), _Tiny()
    _fit(dm, tmp_path / "one", one)
    assert _left(before) == []
    _fit(dm, tmp_path / "two", two)
    assert _left(before) == []
    assert len(one.seen) == len(two.seen) == 4 and all(torch.equal(a, b) for a, b in zip(one.seen, two.seen))

    with pytest.raises(RuntimeError, match="stopped on purpose"):
        _fit(dm, tmp_path / "three", _Tiny(fail_at=3))  # Lightning calls on_exception, not teardown
    assert _left(before) == []
