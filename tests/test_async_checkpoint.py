"""Checkpoints off the critical path: ``SafeModelCheckpoint(async_save: true)`` (``callbacks/_async_write.py``).

- an uninterrupted run that saves asynchronously (steps 3 and 6, the final step 8, and ``last`` linked to them);
- a run whose step-6 checkpoint takes 2 minutes to write (a probe object in the checkpoint sleeps when
  pickled: deterministic) goes on training while the writer thread is busy, and is killed with SIGKILL
  then: the step-3 checkpoint is complete and verified, step 6 is only ``step000006.ckpt.tmp``, and
  ``--ckpt_path last`` resumes from step 3 to the uninterrupted run's losses, bit for bit (CPU);
- the writer's own contract: jobs in order, a failed write raised in the training thread.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, run_cli, scalars, smoke_args

STEPS, EVERY = 8, 3
TINY = ["--model.config.n_layer=2", "--model.config.n_embd=32", "--model.config.n_head=2", "--model.config.n_kv_head=1",
        "--model.config.seq_len=32", "--data.batch_size=4"]
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}


def _args(data: Path, root: Path, *extra: str, probe: str = "") -> list[str]:
    cfg = root / "ckpt.yaml"
    cfg.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: "
        f"{EVERY}, save_last: true, save_top_k: -1, async_save: true}}\n{probe}")
    return smoke_args(data, root, STEPS, "--config", str(cfg), "--trainer.log_every_n_steps=1",
                      "--trainer.val_check_interval=1000", "--trainer.limit_val_batches=0", *TINY, *extra)


def _losses(root: Path) -> dict[int, float]:
    return dict(scalars(root / "smoke" / "version_0")["train/loss"])


@pytest.mark.slow
def test_a_kill_during_an_async_save_keeps_the_previous_checkpoint_and_resumes_exactly(prepared_data, tmp_path):
    from scalevec_lit.checkpoint.verify import verify_checkpoint

    ref = tmp_path / "ref"
    ref.mkdir()
    res = run_cli(_args(prepared_data, ref), cwd=ref, env=ENV)
    assert res.returncode == 0, res.stderr[-4000:]
    reference = _losses(ref)
    assert sorted(reference) == list(range(STEPS))
    ckpts = ref / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name != "run.lock") == \
        ["last.ckpt", "step000003.ckpt", "step000006.ckpt", "step000008.ckpt"]  # complete when fit returned; no .tmp
    assert (ckpts / "last.ckpt").read_bytes() == (ckpts / "step000008.ckpt").read_bytes()  # the final step
    for p in ckpts.glob("*.ckpt"):
        verify_checkpoint(p, full=True)

    run = tmp_path / "killed"
    run.mkdir()
    probe = (f"    - class_path: async_probe.SlowCheckpoint\n      init_args: {{out: {run / 'probe'}, at: 6, "
             "seconds: 300}\n")
    proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *_args(prepared_data, run, probe=probe)],
                            cwd=run, env={**os.environ, **ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    writing, steps = run / "probe" / "writing", run / "probe" / "steps"
    deadline = time.time() + 300
    try:  # the step-6 write is in the writer thread, and training goes on to its last step meanwhile
        while proc.poll() is None and time.time() < deadline and not (
                writing.exists() and steps.exists() and steps.read_text().split()[-1:] == [str(STEPS)]):
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()[-4000:]
        assert writing.read_text() == "scalevec-checkpoint-writer"
        assert steps.read_text().split() == [str(s) for s in range(1, STEPS + 1)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    ckpts = run / "checkpoints"
    names = sorted(p.name for p in ckpts.iterdir() if p.name != "run.lock")
    assert names == ["last.ckpt", "step000003.ckpt", "step000006.ckpt.tmp"], names  # 6: never renamed
    verify_checkpoint(ckpts / "step000003.ckpt", full=True)
    assert (ckpts / "last.ckpt").read_bytes() == (ckpts / "step000003.ckpt").read_bytes()

    (run / "ckpt.yaml").unlink()
    res = run_cli(_args(prepared_data, run, "--ckpt_path=last"), cwd=run, env=ENV)
    assert res.returncode == 0, res.stderr[-4000:]
    resumed = dict(scalars(run / "smoke" / "version_1")["train/loss"])
    assert sorted(resumed) == list(range(EVERY, STEPS))
    assert resumed == {s: reference[s] for s in range(EVERY, STEPS)}  # bitwise


def test_the_writer_runs_jobs_in_order_and_raises_a_failed_write_in_the_caller():
    from scalevec_lit.callbacks._async_write import BackgroundWriter

    writer, done = BackgroundWriter(), []
    writer.submit(lambda: (time.sleep(0.2), done.append(1)))
    writer.submit(lambda: done.append(2), wait=False)  # queued behind the first, no wait
    assert done == [] and writer.busy
    writer.submit(lambda: done.append(3))  # waits for both
    writer.wait()
    assert done == [1, 2, 3] and not writer.busy

    def full_disk():
        raise OSError(28, "No space left on device")

    writer.submit(full_disk)
    writer.submit(lambda: done.append(4), wait=False)  # dropped: behind a failed write
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    assert done == [1, 2, 3]
    writer.wait()  # raised once
