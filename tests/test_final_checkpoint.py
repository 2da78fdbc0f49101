"""The final step of a run is always checkpointed (``SafeModelCheckpoint``, ``callbacks/_final_save.py``).

- ``max_steps`` off the cadence (7 steps, every 5): the step-7 checkpoint exists, holds the trained model
  exactly, ``last`` is it, and it is the same file a cadence save at step 7 writes (so a longer run resumed
  from it continues exactly); the same with ``async_save``;
- ``max_steps`` on the cadence (10 steps, every 5): each name written once at step 10, not twice;
- a run ended by an exception, or resumed at ``max_steps`` already (``--ckpt_path last``), writes nothing more;
- with a ``monitor``: the final step is among the best ``save_top_k`` when its score qualifies, else it is
  ``last.ckpt`` (even with ``save_last`` off); the end of ``max_epochs`` is saved too;
- two processes (DDP, gloo) write the same checkpoints, and every rank takes the same saves;
- the command line: ``fit`` to 7 steps, ``--ckpt_path last`` again: nothing more, and ``last`` is step 7.
"""
from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import main_in_process, smoke_args, spawn_gloo

pytestmark = pytest.mark.usefixtures("one_thread")


def _quiet_trainer(**kw):
    return pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, **kw)


class Data(pl.LightningDataModule):
    """64 fixed samples, 16 batches of 4 (``batch_size``: what a resume compares with the checkpoint's)."""

    batch_size = 4

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)),
                          batch_size=self.batch_size)


class Tiny(pl.LightningModule):
    """A linear map; logs ``score`` = -step (the earliest step is best with ``mode: max``); ``fail_at``: raises
    in that step."""

    def __init__(self, fail_at: int = -1, sync: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)
        self.fail_at, self.sync = fail_at, sync

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at:
            raise RuntimeError("boom")
        x, y = batch
        self.log("score", -float(self.global_step + 1), sync_dist=self.sync)
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def _recording_io():
    """The checkpoint IO, recording each ``(file name, global step)`` it writes."""
    from scalevec_lit.callbacks.checkpoint import SafeCheckpointIO

    class Recording(SafeCheckpointIO):
        def __init__(self):
            super().__init__()
            self.writes: list[tuple[str, int]] = []

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            self.writes.append((Path(path).name, checkpoint["global_step"]))
            super().save_checkpoint(checkpoint, path, storage_options)

    return Recording()


def _fit(folder: Path, module=None, ckpt_path=None, **kw):
    from scalevec_lit.callbacks import SafeModelCheckpoint

    ckpt = {"every_n_train_steps": 5, "save_top_k": -1, "save_last": True}
    ckpt.update({k: kw.pop(k) for k in list(kw) if k in ("every_n_train_steps", "save_top_k", "save_last", "monitor",
                                                           "mode", "async_save")})
    cb = SafeModelCheckpoint(dirpath=folder, filename="step{step:03d}", auto_insert_metric_name=False, **ckpt)
    io = _recording_io()
    trainer = _quiet_trainer(callbacks=[cb], plugins=[io], **kw)
    module = module or Tiny()
    trainer.fit(module, datamodule=Data(), ckpt_path=ckpt_path)
    return trainer, module, io.writes


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".ckpt")


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("async_save", [False, True])
def test_max_steps_off_the_cadence_saves_the_final_step(tmp_path, async_save):
    trainer, module, writes = _fit(tmp_path, max_steps=7, async_save=async_save)
    assert trainer.global_step == 7
    assert _files(tmp_path) == ["last.ckpt", "step005.ckpt", "step007.ckpt"]
    if async_save:  # last: the step's file, linked by the writer once complete
        assert writes == [("step005.ckpt", 5), ("step007.ckpt", 7)]
        assert (tmp_path / "last.ckpt").read_bytes() == (tmp_path / "step007.ckpt").read_bytes()
    else:
        assert writes == [("step005.ckpt", 5), ("last.ckpt", 5), ("step007.ckpt", 7), ("last.ckpt", 7)]
    for name in ("step007.ckpt", "last.ckpt"):
        saved = _load(tmp_path / name)
        assert saved["global_step"] == 7
        assert _same(saved["state_dict"], module.state_dict())  # the trained model, bit for bit
        assert _same(saved["optimizer_states"], [trainer.optimizers[0].state_dict()])
    assert _load(tmp_path / "step005.ckpt")["global_step"] == 5


