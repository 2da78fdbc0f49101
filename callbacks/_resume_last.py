"""``--ckpt_path last`` with nothing to resume yet: the first start of a job that always passes it (a SLURM job
requeued after a time limit, a torchrun restart) starts from step 0 without Lightning's warning, which says
`.fit(ckpt_path="last") is set, but there is no last checkpoint available ... HINT: Set ModelCheckpoint(...,
save_last=True)`: untrue of a run whose ``SafeModelCheckpoint`` resumes from its newest checkpoint of any name,
and meant for a mistake this run did not make. The run folder line already says what the run does
(``lit/runfolder.py``: "resuming its newest checkpoint", or where its checkpoints go)."""
from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import OnExceptionCheckpoint

from .checkpoint import SafeModelCheckpoint


def nothing_to_resume(trainer, ckpt_path: Any) -> bool:
    """Whether ``ckpt_path`` is ``last`` and every checkpoint callback of ``trainer`` is a ``SafeModelCheckpoint``
    with a local folder that holds no complete checkpoint (the same search ``--ckpt_path last`` makes). Any other
    checkpoint callback, or a remote folder, leaves the decision to Lightning."""
    if str(ckpt_path) != "last":
        return False
    callbacks = trainer.checkpoint_callbacks
    if not callbacks or any(isinstance(cb, OnExceptionCheckpoint) for cb in trainer.callbacks):
        return False
    if not all(isinstance(cb, SafeModelCheckpoint) for cb in callbacks):
        return False
    if any("://" in str(cb.dirpath or trainer.default_root_dir) for cb in callbacks):
        return False
    return not any(cb._find_last_checkpoints(trainer) for cb in callbacks)
