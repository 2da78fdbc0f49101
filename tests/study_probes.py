"""A callback that the study tests put into one run of a study (``--trainer.callbacks+=study_probes.X`` in a
variant's ``args``, with ``tests/`` on ``PYTHONPATH``), to interrupt the study at an exact step of that run."""
from __future__ import annotations

import os
import signal
import time

from lightning.pytorch.callbacks import Callback


class InterruptStudyAt(Callback):
    """At the end of optimizer step ``step`` (``trainer.global_step == step``), send SIGINT to the parent process
    (the study runner) and wait until the runner has passed it on to this run's checkpoint callback, so that
    the run stops at exactly this step. Never again after a resume past it."""

    def __init__(self, step: int = 1) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        os.kill(os.getppid(), signal.SIGINT)
        deadline = time.time() + 120
        while time.time() < deadline and not any(getattr(cb, "_received", None) for cb in trainer.callbacks):
            time.sleep(0.02)