def test_the_final_checkpoint_is_the_one_a_cadence_save_at_that_step_writes(tmp_path):
    _fit(tmp_path / "off", max_steps=7)  # steps 5 and 7 (the final one)
    _fit(tmp_path / "on", max_steps=7, every_n_train_steps=7)  # step 7 on the cadence
    final, cadence = _load(tmp_path / "off" / "step007.ckpt"), _load(tmp_path / "on" / "step007.ckpt")
    for key in ("global_step", "epoch", "state_dict", "optimizer_states", "lr_schedulers", "loops"):
        assert _same(final[key], cadence[key]), key  # the loops too: a longer run resumed from it continues exactly


def test_max_steps_on_the_cadence_saves_that_step_once(tmp_path):
    trainer, _, writes = _fit(tmp_path, max_steps=10)
    assert writes == [("step005.ckpt", 5), ("last.ckpt", 5), ("step010.ckpt", 10), ("last.ckpt", 10)]
    assert _files(tmp_path) == ["last.ckpt", "step005.ckpt", "step010.ckpt"]


def test_a_run_ended_by_an_exception_saves_nothing_more(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        _fit(tmp_path, module=Tiny(fail_at=6), max_steps=7)  # the 7th step raises
    assert _files(tmp_path) == ["last.ckpt", "step005.ckpt"]
    assert _load(tmp_path / "last.ckpt")["global_step"] == 5


def test_resuming_a_finished_run_writes_nothing(tmp_path):
    _fit(tmp_path, max_steps=7)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.iterdir()}
    trainer, module, writes = _fit(tmp_path, ckpt_path="last", max_steps=7)
    assert writes == [] and trainer.global_step == 7
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.iterdir()} == before
    assert _same(module.state_dict(), _load(tmp_path / "step007.ckpt")["state_dict"])


@pytest.mark.parametrize("steps, mode, save_last, writes, files", [
    # score = -step: step 5 stays the best; the final step is not among the best 1, so last.ckpt holds it
    (7, "max", False, [("step005.ckpt", 5), ("last.ckpt", 7)], ["last.ckpt", "step005.ckpt"]),
    (7, "max", True, [("step005.ckpt", 5), ("last.ckpt", 5), ("last.ckpt", 7)], ["last.ckpt", "step005.ckpt"]),
    (10, "max", False, [("step005.ckpt", 5), ("last.ckpt", 10)], ["last.ckpt", "step005.ckpt"]),  # on the cadence
    (10, "max", True, [("step005.ckpt", 5), ("last.ckpt", 5), ("last.ckpt", 10)], ["last.ckpt", "step005.ckpt"]),
    # the final step is the best: it replaces step 5 (and last follows it)
    (7, "min", False, [("step005.ckpt", 5), ("step007.ckpt", 7)], ["step007.ckpt"]),
    (7, "min", True, [("step005.ckpt", 5), ("last.ckpt", 5), ("step007.ckpt", 7), ("last.ckpt", 7)],
     ["last.ckpt", "step007.ckpt"]),
])
def test_with_a_monitor_the_final_step_is_among_the_best_or_last(tmp_path, steps, mode, save_last, writes, files):
    trainer, module, got = _fit(tmp_path, max_steps=steps, monitor="score", mode=mode, save_top_k=1,
                                save_last=save_last)
    assert got == writes
    assert _files(tmp_path) == files
    for name in files:
        if name != "step005.ckpt":
            assert _load(tmp_path / name)["global_step"] == steps, name
            assert _same(_load(tmp_path / name)["state_dict"], module.state_dict()), name


