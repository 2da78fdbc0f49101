"""A callback for the elastic two-host test (``tests/test_elastic_hosts.py``): ``reshard_probe.SampleLog``'s record
of each micro-batch (its step, the hashes of its sequences, its loss, the world) plus when it began and ended
(``time.time()``: both "hosts" share this machine's clock), so that the test can time the resume after a cut."""
from __future__ import annotations

import json
import time

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
                                 "began": self._began, "ended": time.time()}) + "\n")
