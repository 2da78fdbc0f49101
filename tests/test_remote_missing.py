"""A remote ``data.data_dir`` that is not there exits 2, as a local folder that does not exist does (missing
things are 2, docs/troubleshooting.md): a bucket that does not exist, a prefix that holds nothing, a prefix
without ``meta.json``. One line names the URL and the fix. Through the real command line, against the
S3-compatible server of ``tests/s3_server.py`` (no data prepared: nothing is read but the listing)."""
from __future__ import annotations

import pytest

from helpers import SMOKE, run_cli
from s3_server import S3Server

pytestmark = pytest.mark.slow  # a server process and two fit processes


@pytest.fixture(scope="module")
def server():
    s3 = S3Server().start()
    s3.client().create_bucket(Bucket="corpus")
    s3.client().put_object(Bucket="corpus", Key="half/notes.txt", Body=b"not prepared")
    yield s3
    s3.stop()


@pytest.mark.parametrize("url, line", [
    ("s3://nosuchbucket/x", "error: data.data_dir: s3://nosuchbucket/x: the bucket 'nosuchbucket' does not exist at "
     "{endpoint}; create it, or correct the bucket name or the endpoint (AWS_ENDPOINT_URL or data.storage_options "
     "endpoint_url)"),
    ("s3://corpus/no/such/prefix", "error: data.data_dir: s3://corpus/no/such/prefix: holds nothing (no such prefix); "
     "prepare it: python -m scalevec_lit prepare --input <text> --output s3://corpus/no/such/prefix, or correct the "
     "prefix"),
    ("s3://corpus/half", "error: data.data_dir: s3://corpus/half: holds 1 object(s) but no meta.json (not prepared "
     "there, or an interrupted prepare); prepare it: python -m scalevec_lit prepare --input <text> --output "
     "s3://corpus/half, or correct the prefix"),
], ids=["bucket", "prefix", "no-meta"])
def test_a_missing_remote_folder_exits_2_naming_the_url(server, tmp_path, url, line):
    res = run_cli(["fit", "--config", SMOKE, "--data.data_dir", url, "--trainer.max_steps=1",
                   f"--trainer.default_root_dir={tmp_path / 'run'}"], cwd=tmp_path,
                  env={**server.env, "SCALEVEC_CACHE_DIR": str(tmp_path / "cache")})
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert (res.returncode, errors) == (2, [line.format(endpoint=server.endpoint)]), res.stderr[-3000:]
    assert "Traceback" not in res.stderr
