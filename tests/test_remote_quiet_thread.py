"""A remote chunk that cannot be fetched (the endpoint gone mid-epoch, a corrupt chunk) stops a fit with its one
line only: litdata's chunk thread printed ``[litdata] PrepareChunksThread CRASHED ...`` and a 17-line
traceback first, for the same error the training thread then reports (seen with the server killed mid-run).
Errors that are not the library's own keep litdata's report."""
from __future__ import annotations

from types import SimpleNamespace

from litdata.streaming.reader import PrepareChunksThread

from scalevec_lit.data import cache
from scalevec_lit.errors import RunError


def _thread() -> SimpleNamespace:
    return SimpleNamespace(_rank=0, _worker_env=SimpleNamespace(rank=0))


def test_the_library_s_own_download_error_is_not_printed_by_the_chunk_thread(capfd):
    cache.register()
    cache.register()  # once per process: not wrapped twice
    error = RunError("data.data_dir", "s3://b/p/train/chunk-0-1.bin", "downloading failed 2 times",
                     "check the endpoint")
    PrepareChunksThread._report_crash(_thread(), error)
    assert capfd.readouterr().err == ""


def test_any_other_error_of_the_chunk_thread_is_still_reported(capfd):
    cache.register()
    PrepareChunksThread._report_crash(_thread(), ValueError("a bug"))
    err = capfd.readouterr().err
    assert err.startswith("[litdata] PrepareChunksThread CRASHED (rank=0, worker=0): ValueError: a bug\n")
    assert err.count("PrepareChunksThread CRASHED") == 1
