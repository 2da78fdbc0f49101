"""A callback that the two-host tests put into a real run (``--trainer.callbacks+=host_probes.MarkStep``, with
``tests/`` on ``PYTHONPATH``): the test times its fault by it."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class MarkStep(Callback):
    """In the middle of step ``step`` (after the forward, before the backward whose gradient all-reduce needs every
    rank), every rank writes ``<folder>/rank<N>`` (its hostname and pid) and waits ``pause`` seconds, once: the test
    injects its fault meanwhile, so it lands mid-step."""

    def __init__(self, folder: str, step: int = 5, pause: float = 4.0) -> None:
        self.folder, self.step, self.pause = Path(folder), step, pause

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        marker = self.folder / f"rank{trainer.global_rank}"
        if trainer.global_step != self.step or marker.exists():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        marker.with_suffix(".tmp").write_text(f"{socket.gethostname()} {os.getpid()}\n")
        marker.with_suffix(".tmp").rename(marker)
        time.sleep(self.pause)
