"""A run's checkpoint folder moved (or named relative, then absolute) and resumed there: ``last.ckpt`` is the
newest step again and the top-k bookkeeping follows the files. Lightning compares the folder by its string;
when it differed it forgot ``last_model_path`` and ``best_k_models`` (a warning only), so the resumed run wrote
``last-v1.ckpt`` beside a ``last.ckpt`` left at the old step (what ``export`` and ``inspect`` then read) and
never deleted the checkpoints that fell out of the top k."""
from __future__ import annotations

import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from plain_module import OwnLoader
from scalevec_lit.runlock import moved_folder_state

pytestmark = pytest.mark.usefixtures("one_thread")


class Scored(OwnLoader):
    """Logs the step itself as ``score``: with ``mode='min'`` the earliest steps are the best."""

    def training_step(self, batch, batch_idx):
        self.log("score", float(self.global_step + 1))
        return super().training_step(batch, batch_idx)


def _fit(folder: Path, steps: int, module, ckpt_path=None, **kwargs) -> None:
    from scalevec_lit.callbacks import SafeModelCheckpoint

    cb = SafeModelCheckpoint(dirpath=folder, filename="step{step}", auto_insert_metric_name=False,
                             every_n_train_steps=2, save_last=True, **kwargs)
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb])
    trainer.fit(module, ckpt_path=ckpt_path)


def test_a_moved_folder_resumed_there_keeps_last_ckpt_the_newest(tmp_path):
    first, moved = tmp_path / "first", tmp_path / "moved"
    _fit(first, 4, OwnLoader(), save_top_k=-1)
    shutil.move(first, moved)
    _fit(moved, 6, OwnLoader(), ckpt_path=moved / "last.ckpt", save_top_k=-1)
    assert sorted(p.name for p in moved.glob("*.ckpt")) == ["last.ckpt", "step2.ckpt", "step4.ckpt", "step6.ckpt"]
    assert torch.load(moved / "last.ckpt", weights_only=False)["global_step"] == 6


def test_a_moved_folder_keeps_its_top_k(tmp_path):
    first, moved = tmp_path / "first", tmp_path / "moved"
    _fit(first, 4, Scored(), save_top_k=1, monitor="score", mode="min")
    assert sorted(p.name for p in first.glob("*.ckpt")) == ["last.ckpt", "step2.ckpt"]
    shutil.move(first, moved)
    _fit(moved, 6, Scored(), ckpt_path=moved / "last.ckpt", save_top_k=1, monitor="score", mode="min")
    assert sorted(p.name for p in moved.glob("*.ckpt")) == ["last.ckpt", "step2.ckpt"]  # steps 4, 6: not better


def test_another_run_s_state_is_left_as_it_is(tmp_path):
    state = {"dirpath": str(tmp_path / "a"), "last_model_path": str(tmp_path / "a" / "last.ckpt"),
             "best_model_path": "", "best_k_models": {}}
    (tmp_path / "b").mkdir()
    assert moved_folder_state(state, str(tmp_path / "b")) is state  # its files are not in b
