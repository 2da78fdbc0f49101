"""Checkpoint safety: atomic writes, clear errors for truncated or corrupt files, shape checks.

- ``SafeCheckpointIO`` writes ``<file>.tmp`` and renames it over ``<file>`` (a crash while saving
  leaves the previous file intact) and turns an unreadable file into ``CheckpointError`` naming it.
  ``ScaleVecCLI`` installs it on every trainer whose strategy uses the default torch checkpoint IO.
- ``atomic_directory`` does the same for distributed (DCP) checkpoints, which are directories.
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


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: truncated, corrupt, or from another model."""


def unreadable(path: str | Path, err: BaseException) -> CheckpointError:
    folder = Path(path).parent
    others = sorted(p.name for p in folder.glob("*.ckpt") if p != Path(path)) if folder.is_dir() else []
    hint = f"resume from another checkpoint in {folder} ({', '.join(others[-3:])})" if others else "start afresh"
    return CheckpointError(f"checkpoint {str(path)!r} is truncated or corrupt ({type(err).__name__}: {err}); {hint}")


def verify_checkpoint(path: str | Path, full: bool = True) -> Path:
    """Check that ``path`` is a complete torch checkpoint; ``full`` also checks every member's CRC32
    (reads the whole file once). Raises ``CheckpointError`` naming the file."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist; check --ckpt_path")
    if p.is_dir():
        if not any(p.glob("*.distcp")) and not (p / "meta.pt").exists():
            raise unreadable(p, ValueError("a folder without distributed checkpoint shards (*.distcp)"))
        return p
    if not zipfile.is_zipfile(p):
        raise unreadable(p, ValueError("not a complete torch zip archive"))
    if full:
        try:
            with zipfile.ZipFile(p) as zf:
                bad = zf.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise unreadable(p, err) from err
        if bad is not None:
            raise unreadable(p, ValueError(f"checksum mismatch in member {bad!r}"))
    return p


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
