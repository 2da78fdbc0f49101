"""A callback for the elastic two-host test (``tests/test_elastic_hosts.py``): ``reshard_probe.SampleLog``'s record
of each micro-batch (its step, the hashes of its sequences, its loss, the world) plus when it began and ended
(``time.time()``: both "hosts" share this machine's clock), so that the test can time the resume after a cut; and a pause that slows a world of one process down."""
from __future__ import annotations

import json
import os
import time

from lightning.pytorch.callbacks import Callback
from reshard_probe import SampleLog


class TimedSampleLog(SampleLog):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._began = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = float(outputs["loss"]) * trainer.accumulate_grad_batches  # a power of 2 here: exact
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / f"rank{trainer.global_rank}.jsonl", "a") as fh:
            fh.write(json.dumps({"step": self._step, "rows": self._rows, "loss": loss,
                                 "accumulate": trainer.accumulate_grad_batches, "world": trainer.world_size,
                                 "began": self._began, "ended": time.time(), "pid": os.getpid()}) + "\n")


class SlowAlone(Callback):
    """Each micro-batch of a world of one process takes ``pause`` seconds more: the run on the host left lasts
    long enough for the lost host to come back."""

    def __init__(self, pause: float = 0.5) -> None:
        self.pause = pause

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.world_size == 1:
            time.sleep(self.pause)


class SignalInWindow(Callback):
    """Sends SIGTERM to this process at the end of micro-batch ``batch`` (counted from 0 in the run), once: with
    gradient accumulation, inside an optimizer step's window."""

    def __init__(self, batch: int = 5) -> None:
        self.batch = batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx == self.batch:
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
