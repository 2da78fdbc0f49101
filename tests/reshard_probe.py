"""A callback that the world-size tests (``tests/test_reshard_resume.py``) put into a real run: every rank
appends, per micro-batch, the optimizer step it belongs to, the hash of each sequence it read and its loss
(``--trainer.callbacks+=reshard_probe.SampleLog``, with ``tests/`` on ``PYTHONPATH``)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class SampleLog(Callback):
    """Appends one JSON line per micro-batch to ``<out>/rank<R>.jsonl``: ``step`` (the optimizer step it
    feeds), ``rows`` (the SHA-256 of each sequence's tokens, first 16 hex digits) and ``loss`` (its
    micro-batch loss, undoing Lightning's division by the accumulation)."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self._rows: list[str] = []
        self._step = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._step = trainer.global_step
        self._rows = [hashlib.sha256(row.cpu().numpy().tobytes()).hexdigest()[:16] for row in batch]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = float(outputs["loss"]) * trainer.accumulate_grad_batches  # a power of 2 in the tests: exact
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / f"rank{trainer.global_rank}.jsonl", "a") as fh:
            fh.write(json.dumps({"step": self._step, "rows": self._rows, "loss": loss,
                                 "accumulate": trainer.accumulate_grad_batches, "world": trainer.world_size,
                                 "pid": os.getpid()}) + "\n")
