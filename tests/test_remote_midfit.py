"""A chunk download that fails in the middle of a fit (issue 45): the data streamed from a moto S3 server of the
test's own (``tests/s3_server.py``), and after the step-6 checkpoint either the bucket's train chunks are deleted
or the server is stopped, so that a later chunk's download (not one from the cache) fails. The fit stops with
exit 1 and one line naming the chunk's URL and the fix; the step-6 checkpoint is complete and the lock released.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from helpers import ROOT, smoke_args
from s3_server import BUCKET, PREFIX, S3Server, session_server

pytestmark = pytest.mark.slow  # a server process and a fit each

OPTIONS = "--data.storage_options={retries: 2, retry_wait: 0.1, timeout: 2}"


@pytest.fixture()
def own(request, tmp_path_factory):
    """A server holding the session's prepared corpus, which the test may empty or stop."""
    local = session_server(request, tmp_path_factory).local
    server = S3Server().start()
    try:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            client.upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(local)}")
        server.local = local
        yield server
    finally:
        server.stop()


def _args(root, steps: int = 12) -> list[str]:
    ckpt = root / "ckpt.yaml"
    ckpt.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 6,"
        " save_last: true, save_top_k: -1}\n")
    return smoke_args(f"s3://{BUCKET}/{PREFIX}", root, steps, "--config", str(ckpt), "--trainer.limit_val_batches=0",
                      "--model.config.n_layer=1", "--model.config.n_embd=32", f"--data.cache_dir={root / 'cache'}",
                      "--data.cache_size=40KB", OPTIONS)


@pytest.mark.parametrize("fault", ["chunks deleted", "server stopped"])
def test_a_chunk_download_that_fails_mid_fit_is_one_line_and_keeps_the_checkpoint(own, tmp_path, fault):
    from scalevec_lit.checkpoint.verify import verify_checkpoint

    env = {**os.environ, **own.env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *_args(tmp_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpts = tmp_path / "checkpoints"
    try:
        deadline = time.monotonic() + 300
        while not (ckpts / "step000006.ckpt").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        cached = {p.name for p in (tmp_path / "cache").rglob("chunk-*.bin")}
        if fault == "server stopped":
            own.stop()
        else:
            client = own.client()
            keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/train/chunk-")["Contents"]]
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys]})
        faulted = time.monotonic()
        _, err = proc.communicate(timeout=180)
        took = time.monotonic() - faulted
    finally:
        proc.kill()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, err[-3000:]
    assert "Traceback" not in err and "CRASHED" not in err, err[-3000:]
    line, url = errors[0], f"s3://{BUCKET}/{PREFIX}"
    chunk = line.split(f"{url}/train/", 1)[1].split(":", 1)[0]
    assert line.startswith(f"error: data.data_dir: {url}/train/chunk-") and chunk not in cached, line  # downloaded
    if fault == "server stopped":
        assert ": downloading failed 2 times, the last with EndpointConnectionError: " in line, line
        assert line.endswith(f"(endpoint {own.endpoint}); check that the endpoint is up and reachable (AWS_ENDPOINT_URL "
                             "or data.storage_options endpoint_url); a fit stopped by this resumes with --ckpt_path "
                             "last once it is back"), line
    else:  # the folder's prepare command (not the split's), and how the fit goes on
        size = (own.local / "train" / chunk).stat().st_size
        assert line.startswith(f"error: data.data_dir: {url}/train/{chunk}: missing: index.json lists this chunk "
                               f"({size} bytes) but the bucket no longer has it (deleted after the run started); "
                               "prepare that folder again: python -m scalevec_lit prepare --input "), line
        assert f" --output {url} " in line and line.endswith(
            "--overwrite (a chunk cannot be repaired alone); a fit stopped by this resumes with --ckpt_path last once "
            "the folder is prepared again from the same input"), line
    print(f"{fault}: {line}\n  ended {took:.1f} s after the fault")
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step000006.ckpt"]  # complete; no lock, no .tmp
    verify_checkpoint(ckpts / "step000006.ckpt", full=True)
