"""Callbacks that ``tests/test_slurm.py`` puts into jobs (``--trainer.callbacks+=slurm_probes.X``, with ``tests/``
on ``PYTHONPATH``; the job inherits it from ``sbatch``)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


def _start() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


class Pace(Callback):
    """Rank 0 appends ``<start> <global_step>`` to ``out`` after every step (``start``: the job's
    ``SLURM_RESTART_COUNT``); on the job's first start every rank also sleeps ``seconds`` per step, so that the test
    can act while it trains (the weights are unchanged)."""

    def __init__(self, out: str, seconds: float = 0.0) -> None:
        self.out, self.seconds = out, seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero:
            with open(self.out, "a") as fh:
                fh.write(f"{_start()} {trainer.global_step}\n")
        if _start() == 0:
            time.sleep(self.seconds)


class LoseEachStart(Callback):
    """Rank ``rank`` kills itself (SIGKILL) ``after`` steps into every start of the job."""

    def __init__(self, rank: int = 1, after: int = 2) -> None:
        self.rank, self.after, self.first = rank, after, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.first = trainer.global_step - 1 if self.first is None else self.first
        if trainer.global_rank == self.rank and trainer.global_step - self.first >= self.after:
            os.kill(os.getpid(), signal.SIGKILL)


def steps(out: Path) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split())) for line in out.read_text().splitlines()] if out.exists() else []
