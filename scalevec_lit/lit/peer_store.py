"""The rendezvous store as the lost-rank watchdog (``peers.py``) uses it: a client of its own, each call bounded by
a thread of its own, and the note a worker leaving with 75 writes for its launcher."""
from __future__ import annotations

import os
import threading
from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from typing import Optional


def heartbeat_interval(timeout: float) -> float:
    """Seconds between beats: a tenth of the timeout, between 0.2 s and 5 s."""
    return min(5.0, max(0.2, timeout / 10))


#: set by ``launch/torchrun_fit.sh``: where a worker that leaves with 75 says so (its launcher then exits 75 too)
LOST_NOTE_ENV = "SCALEVEC_LOST_NOTE"


def _lost_note() -> Optional[Path]:
    base = os.environ.get(LOST_NOTE_ENV)
    return Path(f"{base}.{os.environ.get('LOCAL_RANK', '0')}") if base else None


def note_lost() -> None:
    """This worker leaves with 75: tell the launcher (torchrun itself exits 1 for any failed worker), with the
    restart count of this start (the launcher ends a torchrun whose agent hangs after its last start's 75)."""
    note = _lost_note()
    if note is not None:
        with suppress(OSError):
            note.write_text(f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}\n")


def clear_lost_note() -> None:
    note = _lost_note()
    if note is not None:
        with suppress(OSError):
            note.unlink(missing_ok=True)


def _store_client(timeout: float):
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0"))
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout), wait_for_workers=False)
    prefix = f"scalevec_peers/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return dist.PrefixStore(prefix, store)


class _Call:
    """One store call in a thread of its own, waited for at most a bound by the caller: a ``TCPStore`` client call
    to a host cut off from this one (its link down: no reset, no answer) blocks far beyond the client's timeout
    (over 90 s with a 5 s timeout, measured), and the watchdog must still see the silence and leave."""

    def __init__(self, fn) -> None:
        self.done = threading.Event()
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(fn,), name="scalevec-peer-store", daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            self.error = err
        finally:
            self.done.set()

    def wait(self, seconds: float):
        if not self.done.wait(seconds):
            raise TimeoutError(f"the rendezvous store did not answer in {seconds:g} s")
        if self.error is not None:
            raise self.error
        return self.result
