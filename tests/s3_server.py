"""A real S3-compatible server on 127.0.0.1 for the tests: moto's standalone server (``moto_server``, from
``moto[server]`` in the ``test`` extra) as a subprocess on a free port, with credentials checked (an IAM
user made at start; ``INITIAL_NO_AUTH_ACTION_COUNT`` lets the first requests make it), so that wrong
credentials are refused as by a real endpoint. Used by ``tests/test_remote_data.py`` through the
session fixture ``s3`` there; ``S3Server`` also stops and restarts it (the endpoint down)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

#: requests the server answers without credentials: the three that make the IAM user and its key
_SETUP_REQUESTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _executable() -> str:
    here = Path(sys.executable).with_name("moto_server")
    return str(here) if here.exists() else (shutil.which("moto_server") or "moto_server")


class S3Server:
    """``moto_server -H 127.0.0.1 -p PORT``; ``env`` holds the endpoint and the valid credentials."""

    def __init__(self, port: Optional[int] = None) -> None:
        self._own_port = port is None  # chosen here: another may be chosen if this one is taken (see start)
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.key_id = self.secret = ""

    def start(self, timeout: float = 30.0, attempts: int = 3) -> "S3Server":
        """Start the server and make its user. A free port is free only until someone binds it: another test's
        listener (another xdist worker's) can take it first, so that the server cannot bind it while the
        readiness check connects to that other listener, and the first request then fails (seen once in CI:
        'Connection refused' at ``create_user``). With a port chosen here, such a start is retried on a new
        port; after ``attempts`` failures, or on a given port, the error is raised."""
        attempt = 1
        while True:
            try:
                self._launch(timeout)
                self._make_user()
                return self
            except Exception:
                self.stop()
                if not self._own_port or attempt == attempts:
                    raise
                attempt += 1
                self.port = free_port()
                self.endpoint = f"http://127.0.0.1:{self.port}"

    def _launch(self, timeout: float) -> None:
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_REQUESTS)}
        self.proc = subprocess.Popen([_executable(), "-H", "127.0.0.1", "-p", str(self.port)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on port {self.port}")
                time.sleep(0.1)

    def _make_user(self) -> None:
        import boto3

        from botocore.config import Config

        # bounded: a listener that is not this server (see start) may accept and never answer
        iam = boto3.client("iam", endpoint_url=self.endpoint, aws_access_key_id="setup",
                           aws_secret_access_key="setup", region_name="us-east-1",
                           config=Config(connect_timeout=5, read_timeout=15, retries={"max_attempts": 2}))
        iam.create_user(UserName="tests")
        key = iam.create_access_key(UserName="tests")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="tests", PolicyName="all", PolicyDocument=json.dumps(policy))
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS environment for this endpoint."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1"}

    @property
    def options(self) -> dict[str, str]:
        """The same as ``data.storage_options``."""
        return {"endpoint_url": self.endpoint, "aws_access_key_id": self.key_id,
                "aws_secret_access_key": self.secret, "region_name": "us-east-1"}

    def client(self):
        import boto3

        return boto3.client("s3", **self.options)


BUCKET, PREFIX = "corpus", "shakespeare"
#: tokens per chunk of the prepared test data: 119 train chunks, so that a run downloads chunks as it goes
CHUNK_TOKENS = 4096
_SESSION: Optional[S3Server] = None


def session_server(request, tmp_path_factory) -> S3Server:
    """One server per test session (per xdist worker), stopped at its end, with the embedded corpus prepared
    into ``s3://corpus/shakespeare`` by the ``prepare`` command line with only the AWS environment (``url``,
    ``meta``; ``cwd``: where it ran, which must stay empty) and the same prepared locally (``local``)."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    import pytest

    from scalevec_lit.data.prepare import main, prepare

    server = S3Server().start()
    request.config.add_cleanup(server.stop)
    server.client().create_bucket(Bucket=BUCKET)
    server.url = f"s3://{BUCKET}/{PREFIX}"
    server.cwd = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in server.env.items():
            mp.setenv(key, value)
        mp.chdir(server.cwd)  # nothing may be written here (pathlib turns s3://x into the local path s3:/x)
        main(["--output", server.url, "--chunk-tokens", str(CHUNK_TOKENS), "--num-workers", "1"])
    server.meta = json.loads(server.client().get_object(Bucket=BUCKET, Key=f"{PREFIX}/meta.json")["Body"].read())
    server.local = tmp_path_factory.mktemp("local") / PREFIX
    prepare(output_dir=server.local, num_workers=1, chunk_tokens=CHUNK_TOKENS)
    _SESSION = server
    return server
