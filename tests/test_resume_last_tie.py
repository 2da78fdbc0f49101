"""``--ckpt_path last`` picks one checkpoint, the same on every rank, when files tie on modification time: an
``async_save`` ``last.ckpt`` (a hard link, or a copy that keeps its step file's time), or any two files on a file
system that keeps whole seconds. Lightning takes the newest of ``_find_last_checkpoints`` by time, and among
ties the first in a set's order, which differs from process to process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from helpers import ROOT

T = 1_700_000_000_000_000_000  # one time, in ns, for every tied file


def _write(folder: Path, name: str, step: int, ns: int = T) -> None:
    torch.save({"global_step": step}, folder / name)
    os.utime(folder / name, ns=(ns, ns))


def _chosen(folder: Path) -> set[str]:
    from scalevec_lit.callbacks import SafeModelCheckpoint

    cb = SafeModelCheckpoint(dirpath=folder)
    return {Path(p).name for p in cb._find_last_checkpoints(trainer=None)}


def test_the_highest_step_wins_a_tie(tmp_path):
    _write(tmp_path, "step000010.ckpt", 10, T - 10**9)
    _write(tmp_path, "step000020.ckpt", 20)
    _write(tmp_path, "step000030.ckpt", 30)  # saved within the same second as step 20, on a coarse file system
    _write(tmp_path, "last.ckpt", 20)  # killed before last was replaced
    assert _chosen(tmp_path) == {"step000030.ckpt"}


def test_last_wins_a_tie_with_its_own_step(tmp_path):
    _write(tmp_path, "step000020.ckpt", 20)
    os.link(tmp_path / "step000020.ckpt", tmp_path / "last.ckpt")  # async_save's last: a link
    assert _chosen(tmp_path) == {"last.ckpt"}


def test_the_newest_by_time_without_a_tie(tmp_path):
    _write(tmp_path, "step000020.ckpt", 20, T - 1)
    _write(tmp_path, "other.ckpt", 5)
    assert _chosen(tmp_path) == {"other.ckpt"}  # the time decides, as in Lightning; steps only break ties


def test_every_process_picks_the_same_file(tmp_path):
    for name in ("step000020.ckpt", "last.ckpt", "a.ckpt", "b.ckpt"):
        _write(tmp_path, name, 20)
    # Lightning's choice (trainer/connectors/checkpoint_connector.py): the newest candidate by time, max over a dict
    code = ("import os, sys; sys.path[:0] = [sys.argv[1]]; from scalevec_lit.callbacks import SafeModelCheckpoint; "
            "found = {p: os.path.getmtime(p) for p in SafeModelCheckpoint(dirpath=sys.argv[2])._find_last_checkpoints(None)}; "
            "print(max(found, key=found.get))")
    seen = {subprocess.run([sys.executable, "-c", code, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True).stdout
            for seed in range(6)}
    assert seen == {f"{tmp_path / 'last.ckpt'}\n"}