def test_the_end_of_max_epochs_is_saved(tmp_path):
    trainer, module, writes = _fit(tmp_path, max_epochs=1, max_steps=-1)  # 16 steps: 5, 10, 15 and the end
    assert trainer.global_step == 16
    assert [w for w in writes if w[0] != "last.ckpt"] == [("step005.ckpt", 5), ("step010.ckpt", 10),
                                                          ("step015.ckpt", 15), ("step016.ckpt", 16)]
    assert writes[-1] == ("last.ckpt", 16)
    assert _same(_load(tmp_path / "last.ckpt")["state_dict"], module.state_dict())


def _ddp_worker(rank: int, world: int, folder: str, monitor) -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world))
    strategy = DDPStrategy(cluster_environment=LightningEnvironment(), process_group_backend="gloo",
                           timeout=timedelta(seconds=60))
    trainer, module, writes = _fit(Path(folder), module=Tiny(sync=True), max_steps=7, devices=world,
                                   strategy=strategy, monitor=monitor, mode="max", save_top_k=1 if monitor else -1)
    cb = trainer.checkpoint_callback
    saves = [(Path(cb._last_checkpoint_saved).name, cb._last_global_step_saved)]
    everyone = [None] * world
    dist.all_gather_object(everyone, (saves, cb.last_model_path, cb.best_model_path))
    assert everyone[0] == everyone[1]  # every rank took the same decisions
    if rank == 0:
        expected = [("step005.ckpt", 5), ("last.ckpt", 5), ("last.ckpt", 7)] if monitor else \
            [("step005.ckpt", 5), ("last.ckpt", 5), ("step007.ckpt", 7), ("last.ckpt", 7)]
        assert writes == expected
        assert _load(Path(folder) / "last.ckpt")["global_step"] == 7
        assert _same(_load(Path(folder) / "last.ckpt")["state_dict"], module.state_dict())
    else:
        assert writes == []  # one file: rank 0 writes it


@pytest.mark.parametrize("monitor", [None, "score"])
def test_two_processes_save_the_final_step_together(tmp_path, monitor):
    spawn_gloo(_ddp_worker, 2, str(tmp_path), monitor, start_method="fork")
    assert _load(tmp_path / "last.ckpt")["global_step"] == 7


def test_fit_then_resume_from_the_command_line(capfd, prepared_data, tmp_path):
    from scalevec_lit.checkpoint.forms import open_model

    cfg = tmp_path / "ckpt.yaml"
    cfg.write_text("trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
                   "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 5,"
                   " save_last: true, save_top_k: -1}\n    - scalevec_lit.callbacks.RoleWeightDecay\n")
    args = smoke_args(prepared_data, tmp_path, 7, "--config", str(cfg), "--trainer.limit_val_batches=0",
                      "--model.config.n_layer=1", "--model.config.n_embd=32", "--model.config.seq_len=32",
                      "--data.batch_size=2")
    code, text = main_in_process(capfd, args)
    assert code == 0, text[-3000:]
    folder = tmp_path / "checkpoints"
    assert _files(folder) == ["last.ckpt", "step000005.ckpt", "step000007.ckpt"]
    last = _load(folder / "last.ckpt")
    assert last["global_step"] == 7
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".ckpt"}
    code, text = main_in_process(capfd, [*args, "--ckpt_path", "last"])
    assert code == 0, text[-3000:]
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".ckpt"} == before
    opened = open_model(folder / "last.ckpt")  # what inspect, evaluate and export read: the step-7 model
    weights = {f"model.{k}": v for k, v in opened.model.state_dict().items()}
    assert _same(weights, {k: v for k, v in last["state_dict"].items() if k in weights})
    assert weights.keys() <= last["state_dict"].keys()
