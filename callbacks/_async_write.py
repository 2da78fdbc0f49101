"""Checkpoints written off the critical path (``SafeModelCheckpoint(async_save=True)``).

Training stops only while the checkpoint is copied in memory; a background thread writes the copy, with
the guarantees of a synchronous save:

- **one file** (one process, ``SafeCheckpointIO``): the checkpoint dict is copied (``snapshot``: tensors
  cloned) in the training thread, then the thread writes ``<name>.tmp``, fsyncs and renames it;
- **a distributed (DCP) folder** (FSDP2, ``ModelParallelStrategy``): rank 0 writes Lightning's ``meta.pt``
  into ``<name>.tmp/``, every rank hands its shards to ``torch.distributed.checkpoint.async_save`` (which
  copies them to CPU memory before it returns, then writes them in its own thread over a second gloo
  process group, so that its collectives never meet the training's), every rank hashes its share of the
  files (``checksums.json``, ``scalevec_lit/checkpoint/folder.py``) and rank 0 swaps the folder in once its
  save has finished (DCP's coordinator finishes only after every rank has written its files);
- ``last`` (``save_last: true``) at the step just saved is that checkpoint again: the writer links it
  (hard links, a copy where the file system has none) into ``last.ckpt`` once it is complete, so it costs
  neither a second copy nor a second write;
- one write at a time: a save waits for the one before it (so at most one copy is held); removing an old
  checkpoint, loading one and the end of training (and an exception) wait for the write in flight, so
  ``save_top_k`` never deletes the last complete checkpoint before its successor is complete, and the
  last checkpoint of a run is on disk when ``fit`` returns;
- a write that fails (a full disk) is raised in the training thread at the next save or at the end, as
  the same one line as a synchronous save's.

A kill -9 while the thread writes leaves ``<name>.tmp`` (ignored by ``--ckpt_path last``, replaced by the
next save) and every earlier checkpoint complete.
"""
from __future__ import annotations

import copy
import os
import shutil
import threading
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional


class BackgroundWriter:
    """A writer thread running its jobs in order; ``submit`` first waits for the jobs queued before (one copy
    of the state held at a time) unless ``wait=False`` (a job that needs no copy: ``last``'s links). A job's
    error drops the jobs behind it and is raised by the next ``submit`` or ``wait``."""

    def __init__(self) -> None:
        self._jobs: deque = deque()
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def __getstate__(self) -> dict:  # a strategy sent to spawned processes takes a fresh, idle writer along
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    @property
    def busy(self) -> bool:
        with self._cv:
            return bool(self._jobs)

    def submit(self, job: Callable[[], None], wait: bool = True) -> None:
        if wait:
            self.wait()
        with self._cv:
            if self._error is not None:  # behind a failed write (even one already finished): dropped
                return
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="scalevec-checkpoint-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._jobs:
                    self._thread = None
                    self._cv.notify_all()
                    return
                job = self._jobs[0]
            try:
                job()
            except BaseException as err:  # noqa: BLE001 - raised in the training thread by wait()
                with self._cv:
                    self._error = self._error or err
                    self._jobs.clear()
                    self._jobs.append(lambda: None)  # popped below
            with self._cv:
                self._jobs.popleft()

    def wait(self, raise_error: bool = True) -> None:
        with self._cv:
            while self._thread is not None:
                self._cv.wait()
            error, self._error = self._error, None
        if error is not None and raise_error:
            raise error


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst)  # checkpoint files are replaced, never changed in place: a hard link is a copy
    except OSError:
        shutil.copy2(src, dst)


def copy_checkpoint(src: str, dst: str, swap: Callable[[Path, Path], None]) -> None:
    """``dst`` becomes a copy of the complete checkpoint ``src`` (a file or a DCP folder; hard links where the
    file system has them), atomically: written as ``<dst>.tmp`` and renamed."""
    tmp = Path(dst + ".tmp")
    if tmp.is_dir():
        shutil.rmtree(tmp)
    tmp.unlink(missing_ok=True)
    if Path(src).is_dir():
        shutil.copytree(src, tmp, copy_function=_link_or_copy)
        swap(tmp, Path(dst))
    else:
        _link_or_copy(src, tmp)
        os.replace(tmp, dst)


def snapshot(obj: Any, memo: Optional[dict] = None) -> Any:
    """A copy of a checkpoint that training can no longer change: every tensor cloned, the dicts, lists and
    tuples holding them copied, any other object kept as it is (an object reached twice stays one object)."""
    import torch

    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        out = obj.detach().clone()
    elif isinstance(obj, dict):
        out = copy.copy(obj)
        for key, value in obj.items():
            out[key] = snapshot(value, memo)
    elif isinstance(obj, list):
        out = [snapshot(v, memo) for v in obj]
    elif isinstance(obj, tuple):
        items = [snapshot(v, memo) for v in obj]
        out = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    else:
        out = obj
    memo[id(obj)] = out
    return out


