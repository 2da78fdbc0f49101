"""Checkpoints off the critical path: ``SafeModelCheckpoint(async_save: true)`` (``callbacks/_async_write.py``).

- an uninterrupted run that saves asynchronously (steps 3 and 6, the final step 8, and ``last`` linked to them);
- a run whose step-6 checkpoint takes 2 minutes to write (a probe object in the checkpoint sleeps when
  pickled: deterministic) goes on training while the writer thread is busy, and is killed with SIGKILL
  then: the step-3 checkpoint is complete and verified, step 6 is only ``step000006.ckpt.tmp``, and
  ``--ckpt_path last`` resumes from step 3 to the uninterrupted run's losses, bit for bit (CPU);
- after that resume, ``last.ckpt`` holds the final step (not ``last-v1.ckpt`` beside a stale ``last.ckpt``);
- the same kill and resume under FSDP2, with DCP folders written by ``torch.distributed.checkpoint.async_save``;
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

    ckpts = _kill_while_writing_step_6(prepared_data, tmp_path / "killed", "async_probe.SlowCheckpoint")
    assert (ckpts / "last.ckpt").read_bytes() == (ckpts / "step000003.ckpt").read_bytes()
    _resume_to_the_reference(prepared_data, tmp_path / "killed", reference)


FSDP2 = ["--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
         "--trainer.strategy.data_parallel_size=1", "--trainer.strategy.tensor_parallel_size=1",
         "--trainer.strategy.process_group_backend=gloo", "--trainer.devices=1"]


@pytest.mark.slow
def test_a_kill_during_an_async_distributed_save_keeps_last_and_resumes_into_last(prepared_data, tmp_path):
    """The same under FSDP2 (``ModelParallelStrategy``): DCP folders, ``torch.distributed.checkpoint.async_save``;
    the step-6 folder is held in the writer thread after DCP wrote it, before it is hashed and renamed."""
    ref = tmp_path / "ref"
    ref.mkdir()
    res = run_cli(_args(prepared_data, ref, *FSDP2), cwd=ref, env=ENV)
    assert res.returncode == 0, res.stderr[-4000:]
    reference = _losses(ref)
    assert sorted(reference) == list(range(STEPS))

    run = tmp_path / "killed"
    ckpts = _kill_while_writing_step_6(prepared_data, run, "async_probe.SlowDistributedCheckpoint", *FSDP2)
    assert all((ckpts / name).is_dir() for name in ("last.ckpt", "step000003.ckpt"))
    assert sorted(p.name for p in (ckpts / "last.ckpt").iterdir()) == \
        sorted(p.name for p in (ckpts / "step000003.ckpt").iterdir())
    _resume_to_the_reference(prepared_data, run, reference, *FSDP2)


def _kill_while_writing_step_6(data: Path, run: Path, probe_class: str, *extra: str) -> Path:
    """A run whose step-6 write takes 300 s in the writer thread, killed with SIGKILL once training has reached
    its last step meanwhile: step 3 complete (and ``last``), step 6 only ``.tmp``. Returns the checkpoint folder."""
    from scalevec_lit.checkpoint.verify import verify_checkpoint

    run.mkdir()
    probe = f"    - class_path: {probe_class}\n      init_args: {{out: {run / 'probe'}, at: 6, seconds: 300}}\n"
    proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *_args(data, run, *extra, probe=probe)],
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
    (run / "ckpt.yaml").unlink()
    return ckpts


def _resume_to_the_reference(data: Path, run: Path, reference: dict[int, float], *extra: str) -> None:
    """``--ckpt_path last`` resumes step 3, trains the reference's losses bit for bit, and ends with ``last.ckpt``
    holding the final step."""
    res = run_cli(_args(data, run, "--ckpt_path=last", *extra), cwd=run, env=ENV)
    assert res.returncode == 0, res.stderr[-4000:]
    resumed = dict(scalars(run / "smoke" / "version_1")["train/loss"])
    assert sorted(resumed) == list(range(EVERY, STEPS))
    assert resumed == {s: reference[s] for s in range(EVERY, STEPS)}  # bitwise
    _assert_last_is_newest(run / "checkpoints", STEPS)


def _assert_last_is_newest(ckpts: Path, step: int) -> None:
    """``last.ckpt`` is the newest complete step after the resume, in its own name (no ``last-v1.ckpt``)."""
    names = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("last"))
    assert names == ["last.ckpt"], names
    newest = ckpts / f"step{step:06d}.ckpt"
    if newest.is_dir():  # a distributed (DCP) folder: the same files
        assert sorted(p.name for p in (ckpts / "last.ckpt").iterdir()) == sorted(p.name for p in newest.iterdir())
        for f in newest.iterdir():
            assert (ckpts / "last.ckpt" / f.name).read_bytes() == f.read_bytes(), f.name
    else:
        assert (ckpts / "last.ckpt").read_bytes() == newest.read_bytes()


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
