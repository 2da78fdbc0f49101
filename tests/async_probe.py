"""Callbacks that ``tests/test_async_checkpoint.py`` puts into a real run (``tests/`` on ``PYTHONPATH``)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class _Slow:
    """Pickles slowly when the checkpoint holding it is written at step ``at``: it writes ``<out>/writing``
    (with the writing thread's name) and then sleeps ``seconds`` (a deterministic, slow write); unpickles as
    an empty dict."""

    def __init__(self, out: str, step: int, at: int, seconds: float) -> None:
        self.out, self.step, self.at, self.seconds = out, step, at, seconds

    def __reduce__(self):
        if self.step == self.at:
            Path(self.out, "writing").write_text(threading.current_thread().name)
            time.sleep(self.seconds)
        return (dict, ())


class SlowCheckpoint(Callback):
    """Makes the checkpoint of step ``at`` take ``seconds`` to write; appends each finished step to
    ``<out>/steps``."""

    def __init__(self, out: str, at: int, seconds: float = 120.0) -> None:
        self.out, self.at, self.seconds = out, at, seconds
        Path(out).mkdir(parents=True, exist_ok=True)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        checkpoint["slow_probe"] = _Slow(self.out, trainer.global_step, self.at, self.seconds)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        with open(Path(self.out, "steps"), "a") as fh:
            fh.write(f"{trainer.global_step}\n")


class SlowDistributedCheckpoint(SlowCheckpoint):
    """Under ``async_save`` with FSDP2 (a DCP folder): holds the writer thread for ``seconds`` once DCP has written
    the folder of step ``at``, before it is hashed and renamed (``_async_write.record_checksums`` runs in that
    thread, on the ``<name>.tmp`` folder); writes ``<out>/writing`` with the thread's name first."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        pass  # nothing slow in the checkpoint dict: DCP's meta.pt is written by the training thread

    def on_train_start(self, trainer, pl_module) -> None:
        from scalevec_lit.callbacks import _async_write

        hashed, out, slow = _async_write.record_checksums, self.out, f"step{self.at:06d}.ckpt.tmp"

        def record_checksums(folder, *args, **kwargs):
            if Path(folder).name == slow:
                Path(out, "writing").write_text(threading.current_thread().name)
                time.sleep(self.seconds)
            return hashed(folder, *args, **kwargs)

        _async_write.record_checksums = record_checksums
