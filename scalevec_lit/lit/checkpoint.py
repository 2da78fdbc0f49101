"""Checkpoint safety: atomic writes, clear errors for truncated or corrupt files, shape checks.

- ``SafeCheckpointIO`` writes ``<file>.tmp`` and renames it over ``<file>`` (a crash while saving
  leaves the previous file intact) and turns an unreadable file into ``CheckpointError`` naming it.
  ``ScaleVecCLI`` installs it on every trainer whose strategy uses the default torch checkpoint IO.
- ``atomic_directory`` does the same for distributed (DCP) checkpoints, which are directories.
- ``verify_checkpoint`` (in ``scalevec_lit/verify.py``, Lightning-free, also used by ``export``) checks
  a file's zip structure and every member's CRC32 before anything reads it.
- ``check_spec`` compares the model spec stored in a checkpoint with the running model's.
"""
from __future__ import annotations

import os
import pickle
import shutil
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ..verify import CheckpointError, unreadable, verify_checkpoint  # noqa: F401  (re-exported)


class SafeCheckpointIO(TorchCheckpointIO):
    """Torch checkpoints written atomically and read with a clear error."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def load_checkpoint(self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None) -> dict:
        p = verify_checkpoint(path, full=True)
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


SHAPE_KEYS = ("vocab_size", "n_layer", "n_embd", "n_head", "n_kv_head", "head_dim", "intermediate_size", "moe",
              "tie_embeddings")


def check_spec(saved: Optional[dict], current: dict, path: Optional[str]) -> None:
    """Raise ``CheckpointError`` when a checkpoint's model (shape, scale strategy, block) differs from this run's."""
    if not saved:
        return
    diffs = []
    for section, keys in (("config", SHAPE_KEYS), ("strategy", tuple(current.get("strategy", {})))):
        a, b = saved.get(section, {}), current.get(section, {})
        diffs += [f"{section}.{k}: checkpoint {a.get(k)!r}, this run {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
    if saved.get("block") != current.get("block"):
        diffs.append(f"block: checkpoint {saved.get('block')}, this run {current.get('block')}")
    if diffs:
        raise CheckpointError(
            f"checkpoint {path or '?'} was written by another model: " + "; ".join(diffs)
            + ". Resume with the recipe that wrote it (config.yaml in its run folder) or start afresh"
        )
