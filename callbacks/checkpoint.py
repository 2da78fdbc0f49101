"""SafeModelCheckpoint: Lightning's ModelCheckpoint with a stable folder and atomic writes.

- ``dirpath`` defaults to ``<trainer.default_root_dir>/checkpoints`` (not the logger's version folder),
  so ``--ckpt_path last`` finds the checkpoint of a killed run when it is started again, and it resumes
  from the newest complete checkpoint there, whatever its name;
- files are written as ``<name>.tmp`` and renamed (see ``scalevec_lit.lit.checkpoint.SafeCheckpointIO``),
  distributed (DCP) checkpoint folders likewise, so a crash while saving keeps the last good one.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint

from scalevec_lit.lit.checkpoint import replace_directory


class SafeModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose default folder survives restarts and whose writes are atomic."""

    def _stable_dirpath(self, trainer) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._stable_dirpath(trainer)
        super().setup(trainer, pl_module, stage)

    def _find_last_checkpoints(self, trainer) -> set[str]:
        """Every complete checkpoint in the folder (Lightning resumes from the newest): a run killed between
        writing ``step*.ckpt`` and ``last.ckpt`` still resumes from its newest file."""
        self._stable_dirpath(trainer)  # --ckpt_path last is resolved before setup
        folder = Path(self.dirpath)
        if not folder.is_dir():
            return set()
        return {
            os.path.normpath(p) for p in folder.iterdir()
            if p.suffix == self.FILE_EXTENSION and p.name != "nonfinite.ckpt"
        }

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        if not (getattr(trainer.strategy, "_save_distributed_checkpoint", False) and trainer.world_size > 1):
            return super()._save_checkpoint(trainer, filepath)  # one file: SafeCheckpointIO makes it atomic
        # a folder of shards: every rank writes into a temporary folder, then rank 0 swaps it in
        tmp = Path(filepath + ".tmp")
        if trainer.is_global_zero and tmp.exists():
            shutil.rmtree(tmp)
        trainer.strategy.barrier("safe_checkpoint_clean")
        trainer.save_checkpoint(str(tmp), self.save_weights_only)
        trainer.strategy.barrier("safe_checkpoint_written")
        if trainer.is_global_zero:
            replace_directory(tmp, Path(filepath))
        trainer.strategy.barrier("safe_checkpoint_renamed")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(self)

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        if Path(filepath).exists():
            super()._remove_checkpoint(trainer, filepath)
