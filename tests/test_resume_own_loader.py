"""A plain ``LightningModule`` with its own ``train_dataloader()`` (no data module) resumes its
``SafeModelCheckpoint`` checkpoints (``lit/reshard.py``): the micro-batch size a checkpoint records is read from
the training loader, which is built only when training starts, after the checkpoint is read; the resume then
compared the recorded 4 with a default of 1 and was refused (``data.batch_size: 1: differs from the 4 ...``).
Now the size is compared once the loader exists: the same size resumes, another one is refused there, before
the first step, with the loader's own fix. A data module with a ``batch_size`` is still checked when the
checkpoint is read."""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from scalevec_lit.errors import UserError
from plain_module import OwnLoader, pairs

pytestmark = pytest.mark.usefixtures("one_thread")


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return pairs(self.batch_size)


def _fit(folder: Path, steps: int, module, ckpt_path=None, datamodule=None) -> pl.Trainer:
    from scalevec_lit.callbacks import SafeModelCheckpoint

    cb = SafeModelCheckpoint(dirpath=folder, filename="step{step}", auto_insert_metric_name=False,
                             every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb])
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


def test_a_module_with_its_own_loader_resumes(tmp_path):
    _fit(tmp_path, 2, OwnLoader())
    saved = torch.load(tmp_path / "step2.ckpt", weights_only=False)
    assert saved["scalevec_world"]["micro_batch"] == 4  # the loader's size, recorded
    module = OwnLoader()
    trainer = _fit(tmp_path, 4, module, ckpt_path=tmp_path / "step2.ckpt")
    assert trainer.global_step == 4 and module.steps == 2  # resumed at step 2, two more steps
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["step2.ckpt", "step4.ckpt"]


def test_another_batch_size_of_its_own_loader_is_refused_before_the_first_step(tmp_path):
    _fit(tmp_path, 2, OwnLoader())
    module = OwnLoader(batch_size=2)
    with pytest.raises(UserError) as err:
        _fit(tmp_path, 4, module, ckpt_path=tmp_path / "step2.ckpt")
    assert str(err.value) == ("batch_size: 2: of the training data loader differs from the 4 this checkpoint was "
                              "written with; the data position is kept in whole micro-batches per rank; resume with "
                              "a training loader of batch_size=4")
    assert module.steps == 0
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["step2.ckpt"]


def test_a_data_module_s_batch_size_is_still_checked_when_the_checkpoint_is_read(tmp_path):
    _fit(tmp_path, 2, OwnLoader(), datamodule=Data(4))
    module = OwnLoader()
    with pytest.raises(UserError, match=r"^data.batch_size: 2: differs from the 4 this checkpoint was written with; "
                                        r".*resume with --data.batch_size=4"):
        _fit(tmp_path, 4, module, ckpt_path=tmp_path / "step2.ckpt", datamodule=Data(2))
    assert module.steps == 0
