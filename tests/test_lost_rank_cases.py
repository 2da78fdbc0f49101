"""More lost ranks (issue 45): rank 1 stopped (SIGSTOP) while the step-6 checkpoint is saved, and a rank lost
under FSDP2 (``ModelParallelStrategy``, DCP folders). Each is a real 2-process fit on CPU/gloo, as in
``test_lost_rank.py``, whose run arguments these reuse.

Stopped in ``on_save_checkpoint`` (every rank builds the checkpoint; rank 0 writes it, then waits for the others
in a barrier), rank 1 left step 6's file complete on disk while the callback's record still said step 3: the
line read ``lost at step 5`` and ``the newest checkpoint is step 3 (.../last.ckpt)``, though ``--ckpt_path last``
resumes from step 6, and the watchdog's exit left ``run.lock`` behind (the main thread, which releases it, was
in the barrier).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, finish, free_port
from test_lost_rank import PEER_TIMEOUT, _fit_args, _left_running

pytestmark = pytest.mark.slow  # 2-process fits

FSDP2 = ["--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
         "--trainer.strategy.data_parallel_size=2", "--trainer.strategy.tensor_parallel_size=1",
         "--trainer.strategy.process_group_backend=gloo"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "PYTHONFAULTHANDLER": "1"}


def _fit(args: list[str], root: Path, log: Path, timeout: float = 300) -> tuple[int, str, float, str]:
    """Run ``fit args`` (rank 1 lost once, ``root / lost.marker``); (exit code, output, seconds from the loss
    to the end, the state rank 1 was left in: ``""`` when it is gone)."""
    marker, lost_pid = root / "lost.marker", None
    with open(log, "w") as sink:  # a file, not a pipe: a stopped rank keeps a pipe open
        proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *args], cwd=root, env=_env(), stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        finish(proc, timeout, log)
        took = time.time() - marker.stat().st_mtime if marker.exists() else -1.0
        lost_pid = int(marker.read_text()) if marker.exists() else None
        left = _left_running(lost_pid) if lost_pid else ""
    finally:
        for pid in filter(None, (proc.pid if proc.poll() is None else None, lost_pid)):
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
        proc.wait()
    return proc.returncode, log.read_text(), took, left


def _errors(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("error: ")]


def test_a_rank_stopped_while_step_6_is_saved_is_named_at_step_6_and_the_lock_is_released(prepared_data, tmp_path):
    args = _fit_args(prepared_data, tmp_path, "SIGSTOP")
    args = [a.replace("init_args.step=5", "init_args.step=6") for a in args] + ["--trainer.callbacks.init_args.at=save"]
    code, out, took, left = _fit(args, tmp_path, tmp_path / "out.txt")
    ckpts = tmp_path / "checkpoints"
    assert code == 75 and not left, out[-3000:]
    assert _errors(out) == [
        f"error: rank 1: lost at step 6: no heartbeat for {PEER_TIMEOUT:g} s (killed, stopped, or its node is down); "
        f"this rank stopped (exit 75); the newest checkpoint is step 6 ({ckpts / 'step000006.ckpt'}), the steps "
        "after it are lost; resume with the same command and --ckpt_path last (launch/torchrun_fit.sh restarts by "
        "itself, MAX_RESTARTS times); a slow but healthy cluster needs a larger --peer_timeout (seconds)"], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step000003.ckpt", "step000006.ckpt"]  # no lock
    from scalevec_lit.checkpoint.folder import newest_checkpoint, step_on_disk

    resumed = newest_checkpoint(ckpts.glob("*.ckpt"))  # what --ckpt_path last takes: the step the line names
    assert Path(resumed).name == "step000006.ckpt" and step_on_disk(resumed) == 6
    assert took < PEER_TIMEOUT + 20, took
    print(f"stopped while saving: rank 0 stopped {took:.1f} s after rank 1 was stopped")


@pytest.mark.parametrize("how", ["SIGSTOP"])
def test_a_rank_lost_under_fsdp2_leaves_a_complete_dcp_checkpoint_that_resumes(prepared_data, tmp_path, how):
    """FSDP2 on CPU/gloo (``ModelParallelStrategy``, ``data_parallel_size=2``): rank 1 lost in the middle of step 5;
    rank 0 ends with the line and 75, the step-3 DCP folder is complete (checksums) and the same command with
    ``--ckpt_path last`` (what the launcher's restart runs) resumes from it and finishes."""
    from scalevec_lit.checkpoint.folder import folder_problem, step_on_disk

    run = tmp_path / "run"
    run.mkdir()
    args = _fit_args(prepared_data, run, how) + FSDP2
    code, out, took, left = _fit(args, run, tmp_path / "lost.txt")
    ckpts = run / "checkpoints"
    why = (f"no heartbeat for {PEER_TIMEOUT:g} s (killed, stopped, or its node is down)" if how == "SIGSTOP" else
           "its process ended (killed by SIGKILL)")
    assert code == 75 and not left, out[-3000:]
    assert _errors(out) == [
        f"error: rank 1: lost at step 5: {why}; this rank stopped (exit 75); the newest checkpoint is step 3 "
        f"({ckpts / 'last.ckpt'}), the steps after it are lost; resume with the same command and --ckpt_path last "
        "(launch/torchrun_fit.sh restarts by itself, MAX_RESTARTS times); a slow but healthy cluster needs a larger "
        "--peer_timeout (seconds)"], out[-3000:]
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step000003.ckpt"]  # folders; no lock, no .tmp
    for name in ("last.ckpt", "step000003.ckpt"):
        assert (ckpts / name).is_dir() and folder_problem(ckpts / name) is None and step_on_disk(ckpts / name) == 3
    print(f"FSDP2 {how}: rank 0 stopped {took:.1f} s after rank 1 was lost")
    code, out, _, _ = _fit(args + ["--ckpt_path=last"], run, tmp_path / "resumed.txt")
    assert code == 0 and not _errors(out), out[-3000:]
    assert f"Restored all states from the checkpoint at {ckpts / 'last.ckpt'}" in out, out[-3000:]
    assert step_on_disk(ckpts / "last.ckpt") == 10 and (ckpts / "step000009.ckpt").is_dir()
