"""A longer run resumed from the final checkpoint of a run that ended in the middle of an epoch continues it
exactly (``callbacks/_final_save.py``): the checkpoint holds the loop state of the end of its last step, not
the one Lightning leaves at ``on_train_end``, where the epoch is already marked complete (resuming that one
started a new epoch: other batches, other weights).

- in process, a resumable loader of 16 batches shuffled per epoch (as litdata's): 7 steps with a ``monitor``
  (saved at ``on_train_end``) or stopped by ``trainer.should_stop`` at step 7 (as ``max_time`` stops), resumed
  to 20 steps: the same batches at steps 7-19 and the same weights, bit for bit, as an uninterrupted 20-step
  run (this loader, like litdata's, carries its epoch in its state, so the epoch Lightning counts shows from
  the next epoch on: step 16); a run whose last step ends the epoch (16 steps, before: it took one more batch
  in that epoch and ended it), a final step validated before the save (not validated again), ``max_epochs``
  1 then 2;
- the final checkpoint's loop state and epoch equal those of a cadence save at that step, its name too;
- the command line, the library's data module: ``fit`` 7 steps with a ``monitor``, ``--ckpt_path last`` to 12
  steps, the weights of an uninterrupted 12-step run (the learning-rate schedule fixed at 12 steps: by default
  it follows each run's ``max_steps``).
"""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from helpers import main_in_process, smoke_args

pytestmark = pytest.mark.usefixtures("one_thread")


