"""Callbacks that the lost-rank tests put into a real run (``--trainer.callbacks+=peer_probes.X``, with
``tests/`` on ``PYTHONPATH``)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class LoseRank(Callback):
    """Rank ``rank`` sends itself ``signal`` (SIGKILL or SIGSTOP) in the middle of step ``step`` (after its
    forward, before the backward whose gradient all-reduce the other ranks wait in) once: ``marker`` is
    written first, and a run that finds it (the restarted job) goes on. ``at="save"``: while the checkpoint of
    ``step`` is built instead (``on_save_checkpoint``, on every rank; rank 0 then writes it and waits for the
    others in a barrier)."""

    def __init__(self, rank: int = 1, step: int = 5, signal: str = "SIGKILL", marker: str = "lost.marker",
                 at: str = "backward") -> None:
        self.rank, self.step, self.signum, self.marker = rank, step, int(getattr(__import__("signal"), signal)), marker
        self.at = at

    def _lose(self, trainer, at: str) -> None:
        if (at != self.at or trainer.global_rank != self.rank or trainer.global_step != self.step
                or Path(self.marker).exists()):
            return
        Path(self.marker).write_text(f"{os.getpid()}\n")
        os.kill(os.getpid(), self.signum)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._lose(trainer, "backward")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._lose(trainer, "save")


class SlowSteps(Callback):
    """Sleep ``seconds`` after every step (a tiny model's steps take milliseconds; the weights are unchanged)."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import time

        time.sleep(self.seconds)
