"""The checkpoint IO of ``SafeModelCheckpoint``'s runs: one-file checkpoints written atomically (``<name>.tmp``,
fsync, rename; in a writer thread with ``async_save``) and read with a clear error; distributed (DCP) folders
swapped in whole (``replace_directory``). ``install_checkpoint_io`` gives every trainer whose strategy uses
Lightning's default torch IO this one (the CLI calls it)."""
from __future__ import annotations

import os
import pickle
import shutil
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from scalevec_lit.checkpoint.verify import MismatchedCheckpointError, unreadable, verify_checkpoint, write_failure

from ._async_write import BackgroundWriter, snapshot

__all__ = ["SafeCheckpointIO", "install_checkpoint_io", "replace_directory"]


class SafeCheckpointIO(TorchCheckpointIO):
    """Torch checkpoints written atomically and read with a clear error; ``async_save``: written by a
    background thread from a copy (``_async_write.py``)."""

    def __init__(self, async_save: bool = False) -> None:
        super().__init__()
        self.async_save = async_save
        self.writer = BackgroundWriter()

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: fsspec's own transaction
            self.writer.wait()
            return super().save_checkpoint(checkpoint, path, storage_options)
        if self.async_save:
            copied = snapshot(checkpoint)
            self.writer.submit(lambda: self._write(copied, path))
        else:
            self.writer.wait()
            self._write(checkpoint, path)

    def _write(self, checkpoint: dict[str, Any], path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        # written straight into the checkpoint's folder: Lightning's own writer first serializes the whole
        # checkpoint in memory and stages it in $TMPDIR, which a small /tmp cannot hold
        try:
            with open(tmp, "wb") as fh:
                torch.save(checkpoint, fh)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException as err:
            tmp.unlink(missing_ok=True)
            failure = write_failure(err, path)  # out of room (torch says "unexpected pos"): one line, the fix
            if failure is not None:
                raise failure from None
            raise
        os.replace(tmp, path)

    def remove_checkpoint(self, path) -> None:
        self.writer.wait()  # never the last complete checkpoint before its successor is complete
        super().remove_checkpoint(path)

    def teardown(self) -> None:
        self.writer.wait()

    def load_checkpoint(self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None) -> dict:
        self.writer.wait()
        p = verify_checkpoint(path, full=True)
        if p.is_dir():  # a sound DCP folder, under a strategy that reads one file (torch.load: IsADirectoryError)
            raise MismatchedCheckpointError(
                f"--ckpt_path: {str(path)!r}: is a distributed (FSDP2) checkpoint folder, which loads only under "
                "ModelParallelStrategy, on any number of processes; resume with that strategy, e.g. "
                "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy "
                "--trainer.strategy.data_parallel_size=1 --trainer.devices=1 for one process (or export it: python -m "
                "scalevec_lit export --ckpt <folder> ...)")
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=False)
        except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as err:
            raise unreadable(p, err) from err


def replace_directory(tmp: Path, path: Path) -> None:
    """Swap a fully written folder ``tmp`` in for ``path`` (the old one is removed only afterwards)."""
    old = path.with_name(path.name + ".old")
    if old.exists():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    if old.exists():
        shutil.rmtree(old) if old.is_dir() else old.unlink()


def install_checkpoint_io(trainer) -> None:
    """Give ``trainer`` the atomic ``SafeCheckpointIO`` when its strategy uses the default torch IO."""
    strategy = trainer.strategy
    if type(getattr(strategy, "_checkpoint_io", None) or strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = SafeCheckpointIO()
