"""SafeModelCheckpoint: Lightning's ModelCheckpoint with a stable folder, atomic writes, one run per
folder, and a checkpoint on SIGINT/SIGTERM/SIGUSR1.

- ``dirpath`` defaults to ``<trainer.default_root_dir>/checkpoints``, known before the run starts: ``--ckpt_path
  last`` resumes a killed run from the newest complete checkpoint there, whatever its name. Without a
  ``default_root_dir`` each run gets its own ``runs/<recipe>[/<config>...]/version_N`` (``lit/runfolder.py``),
  and ``--ckpt_path last`` picks the newest version holding a checkpoint;
- files are written as ``<name>.tmp`` and renamed (``SafeCheckpointIO``, ``_checkpoint_io.py``, which the CLI installs on every
  trainer whose strategy uses the default torch checkpoint IO, and which turns an unreadable file into a
  ``CheckpointError`` naming it), distributed (DCP) checkpoint folders likewise (``replace_directory``),
  so a crash while saving keeps the last good one;
- at fit start it takes the folder's lock (``scalevec_lit/runlock.py``): a second run into a folder in use,
  or a fresh run into a folder holding an earlier run's checkpoints, is refused with the fix;
- during training, SIGINT (Ctrl-C), SIGTERM and SIGUSR1 (SLURM's pre-emption warning, see
  ``launch/slurm_fit.sbatch``) finish the current step, save a checkpoint at that step (and ``last``),
  stop the trainer and make the CLI exit with 128 + the signal number (``_stop_signals.py``);
- the final step of a run that ends normally is always saved, once (``_final_save.py``).

The checkpoint code of the library lives here, except two Lightning-free parts of ``scalevec_lit/checkpoint/``:
``verify.py`` (a file's zip structure and CRC32s, checked before anything reads it, by export too) and
``match.py`` (the model stored in a checkpoint against this run's, on resume).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from scalevec_lit.lit import reshard
from scalevec_lit.runlock import (LOCK, acquire_folder, check_folder_free, check_lineage, moved_folder_state,
                                  release_folder)
from scalevec_lit.checkpoint.folder import check_verify, newest_checkpoint

from ._async_write import AsyncSaves, DistributedAsync, raise_write_failure, record_checksums
from ._checkpoint_io import SafeCheckpointIO, install_checkpoint_io, replace_directory  # noqa: F401 - re-exported
from ._final_save import FinalSave
from ._stop_signals import StopSignals

__all__ = ["SafeModelCheckpoint", "SafeCheckpointIO"]


def __getattr__(name: str):
    """``STOP_SIGNALS`` (here until 0.2.0): a deprecated alias of ``scalevec_lit.stopsignal.STOP_SIGNALS``,
    removed in 0.3.0."""
    if name == "STOP_SIGNALS":
        import warnings

        from scalevec_lit.stopsignal import STOP_SIGNALS
        warnings.warn("scalevec_lit.callbacks.checkpoint.STOP_SIGNALS is deprecated since 0.2.0 and will be removed "
                      "in 0.3.0; import STOP_SIGNALS from scalevec_lit.stopsignal instead",
                      DeprecationWarning, stacklevel=2)
        return STOP_SIGNALS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def lock_checkpoint_folders(trainer, ckpt_path: Any = None) -> None:
    """Take each ``SafeModelCheckpoint`` folder's lock before Lightning writes anything (the run's config.yaml
    in a new version folder, at setup), so that a refused second run leaves no trace; ``setup`` takes it
    again. ``ckpt_path``: the fit's, so that a resume in a callback's own folder is not warned about."""
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, SafeModelCheckpoint):
            cb.resume_from = None if ckpt_path is None else str(ckpt_path)
            if trainer.is_global_zero:
                cb.lock_early(trainer)
            else:  # the other ranks of a launched group: the same refusal, before they wait for rank 0
                cb._stable_dirpath(trainer)
                check_folder_free(cb.dirpath)


def stopped_by_signal(trainer) -> int:
    """128 + the signal number when a checkpoint callback stopped the run on a signal, else 0."""
    return max((getattr(cb, "stop_exit_code", 0) for cb in trainer.callbacks), default=0)


class SafeModelCheckpoint(AsyncSaves, StopSignals, FinalSave, reshard.WorldRecord, ModelCheckpoint):
    """``ModelCheckpoint`` whose default folder survives restarts, whose writes are atomic, which owns its
    folder for the run and saves on a stop signal. Every argument of ``ModelCheckpoint`` is taken as there;
    these are its own:

    Args:
        stop_check_every_n_steps: with several processes, how often the ranks agree on a received stop
            signal (one small all-reduce); a single process checks at every step, for free.
        async_save: write each checkpoint in the background, from a copy taken at the step (training stops
            only for the copy; ``callbacks/_async_write.py``); a one-file checkpoint by a writer thread, a
            distributed (DCP) one by ``torch.distributed.checkpoint.async_save``. The same atomic rename,
            verification and exact resume as a synchronous save.
        verify: how much of a distributed (DCP) checkpoint folder is hashed, at each save (into its
            ``checksums.json``) and before a resume reads one: ``auto`` (default) every file's CRC32 when the
            folder holds at most 2 GiB per process, sizes and structure above; ``checksums`` the CRC32s at any
            size (a flipped byte is refused, never loaded); ``sizes`` sizes and structure only (nothing re-read). The
            CRC32 runs at about 1.25 GB/s per rank: 24 GB on 8 ranks cost ~2.4 s per rank per save and a second
            read of the folder at the resume (``benchmarks/checkpoint_checksums.py``). One-file checkpoints are
            always checked whole (their zip's own CRC32s).
    """

    def __init__(self, *args: Any, stop_check_every_n_steps: int = 10, async_save: bool = False,
                 verify: str = "auto", **kwargs: Any) -> None:
        self.verify = check_verify(verify)
        super().__init__(*args, **kwargs)
        self.async_save = bool(async_save)
        self._dcp_async: Optional[DistributedAsync] = None
        self.stop_check_every_n_steps = max(1, int(stop_check_every_n_steps))
        self.stop_signal: Optional[int] = None  # the signal that stopped the run (``_stop_signals.py``)
        self.stop_exit_code = 0
        self._received: Optional[int] = None
        self._previous_handlers: dict[int, Any] = {}
        self._locked: Optional[str] = None
        self._dirpath_given = self.dirpath is not None
        self.resume_from: Optional[str] = None  # the fit's ckpt_path (``lock_checkpoint_folders``)

    def _folder_key(self) -> str:
        """Where this callback's folder comes from, for an error about it."""
        return "SafeModelCheckpoint's dirpath" if self._dirpath_given else "trainer.default_root_dir"

    def _stable_dirpath(self, trainer) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.async_save and not getattr(trainer.strategy, "_save_distributed_checkpoint", False):
            io = trainer.strategy.checkpoint_io  # one file: SafeCheckpointIO's writer thread
            if isinstance(io, SafeCheckpointIO) or type(io) is TorchCheckpointIO:
                trainer.strategy.checkpoint_io = io if isinstance(io, SafeCheckpointIO) else SafeCheckpointIO()
                trainer.strategy.checkpoint_io.async_save = True
        self._stable_dirpath(trainer)
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self._lock(trainer)
            if getattr(trainer.strategy, "_save_distributed_checkpoint", False):
                reshard.load_one_file(trainer.strategy, self.verify)  # also a one-file checkpoint, under FSDP2

    # -- one run per folder ---------------------------------------------------------------------------
    def _lock(self, trainer) -> None:
        self._on_rank_zero(trainer, lambda: acquire_folder(self.dirpath, given_as=self._folder_key()))
        self._locked = self.dirpath if trainer.is_global_zero else None

    @staticmethod
    def _on_rank_zero(trainer, fn) -> None:
        """Run ``fn`` on global rank 0; its error is raised on every rank (so that no rank waits for the others)."""
        error = None
        if trainer.is_global_zero:
            try:
                fn()
            except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
                error = err
        error = trainer.strategy.broadcast(error)
        if error is not None:
            raise error

    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath) -> None:
        """Lightning's check at fit start (``Checkpoint directory ... exists and is not empty``), without this
        callback's own lock file, which ``lock_early`` put there first: a brand-new run's folder is empty."""
        from lightning.pytorch.utilities import rank_zero_warn

        if self.save_top_k == 0 or not self._fs.isdir(dirpath) or self._resumes_in(dirpath):
            return
        if any(os.path.basename(str(p).rstrip("/")) != LOCK for p in self._fs.ls(dirpath, detail=False)):
            rank_zero_warn(f"Checkpoint directory {dirpath} exists and is not empty.")

    def _resumes_in(self, dirpath) -> bool:
        """Whether the fit resumes from a checkpoint in ``dirpath`` (``last``, or a path in it): not worth a warning."""
        given = self.resume_from
        if given == "last":
            return True
        return bool(given) and "://" not in given and os.path.realpath(given).startswith(
            os.path.join(os.path.realpath(str(dirpath)), ""))

    def lock_early(self, trainer) -> None:
        """Take the lock before ``trainer.fit`` (rank 0; the CLI calls it); ``setup`` finds it held."""
        self._stable_dirpath(trainer)
        acquire_folder(self.dirpath, given_as=self._folder_key())
        self._locked = self.dirpath

    def _unlock(self) -> None:
        if self._locked is not None:
            release_folder(self._locked)
            self._locked = None

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.wait_for_writes(trainer)
        self._restore_handlers()
        if stage == "fit":
            self._unlock()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # the exception in flight is the one to report; a DCP write in flight is left (another rank may be gone):
        # its folder stays <name>.tmp and the checkpoints before it are complete
        self.wait_for_writes(trainer, raise_error=False, distributed=False)
        self._restore_handlers()
        self._unlock()

    # -- the run: its stop signals (``_stop_signals.py``), its final step (``_final_save.py``) -------------
    def on_train_start(self, trainer, pl_module) -> None:
        # trainer.ckpt_path (``last`` resolved) is known for every strategy only now, before any write
        self._on_rank_zero(trainer, lambda: check_lineage(self.dirpath, trainer.ckpt_path))
        super().on_train_start(trainer, pl_module)
        self._started(trainer)
        self.take_signals(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self.save_final(trainer)  # before Lightning's save_last there, which would take this step
        super().on_train_end(trainer, pl_module)
        self.wait_for_writes(trainer)
        self.release_signals(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.stop_if_signalled(trainer)
        self.save_at_last_step(trainer)
        self.keep_step_end(trainer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(moved_folder_state(state_dict, self.dirpath))  # the run's folder moved: its files

    def _find_last_checkpoints(self, trainer) -> set[str]:
        """The newest complete checkpoint in the folder, of all of them (``newest_checkpoint``: ties broken the
        same way on every rank): a run killed between writing ``step*.ckpt`` and ``last.ckpt`` still resumes
        from its newest file."""
        self._stable_dirpath(trainer)  # --ckpt_path last is resolved before setup
        folder = Path(self.dirpath)
        if not folder.is_dir():
            return set()
        newest = newest_checkpoint(os.path.normpath(p) for p in folder.iterdir()
                                   if p.suffix == self.FILE_EXTENSION and p.name != "nonfinite.ckpt")
        return set() if newest is None else {newest}

    def _save_last_checkpoint(self, trainer, monitor_candidates: dict) -> None:
        """``last`` keeps its name: the folder is this run's (its lock), so a ``last.ckpt`` there is this run's or
        the one it resumes, never another run's to keep beside it. Lightning versions the name (``last-v1.ckpt``)
        whenever the file exists under another name than the restored ``last_model_path``, which a resume from a
        step file (or from an asynchronous ``last``, a link to one) restores as empty or as an older path: the
        run then wrote its newest state to ``last-v1.ckpt`` and left ``last.ckpt`` at the resumed step."""
        if self.save_last and self._enable_version_counter:
            name = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
            if name != self.last_model_path and self.file_exists(name, trainer):
                self._enable_version_counter = False
                try:
                    return super()._save_last_checkpoint(trainer, monitor_candidates)
                finally:
                    self._enable_version_counter = True
        super()._save_last_checkpoint(trainer, monitor_candidates)

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        if self.async_save and self._same_step_again(trainer, filepath) and self._writer(trainer) is not None:
            self._link_last(trainer, filepath, replace_directory)  # last: the step's checkpoint, linked
            return self._saved(trainer, filepath)
        if not getattr(trainer.strategy, "_save_distributed_checkpoint", False):
            return super()._save_checkpoint(trainer, filepath)  # one file: SafeCheckpointIO makes it atomic
        # a folder of shards (any number of processes): every rank writes into a temporary folder, then rank 0
        # swaps it in
        tmp = Path(filepath + ".tmp")
        if self.async_save:
            if self._dcp_async is None:
                self._dcp_async = DistributedAsync(getattr(trainer.strategy, "_timeout", None))
            self._dcp_async.save(trainer, tmp, Path(filepath), self.save_weights_only, replace_directory, self.verify)
            self._saved(trainer, filepath)
            return
        if trainer.is_global_zero and tmp.exists():
            shutil.rmtree(tmp)
        trainer.strategy.barrier("safe_checkpoint_clean")
        try:
            trainer.save_checkpoint(str(tmp), self.save_weights_only)
        except BaseException as err:  # DCP raises on every rank (its collectives share each rank's failure)
            raise_write_failure(err, tmp, Path(filepath), trainer.is_global_zero)
        trainer.strategy.barrier("safe_checkpoint_written")
        record_checksums(tmp, trainer.global_rank, trainer.world_size, trainer.is_global_zero, verify=self.verify)
        if trainer.is_global_zero:
            replace_directory(tmp, Path(filepath))
        trainer.strategy.barrier("safe_checkpoint_renamed")
        self._saved(trainer, filepath)

    def _saved(self, trainer, filepath: str) -> None:
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(self)

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        self.wait_for_writes(trainer)  # its successor is complete first
        if Path(filepath).exists():
            super()._remove_checkpoint(trainer, filepath)
