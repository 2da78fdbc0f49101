"""The lost-rank line names the newest checkpoint that is complete on disk (``PeerWatch._newest_checkpoint``).
The checkpoint callback records a save when it starts; an asynchronous DCP write, or the rename rank 0 does
after every rank wrote, may never be finished when a rank is lost (rank 0 killed at step 5 under FSDP2 with
``async_save`` left ``step000003.ckpt.tmp`` only), and the line said ``the newest checkpoint is step 3
(.../last.ckpt)``, a checkpoint that did not exist."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from scalevec_lit.lit.peers import PeerWatch


def _watch(folder, last: str, step: int) -> PeerWatch:
    watch = PeerWatch(timeout=30)
    callback = SimpleNamespace(dirpath=str(folder), last_model_path=str(folder / last), best_model_path="",
                               _last_global_step_saved=step)
    watch._trainer = SimpleNamespace(checkpoint_callback=callback)
    return watch


def _dcp(folder, name: str, step: int):
    """A complete DCP folder as far as the line is concerned: its meta.pt holds the step."""
    out = folder / name
    out.mkdir(parents=True)
    torch.save({"global_step": step, "epoch": 0}, out / "meta.pt")
    return out


def test_a_complete_checkpoint_of_the_recorded_step_is_named_as_before(tmp_path):
    _dcp(tmp_path, "step000006.ckpt", 6)
    _dcp(tmp_path, "last.ckpt", 6)
    assert _watch(tmp_path, "last.ckpt", 6)._newest_checkpoint() == (
        f"the newest checkpoint is step 6 ({tmp_path / 'last.ckpt'}), the steps after it are lost")


def test_a_write_in_flight_names_the_newest_complete_checkpoint_instead(tmp_path):
    _dcp(tmp_path, "step000003.ckpt", 3)
    _dcp(tmp_path, "last.ckpt", 3)  # last of step 3; step 6's write and its last never completed
    _dcp(tmp_path, "step000006.ckpt.tmp", 6)
    torch.save({"global_step": 9}, tmp_path / "nonfinite.ckpt")  # a post-mortem file is never a resume point
    newest = _watch(tmp_path, "last.ckpt", 6)._newest_checkpoint()
    assert newest == (f"the newest complete checkpoint is step 3 ({tmp_path / 'step000003.ckpt'}; step 6's was being "
                      "written and is not complete (last.ckpt.tmp or missing)), the steps after it are lost")


def test_the_step_s_own_file_is_named_when_only_its_last_copy_is_pending(tmp_path):
    _dcp(tmp_path, "step000006.ckpt", 6)
    assert _watch(tmp_path, "last.ckpt", 6)._newest_checkpoint() == (
        f"the newest checkpoint is step 6 ({tmp_path / 'step000006.ckpt'}), the steps after it are lost")


def test_no_complete_checkpoint_says_a_restart_begins_at_step_0(tmp_path):
    _dcp(tmp_path, "step000003.ckpt.tmp", 3)
    assert _watch(tmp_path, "last.ckpt", 3)._newest_checkpoint() == (
        "no checkpoint is complete (step 3's was being written and is not complete (last.ckpt.tmp or missing)): a "
        "restart begins at step 0")


def test_a_complete_write_not_yet_recorded_is_named(tmp_path):
    """Rank 0 writes step 6's file, then waits in a barrier for a rank that is lost: the record still says step 3
    (``last.ckpt``), and the line named step 3, while ``--ckpt_path last`` resumes from step 6's file."""
    _dcp(tmp_path, "step000003.ckpt", 3)
    _dcp(tmp_path, "last.ckpt", 3)
    _dcp(tmp_path, "step000006.ckpt", 6)
    _dcp(tmp_path, "step000009.ckpt", 9)  # an abandoned run's, beyond the step this run reached: not this run's
    watch = _watch(tmp_path, "last.ckpt", 3)
    watch.step = 6
    assert watch._newest_checkpoint() == (
        f"the newest checkpoint is step 6 ({tmp_path / 'step000006.ckpt'}), the steps after it are lost")