class Resumable:
    """16 batches of 4 samples (and the batch's index) in an order shuffled per epoch, resumable in the middle of
    an epoch as litdata's loader is: its state is the epoch it reads and the batches it handed out (Lightning
    reads a loader of known length without reading ahead: the batches training took). A fresh epoch takes the
    epoch Lightning sets (``sampler.set_epoch``, before each epoch's iterator); a resumed one, whose iterator
    Lightning starts before it sets the epoch, its own: the rest of that epoch, or the next epoch when it had
    run out."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
        self.epoch, self.reading, self.resume_at, self.given = 0, 0, None, 0
        self.sampler = self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 16

    def __iter__(self):
        self.reading, start = self.epoch, 0
        if self.resume_at is not None:
            self.reading, start = self.resume_at
            if start == 16:
                self.reading, start = self.reading + 1, 0
            self.resume_at = None
        order = torch.randperm(16, generator=torch.Generator().manual_seed(self.reading)).tolist()
        self.given = start
        for i in order[start:]:
            self.given += 1
            yield self.x[4 * i:4 * i + 4], self.y[4 * i:4 * i + 4], torch.tensor(i)

    def state_dict(self) -> dict:
        return {"epoch": self.reading, "taken": self.given}

    def load_state_dict(self, state: dict) -> None:
        self.resume_at = (state["epoch"], state["taken"])


class Tiny(pl.LightningModule):
    """A linear map under Adam; logs ``score`` = -step (``mode: max`` keeps the earliest step as the best) and
    records the batch each step read."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)
        self.read: dict[int, int] = {}

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        self.read[self.global_step] = int(index)
        self.log("score", -float(self.global_step + 1))
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def train_dataloader(self):
        return Resumable()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class StopAt(pl.Callback):
    """Stops the run at the end of step ``step`` as ``max_time`` does (``trainer.should_stop``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


def _fit(folder: Path, max_steps: int, *, monitor=None, every=5, stop_at=None, ckpt_path=None, epochs=None,
         filename="step{step:03d}", mode="max", module=None, **trainer_args) -> Tiny:
    from scalevec_lit.callbacks import SafeModelCheckpoint

    cb = SafeModelCheckpoint(dirpath=folder, filename=filename, auto_insert_metric_name=filename is None,
                             every_n_train_steps=every, save_last=True, monitor=monitor, mode=mode,
                             save_top_k=1 if monitor else -1)
    callbacks = [cb] + ([StopAt(stop_at)] if stop_at else [])
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, max_epochs=epochs, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, **trainer_args)
    module = module or Tiny()
    trainer.fit(module, ckpt_path=ckpt_path)
    assert trainer.global_step == (stop_at or (max_steps if max_steps > 0 else 16 * epochs))
    return module


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("first, longer, monitor, stop_at, every", [
    (7, 20, "score", None, 5),  # max_steps in the middle of an epoch, with a monitor: saved at on_train_end
    (7, 20, None, 7, 5),  # stopped by trainer.should_stop (max_time, an early stop) in the middle of an epoch
    (16, 24, "score", None, 5),  # the last step ends the epoch: the next run starts the next epoch
])
def test_a_longer_run_resumed_from_the_final_checkpoint_continues_exactly(tmp_path, first, longer, monitor, stop_at,
                                                                          every):
    reference = _fit(tmp_path / "ref", longer, monitor=monitor, every=every)
    _fit(tmp_path / "run", 20 if stop_at else first, monitor=monitor, stop_at=stop_at, every=every)
    final = torch.load(tmp_path / "run" / "last.ckpt", weights_only=False)
    assert final["global_step"] == first
    resumed = _fit(tmp_path / "run", longer, monitor=monitor, every=every, ckpt_path=tmp_path / "run" / "last.ckpt")
    assert resumed.read == {s: reference.read[s] for s in range(first, longer)}  # the same batches, in order
    assert _equal(resumed.state_dict(), reference.state_dict())  # bit for bit


class Validated(Tiny):
    """``Tiny`` with a validation that logs ``val_score`` = step and records the steps it ran at."""

    def __init__(self) -> None:
        super().__init__()
        self.validated: list[int] = []

    def validation_step(self, batch, batch_idx):
        self.log("val_score", float(self.global_step))

    def on_validation_end(self) -> None:
        self.validated.append(self.global_step)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 4), torch.zeros(8, 1)),
                                           batch_size=4)


def test_a_final_step_validated_before_the_save_is_not_validated_again_on_resume(tmp_path):
    """The monitored value comes from a validation at the final step (after the step's end, whose loop state
    the checkpoint holds; no cadence step before it, so the final save writes it): the resumed run does not
    validate step 7 again, and continues exactly."""
    val = dict(monitor="val_score", mode="min", every=10, val_check_interval=7, num_sanity_val_steps=0)
    reference = _fit(tmp_path / "ref", 20, module=Validated(), **val)
    first = _fit(tmp_path / "run", 7, module=Validated(), **val)
    assert first.validated == [7] and reference.validated == [7, 14]
    assert sorted(p.name for p in (tmp_path / "run").glob("*.ckpt")) == ["last.ckpt", "step007.ckpt"]  # the final save
    resumed = _fit(tmp_path / "run", 20, module=Validated(), ckpt_path=tmp_path / "run" / "last.ckpt", **val)
    assert resumed.validated == [14]
    assert resumed.read == {s: reference.read[s] for s in range(7, 20)}
    assert _equal(resumed.state_dict(), reference.state_dict())


def test_max_epochs_1_then_2_continues_exactly(tmp_path):
    """The end of ``max_epochs`` (saved at ``on_train_end``, with the state of its last batch's end) resumes into
    the next epoch as an uninterrupted 2-epoch run reads it."""
    reference = _fit(tmp_path / "ref", -1, epochs=2)
    _fit(tmp_path / "run", -1, epochs=1)
    resumed = _fit(tmp_path / "run", -1, epochs=2, ckpt_path=tmp_path / "run" / "last.ckpt")
    assert resumed.read == {s: reference.read[s] for s in range(16, 32)}
    assert _equal(resumed.state_dict(), reference.state_dict())


def test_the_final_checkpoint_holds_the_loop_state_of_a_cadence_save_at_that_step(tmp_path):
    _fit(tmp_path / "final", 7, monitor="score")  # step 5 the best; the final step 7 in last.ckpt
    _fit(tmp_path / "cadence", 7, monitor="score", every=7)  # step 7 saved at its end, on the cadence
    final = torch.load(tmp_path / "final" / "last.ckpt", weights_only=False)
    cadence = torch.load(tmp_path / "cadence" / "last.ckpt", weights_only=False)
    assert final["global_step"] == cadence["global_step"] == 7
    assert final["epoch"] == cadence["epoch"] == 0
    assert final["loops"] == cadence["loops"]
    assert final["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 0  # the epoch goes on
    assert final["scalevec_world"] == cadence["scalevec_world"]
    assert _equal(final["state_dict"], cadence["state_dict"])


def test_the_command_line_resumes_the_final_step_of_a_monitored_run_exactly(capfd, prepared_data, tmp_path):
    def fit(root: Path, steps: int, *extra: str) -> dict:
        root.mkdir(exist_ok=True)
        (root / "ckpt.yaml").write_text(
            "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
            "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 5,"
            " monitor: train/loss, mode: min, save_top_k: 1, save_last: true}\n")
        args = smoke_args(prepared_data, root, steps, "--config", str(root / "ckpt.yaml"),
                          "--trainer.limit_val_batches=0", "--model.config.n_layer=1", "--model.config.n_embd=32",
                          "--model.config.seq_len=32", "--data.batch_size=2",
                          "--model.schedule.init_args.max_steps=12", *extra)  # one schedule for 7 and 12 steps
        code, text = main_in_process(capfd, args)
        assert code == 0, text[-3000:]
        return torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)

    first = fit(tmp_path / "run", 7)
    assert (first["global_step"], first["epoch"]) == (7, 0)
    resumed = fit(tmp_path / "run", 12, "--ckpt_path", "last")
    reference = fit(tmp_path / "ref", 12)
    assert resumed["global_step"] == reference["global_step"] == 12
    assert (resumed["epoch"], resumed["loops"]) == (reference["epoch"], reference["loops"])
    assert _equal(resumed["state_dict"], reference["state_dict"])


def test_the_final_checkpoint_is_named_with_the_epoch_of_its_step(tmp_path):
    """Lightning's default name (``epoch=E-step=S``): the final step 7, the best with ``mode: min``, is in epoch 0,
    as a save on the cadence names it (before: ``epoch=1-step=7.ckpt``, the epoch marked done)."""
    _fit(tmp_path, 7, monitor="score", mode="min", filename=None)
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["epoch=0-step=7.ckpt", "last.ckpt"]
