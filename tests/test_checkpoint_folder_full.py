"""A distributed (DCP) checkpoint write that runs out of room is the one line of a one-file write, and its
partial ``<name>.tmp`` folder is removed (it stopped as ``internal: CheckpointException ... unexpected pos``,
leaving the partial folder). torch's DCP hands each rank's error to the others pickled, without the
``OSError`` that the zip writer's ``unexpected pos`` had as its context, so that error is recognised too."""
from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from helpers import ROOT
from scalevec_lit.checkpoint.verify import write_failure
from test_checkpoint_folder import _fsdp

FIX = ("the checkpoints written before are intact; free space there, or point the checkpoints elsewhere "
       "(--trainer.default_root_dir=<a folder with room>), then resume with --ckpt_path last")
SHORT = "unexpected pos 704 vs 598"


def test_a_short_shard_write_reported_by_dcp_is_one_line(tmp_path):
    path = tmp_path / "step000002.ckpt"
    err = CheckpointException("save", {0: (RuntimeError(f"[enforce fail at inline_container.cc:672] . {SHORT}"), None)})
    assert str(write_failure(err, path)) == (
        f"checkpoint: {path}: a shard's write stopped short in {tmp_path} (torch: 'unexpected pos'): no space left on "
        f"its device, or a file-size limit or quota reached; {FIX}")
    full = CheckpointException("save", {1: (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), None)})
    assert str(write_failure(full, path)) == (
        f"checkpoint: {path}: no space left on the device of {tmp_path} while writing it (No space left on device); "
        f"{FIX}")


def test_other_dcp_failures_are_left_alone(tmp_path):
    assert write_failure(CheckpointException("save", {0: (ValueError("a planner bug"), None)}), tmp_path / "x") is None
    assert write_failure(RuntimeError(SHORT), tmp_path / "x") is None  # one file: only with its OSError


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000))  # a shard of this model is 3.4 MB


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True])
def test_a_full_disk_during_a_dcp_save_is_one_line_and_leaves_no_partial_folder(prepared_data, tmp_path, async_save):
    root = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1"}
    res = subprocess.run([sys.executable, "-m", "scalevec_lit", *_fsdp(prepared_data, root, 4, 1, async_save)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
                         preexec_fn=_limit_file_size)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    folder = root / "checkpoints"
    assert res.returncode == 1 and errors == [
        f"error: checkpoint: {folder / 'step000002.ckpt'}: a shard's write stopped short in {folder} (torch: "
        f"'unexpected pos'): no space left on its device, or a file-size limit or quota reached; {FIX}"
    ], res.stderr[-3000:]
    assert sorted(p.name for p in folder.iterdir()) == []  # no partial folder, and the lock released
