"""Training from a bucket on a real S3-compatible server on 127.0.0.1 (``tests/s3_server.py``): a fit with
only the standard AWS environment logs the same losses, bitwise, as from the local folder; a run killed
with SIGKILL resumes exactly, on another node's cache; an endpoint that stops answering mid-run stops the
run after its bounded retries with one line, and ``--ckpt_path last`` resumes it exactly once it is back."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, main_in_process, run_cli, scalars, smoke_args
from s3_server import BUCKET, PREFIX, S3Server, session_server

pytestmark = pytest.mark.slow  # a server process, fits, a killed subprocess

N = 6  # checkpoint interval; runs go to 2N


@pytest.fixture()
def s3(request, tmp_path_factory):
    return session_server(request, tmp_path_factory)


def _args(data, root: Path, cache: Path, steps: int, *extra: str) -> list[str]:
    ckpt = root.parent / "ckpt.yaml"
    ckpt.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args:\n        filename: 'step{step:06d}'\n        auto_insert_metric_name: false\n"
        f"        every_n_train_steps: {N}\n        save_last: true\n        save_top_k: -1\n")
    return smoke_args(data, root, steps, "--config", str(ckpt), "--trainer.limit_val_batches=0",
                      "--trainer.log_every_n_steps=1", "--model.config.n_layer=1", f"--data.cache_dir={cache}",
                      "--data.cache_size=40KB", *extra)


def _losses(root: Path, version: str) -> dict[int, float]:
    return dict(scalars(root / "smoke" / version)["train/loss"])


@pytest.fixture()
def aws_env(s3, monkeypatch):
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    return s3.env


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict[str, dict[int, float]]:
    """Uninterrupted 2N-step fits from the bucket (with only the AWS environment) and from the local folder."""
    from scalevec_lit.cli import main

    s3, tmp = session_server(request, tmp_path_factory), tmp_path_factory.mktemp("reference")
    losses = {}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3.env.items():
            mp.setenv(key, value)
        mp.chdir(tmp)
        for name, data in (("remote", s3.url), ("local", s3.local)):
            main(_args(data, tmp / name, tmp / "cache", 2 * N))
            losses[name] = _losses(tmp / name, "version_0")
    assert not (tmp / "s3:").exists() and not (tmp / "remote" / "s3:").exists()
    cached = sorted((tmp / "cache").glob("shakespeare-*/train/*.bin"))  # data.cache_size=40KB: 16 KB chunks
    assert 1 <= len(cached) <= 4, cached  # chunks read were deleted (2N steps read about 6 of them)
    return losses


@pytest.fixture()
def reference(runs) -> dict[int, float]:
    return runs["remote"]


def test_fit_from_the_bucket_equals_the_local_fit(runs):
    """``fit --data.data_dir s3://...`` with only the standard AWS variables, a capped cache (chunks
    downloaded, evicted and downloaded as the run goes): the same losses, bitwise, as from the local folder."""
    assert sorted(runs["remote"]) == list(range(2 * N)) and runs["remote"] == runs["local"]


def _start(data, root: Path, cache: Path, env: dict) -> subprocess.Popen:
    root.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "scalevec_lit", *_args(data, root, cache, 2 * N)], cwd=root,
                            env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, path: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists(), proc.stderr.read()[-3000:] if proc.poll() is not None else "no checkpoint in time"


def _resumed(data, root: Path, cache: Path, capfd, reference: dict[int, float], *extra: str) -> None:
    code, text = main_in_process(capfd, _args(data, root, cache, 2 * N, "--ckpt_path=last", *extra))
    assert code == 0, text[-3000:]
    resumed = _losses(root, "version_1")
    assert N <= min(resumed) < 2 * N and sorted(resumed) == list(range(min(resumed), 2 * N))
    for step, value in resumed.items():
        assert value == reference[step], (step, value, reference[step])  # bitwise


def test_kill9_then_resume_from_the_bucket_on_another_cache(s3, aws_env, reference, tmp_path, capfd):
    root = tmp_path / "run"
    proc = _start(s3.url, root, tmp_path / "cache-a", aws_env)
    try:
        _wait_for(proc, root / "checkpoints" / f"step{N:06d}.ckpt")
        assert proc.poll() is None, "the run ended before the kill"
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    _resumed(s3.url, root, tmp_path / "cache-b", capfd, reference)  # another node: an empty cache


def test_endpoint_stops_answering_mid_run(s3, reference, tmp_path, capfd, monkeypatch):
    """The endpoint frozen (SIGSTOP) after the step-N checkpoint: the run stops within its retries
    (2 attempts of at most 2 s) with one line naming the URL, the endpoint and the resume; thawed, the
    same command with --ckpt_path last finishes with the uninterrupted losses."""
    own = S3Server().start()
    try:
        own.client().create_bucket(Bucket=BUCKET)
        for path in sorted(p for p in s3.local.rglob("*") if p.is_file()):
            own.client().upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(s3.local)}")
        for key, value in own.env.items():
            monkeypatch.setenv(key, value)
        options = "--data.storage_options={retries: 2, retry_wait: 0.1, timeout: 2}"
        root, cache = tmp_path / "run", tmp_path / "cache"
        env = {**own.env, "SCALEVEC_EXTRA": ""}
        proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *_args(s3.url, root, cache, 2 * N, options)],
                                cwd=tmp_path, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(proc, root / "checkpoints" / f"step{N:06d}.ckpt")
            os.kill(own.proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            _, err = proc.communicate(timeout=120)
            took = time.monotonic() - stopped
        finally:
            os.kill(own.proc.pid, signal.SIGCONT)
            proc.kill()
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert proc.returncode == 1 and len(errors) == 1, err[-3000:]
        assert "Traceback" not in err and "CRASHED" not in err, err[-3000:]  # the one line only
        assert errors[0].startswith(f"error: data.data_dir: {s3.url}/train/chunk-") and \
            "failed 2 times, the last with" in errors[0], errors[0]
        assert f"(endpoint {own.endpoint}); check that the endpoint is up" in errors[0]
        assert errors[0].endswith("a fit stopped by this resumes with --ckpt_path last once it is back")
        assert took < 60, took
        _resumed(s3.url, root, cache, capfd, reference, options)
    finally:
        own.stop()


def test_two_processes_fit_from_the_bucket(s3, aws_env, tmp_path):
    """``--trainer.devices=2 --trainer.strategy=ddp`` from the bucket: both ranks share the node's capped
    cache and the run finishes."""
    root = tmp_path / "run"
    res = run_cli(_args(s3.url, root, tmp_path / "cache", 4, "--trainer.devices=2", "--trainer.strategy=ddp"),
                  cwd=tmp_path, env=aws_env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(_losses(root, "version_0")) == [0, 1, 2, 3]
    assert len(list((tmp_path / "cache").glob("shakespeare-*/train/*.bin"))) <= 8  # two ranks, 40 KB each


def test_a_loader_worker_reads_the_bucket_through_the_library(runs, s3, aws_env, tmp_path):
    """``--data.num_workers=1`` from the bucket: the worker starts from the fork server (``loader_workers.py``),
    not as a fork of the rank, so it registers the library's ``s3://`` downloader itself (the checked, retried
    one of ``remote.py``); the losses are the local fit's, bitwise."""
    root = tmp_path / "run"
    res = run_cli(_args(s3.url, root, tmp_path / "cache", 2 * N, "--data.num_workers=1"), cwd=tmp_path, env=aws_env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _losses(root, "version_0") == runs["local"]
