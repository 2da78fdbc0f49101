"""Callbacks that the tests put into a real run (``--trainer.callbacks+=probes.X``, with ``tests/`` on
``PYTHONPATH``) to act at an exact moment of it."""
from __future__ import annotations

import os
import signal

from lightning.pytorch.callbacks import Callback


class SendSignal(Callback):
    """Send ``signal`` (a name: SIGINT, SIGTERM, SIGUSR1) to this process at the hook ``at``: ``setup``
    (start-up, before the sanity check), ``sanity`` (the validation sanity check), ``train_end`` (after
    the last training step, before the last checkpoint is written)."""

    def __init__(self, signal: str = "SIGTERM", at: str = "sanity") -> None:
        self.signum = int(getattr(__import__("signal"), signal))
        self.at = at

    def _send(self, here: str) -> None:
        if here == self.at:
            os.kill(os.getpid(), self.signum)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._send("setup")

    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self._send("sanity")

    def on_train_end(self, trainer, pl_module) -> None:
        self._send("train_end")