def raise_write_failure(err: BaseException, tmp: Path, final: Path, rank_zero: bool) -> None:
    """Re-raise a failed DCP write: out of room, as the one line of a one-file write (``write_failure``), its
    partial ``<name>.tmp`` folder removed by rank 0 to give the room back; anything else as it is."""
    import shutil

    from scalevec_lit.checkpoint.verify import write_failure

    failure = write_failure(err, final)
    if failure is None:
        raise err
    if rank_zero:
        shutil.rmtree(tmp, ignore_errors=True)
    raise failure from None


def record_checksums(folder: Path, rank: int, world: int, rank_zero: bool, group=None, verify: str = "auto") -> None:
    """Every rank hashes its share of the written DCP folder (``verify``: ``sizes``, or ``auto`` above its
    threshold, only measures it); rank 0 writes ``checksums.json`` (collective: after every rank has written,
    before the folder is renamed into place)."""
    import torch.distributed as dist

    from scalevec_lit.checkpoint.folder import checksum_share, hashes, write_checksums

    share = checksum_share(folder, rank, world, crc=hashes(folder, verify, world))
    shares = [share]
    if world > 1 and dist.is_available() and dist.is_initialized():
        shares = [None] * world
        dist.all_gather_object(shares, share, group=group)
    if rank_zero:
        write_checksums(folder, [s for s in shares if s])


class DistributedAsync:
    """Asynchronous DCP saves of one ``ModelParallelStrategy`` run (made on first use, on every rank)."""

    def __init__(self, timeout=None) -> None:
        import torch.distributed as dist

        # collective: every rank makes it at the same save; the strategy's timeout, not the 30-minute default
        self.group = dist.new_group(backend="gloo", **({"timeout": timeout} if timeout is not None else {}))
        self.writer = BackgroundWriter()

    def save(self, trainer, tmp: Path, final: Path, weights_only: bool, swap: Callable[[Path, Path], None],
             verify: str = "auto") -> None:
        import shutil

        import torch
        from torch.distributed.checkpoint import async_save

        self.writer.wait()  # the previous save is complete on every rank before this one starts
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only)
        shards = {"state_dict": checkpoint.pop("state_dict")}
        shards.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        if trainer.is_global_zero:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            torch.save(checkpoint, tmp / "meta.pt")
        trainer.strategy.barrier("safe_checkpoint_async_clean")
        future = async_save(shards, checkpoint_id=str(tmp), process_group=self.group)
        rank_zero, rank, world = trainer.is_global_zero, trainer.global_rank, trainer.world_size

        def finish() -> None:
            try:
                future.result()  # every rank's shards and rank 0's .metadata are written
            except BaseException as err:
                raise_write_failure(err, tmp, final, rank_zero)
            record_checksums(tmp, rank, world, rank_zero, self.group, verify)
            if rank_zero:
                swap(tmp, final)

        self.writer.submit(finish)


class AsyncSaves:
    """``SafeModelCheckpoint``'s side of ``async_save`` (its ``_dcp_async`` and the strategy's checkpoint IO)."""

    _dcp_async: Optional[DistributedAsync] = None

    def _writer(self, trainer) -> Optional[BackgroundWriter]:
        if self._dcp_async is not None:
            return self._dcp_async.writer
        io = getattr(trainer.strategy, "_checkpoint_io", None)
        return io.writer if getattr(io, "async_save", False) else None

    def wait_for_writes(self, trainer, raise_error: bool = True, distributed: bool = True) -> None:
        """Block until the checkpoint being written in the background is complete (``async_save``);
        ``distributed=False``: only a one-process write (a DCP write waits for every rank, which may be gone)."""
        if self._dcp_async is not None and distributed:
            self._dcp_async.writer.wait(raise_error)
        writer = getattr(getattr(trainer.strategy, "_checkpoint_io", None), "writer", None)
        if isinstance(writer, BackgroundWriter):
            writer.wait(raise_error)

    def _same_step_again(self, trainer, filepath: str) -> bool:
        """``last`` right after the step's own checkpoint (``save_last: true``): the same state."""
        previous = self._last_checkpoint_saved
        return bool(previous) and previous != filepath and self._last_global_step_saved == trainer.global_step

    def _link_last(self, trainer, filepath: str, swap: Callable[[Path, Path], None]) -> None:
        source = self._last_checkpoint_saved
        if trainer.is_global_zero:  # after the step's own write, in the same thread; no copy of the state
            self._writer(trainer).submit(lambda: copy_checkpoint(source, filepath, swap), wait=False)
