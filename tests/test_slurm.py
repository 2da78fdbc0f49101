"""``launch/slurm_fit.sbatch`` under a real SLURM (``tests/slurm_cluster.py``: munged, slurmctld and slurmd on this
machine, 2-task CPU jobs), submitted with ``sbatch`` as a user does:

- the time limit's SIGUSR1 (``--signal``) → a checkpoint at that step → the job requeued exactly once (by the
  script; Lightning's own requeue handler is off) → resumed from ``last`` → final weights and optimizer state
  bitwise equal to an uninterrupted job's; the uninterrupted job's log holds only true lines (an allowlist);
- ``scancel`` → saved at that step and not requeued; a second job on the same run folder, while the first runs,
  refused with one line and not requeued;
- a task killed → exit 75 from the survivor → requeued at most ``MAX_RESTARTS`` times, then a last line that says
  why.

A requeued job waits 2 minutes before SLURM starts it again (its ``EligibleTime``, which gives the node time to
clean up the job's last start); the tests release it after 10 seconds (``scontrol update StartTime=now+10``), as an
administrator can, and give it a longer time limit where the first one was cut short.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT
from slurm_cluster import SlurmCluster
from slurm_probes import steps
from test_first_run import TWO_PROCESSES, fit_lines, unexpected_lines

SCRIPT = str(ROOT / "launch" / "slurm_fit.sbatch")
TINY = ["--model.config.n_layer=2", "--model.config.n_embd=32", "--model.config.n_head=2",
        "--model.config.n_kv_head=1", "--model.config.seq_len=32", "--data.batch_size=2"]
TINY_PARAMS = r"[\d,]+ total, [\d,]+ in scale vectors \([\d.]+%\)"
SCRIPT_LINES = [r"\[rank: 0\] Seed set to 42", r"scalevec: job \d+ start \d: 1 node\(s\) x 2 process\(es\)", r"scalevec: job \d+ done"]


@pytest.fixture(scope="module")
def cluster():
    c = SlurmCluster()
    try:
        yield c.start()
    finally:
        c.stop()


def _submit(cluster: SlurmCluster, data: Path, run: Path, max_steps: int, *fit: str, sbatch: tuple = (),
            env: dict | None = None) -> int:
    run.mkdir(parents=True, exist_ok=True)
    args = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=10",
            f"--output={run / 'job.out'}", f"--chdir={run}", *sbatch, SCRIPT, "smoke", "",
            f"--data.data_dir={data}", f"--trainer.max_steps={max_steps}", f"--trainer.default_root_dir={run}",
            f"--trainer.logger.init_args.save_dir={run}", "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false", "--model.schedule.init_args.warmup_steps=2", "--peer_timeout=20",
            *TINY, *fit]
    return cluster.sbatch(args, cwd=run, env={"PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
                                              "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", **(env or {})})


def _until(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


def _state(path: Path) -> tuple[dict, list]:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return ckpt["state_dict"], ckpt["optimizer_states"]


def _assert_same_tensors(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same_tensors(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tensors(x, y, f"{where}/{i}")
    else:
        assert a == b, where


@pytest.mark.slow
def test_a_time_limit_saves_requeues_once_and_ends_bitwise_equal(cluster, prepared_data, tmp_path):
    max_steps = 80
    ref = _submit(cluster, prepared_data, tmp_path / "ref", max_steps)
    out = tmp_path / "run" / "steps"
    job = _submit(cluster, prepared_data, tmp_path / "run", max_steps,
                  "--trainer.callbacks+=slurm_probes.Pace", f"--trainer.callbacks.init_args.out={out}",
                  "--trainer.callbacks.init_args.seconds=0.5", sbatch=("--signal=USR1@50",))
    _until(lambda: len(steps(out)) >= 2, 120, f"job {job} training\n{cluster.logs()}")
    cluster.scontrol("update", f"JobId={job}", "TimeLimit=1")  # 50 s before the end is past: SIGUSR1 comes next
    cluster.wait(job, ("PENDING",), 90, restarts=1)  # saved and requeued by the script
    cluster.scontrol("update", f"JobId={job}", "StartTime=now+10", "TimeLimit=10")
    info = cluster.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), 240)
    log = (tmp_path / "run" / "job.out").read_text()
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), \
        log[-5000:] + cluster.logs()
    assert cluster.wait(ref, ("COMPLETED",), 120)["Restarts"] == "0"

    first = [s for start, s in steps(out) if start == 0]
    stopped = first[-1]  # the step the first start saved at and stopped after
    assert 2 <= stopped < max_steps and [s for start, s in steps(out) if start == 1] == \
        list(range(stopped + 1, max_steps + 1))
    assert (tmp_path / "run" / "checkpoints" / f"step{stopped:06d}.ckpt").is_file()
    assert log.count("received SIGUSR1: saving a checkpoint at the end of this step") == 1
    assert log.count(f"scalevec: job {job} stopped by SIGUSR1 (time limit) after saving; requeued") == 1
    assert "SLURM auto-requeueing enabled" not in log and "Requeued SLURM job" not in log  # one requeuer
    assert re.search(rf"scalevec: job {job} start 2: .*\n(.*\n)*scalevec: job {job} done", log)

    ref_state = _state(tmp_path / "ref" / "checkpoints" / "last.ckpt")
    run_state = _state(tmp_path / "run" / "checkpoints" / "last.ckpt")
    _assert_same_tensors(run_state, ref_state, "last.ckpt")
    # the uninterrupted job's log: the script's lines and the fit's true ones, nothing of Lightning's that is untrue
    # here (the srun hint, the requeue handler, "no last checkpoint available", the sync_dist advice)
    allowed = fit_lines(re.escape(str(tmp_path / "ref")), "TensorBoard events", max_steps, TINY_PARAMS) + \
        TWO_PROCESSES + SCRIPT_LINES
    unexpected = unexpected_lines((tmp_path / "ref" / "job.out").read_text(), allowed)
    assert unexpected == [], "unexpected lines:\n" + "\n".join(map(repr, unexpected))


@pytest.mark.slow
def test_scancel_saves_and_is_not_requeued_and_a_second_job_on_the_folder_is_refused(cluster, prepared_data,
                                                                                      tmp_path):
    out = tmp_path / "run" / "steps"
    job = _submit(cluster, prepared_data, tmp_path / "run", 200, "--trainer.callbacks+=slurm_probes.Pace",
                  f"--trainer.callbacks.init_args.out={out}", "--trainer.callbacks.init_args.seconds=0.3")
    _until(lambda: len(steps(out)) >= 2, 120, f"job {job} training\n{cluster.logs()}")
    second = _submit(cluster, prepared_data, tmp_path / "second", 200, f"--trainer.default_root_dir={tmp_path / 'run'}")
    info = cluster.wait(second, ("FAILED", "COMPLETED"), 120)
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("FAILED", "0", "1:0"), info
    text = (tmp_path / "second" / "job.out").read_text()
    assert text.count("another run (pid ") == 2, text[-3000:]  # both ranks refuse at once, before they meet
    assert f"scalevec: job {second} ended with exit 1: not requeued" in text and "bug" not in text, text[-3000:]

    cluster._run(["scancel", str(job)])
    info = cluster.wait(job, ("CANCELLED", "COMPLETED", "FAILED"), 90)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), info
    stopped = steps(out)[-1][1]
    _until(lambda: (tmp_path / "run" / "checkpoints" / f"step{stopped:06d}.ckpt").is_file(), 30, "the saved step")
    log = (tmp_path / "run" / "job.out").read_text()
    assert "received SIGTERM: saving a checkpoint at the end of this step" in log, log[-3000:]
    _until(lambda: not (tmp_path / "run" / "checkpoints" / "run.lock").exists(), 30, "the lock released")


@pytest.mark.slow
def test_a_lost_task_is_requeued_at_most_max_restarts_times(cluster, prepared_data, tmp_path):
    job = _submit(cluster, prepared_data, tmp_path / "run", 200, "--trainer.callbacks+=slurm_probes.LoseEachStart",
                  "--trainer.callbacks.init_args.after=3", env={"MAX_RESTARTS": "1"})
    cluster.wait(job, ("PENDING",), 150, restarts=1)
    cluster.scontrol("update", f"JobId={job}", "StartTime=now+10")
    info = cluster.wait(job, ("FAILED", "COMPLETED", "CANCELLED"), 150)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1", info
    log = (tmp_path / "run" / "job.out").read_text()
    assert log.count("lost a rank") == 2, log[-4000:]
    assert re.search(rf"scalevec: job {job} lost a rank \(exit (75|137)\); requeued \(restart 1 of 1\)", log)
    assert re.search(rf"scalevec: job {job} lost a rank \(exit (75|137)\) and has restarted 1 time\(s\) "
                     r"\(MAX_RESTARTS=1\): not requeued", log)
    assert re.search(r"error: rank 1: lost at step \d+: its connection closed", log), log[-4000:]
