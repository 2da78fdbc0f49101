"""A checkpoint write that runs out of room is one line with the fix, and nothing is lost.

On a real full disk the first bytes of a checkpoint are written and a later write fails: torch's zip writer
then stops short and reports ``RuntimeError: ... unexpected pos ...`` with the ``OSError`` as its context
(seen on a 1 MB tmpfs). Without root there is no small file system to fill, so the same short write is made
real with the process's file-size limit (EFBIG, here and through the command line in test_exit_codes.py);
``/dev/full`` (every write fails at once with ENOSPC, which torch passes through) checks the full-disk text.
"""
from __future__ import annotations

import os

import pytest
import torch

from scalevec_lit.errors import RunError, report


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_device_is_one_line_and_the_earlier_checkpoint_stays(tmp_path, capsys):
    from scalevec_lit.callbacks.checkpoint import SafeCheckpointIO

    io = SafeCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(4)}, path)
    before = path.read_bytes()
    (tmp_path / "last.ckpt.tmp").symlink_to("/dev/full")
    with pytest.raises(RunError) as info:
        io.save_checkpoint({"step": 2, "w": torch.zeros(100_000)}, path)
    assert str(info.value) == (
        f"checkpoint: {path}: no space left on the device of {tmp_path} while writing it (No space left on device); "
        "the checkpoints written before are intact; free space there, or point the checkpoints elsewhere "
        "(--trainer.default_root_dir=<a folder with room>), then resume with --ckpt_path last")
    assert report(info.value) == 1
    assert capsys.readouterr().err == f"error: {info.value}\n"
    assert path.read_bytes() == before and io.load_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # the temporary file (here a link) is gone


def test_a_short_write_torch_reports_as_unexpected_pos_is_one_line(tmp_path):
    import resource

    from scalevec_lit.callbacks.checkpoint import SafeCheckpointIO

    io = SafeCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    before = path.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = 200_000  # the first 200 kB of a 400 kB checkpoint are written, then the limit stops the file
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:  # Python ignores SIGXFSZ: the write past the limit fails with EFBIG
        with pytest.raises(RunError) as info:
            io.save_checkpoint({"step": 2, "w": torch.zeros(100_000)}, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    cause = info.value.__context__
    assert isinstance(cause, RuntimeError) and "unexpected pos" in str(cause)  # what torch raised
    assert str(info.value) == (
        f"checkpoint: {path}: the file outgrew the largest file allowed there (a file-size limit: `ulimit -f`, or the "
        f"file system's own) while writing it in {tmp_path} (File too large); the checkpoints written before are "
        "intact; free space there, or point the checkpoints elsewhere (--trainer.default_root_dir=<a folder with "
        "room>), then resume with --ckpt_path last")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_only_a_write_that_ran_out_of_room_is_reworded():
    import errno

    from scalevec_lit.checkpoint.verify import write_failure

    assert write_failure(RuntimeError("unexpected pos 704 vs 598"), "/x/last.ckpt") is None  # no OSError under it
    try:
        try:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        except OSError:
            raise RuntimeError("unexpected pos 704 vs 598")
    except RuntimeError as err:
        assert write_failure(err, "/x/last.ckpt") is None  # another failure: not called a full disk
