"""``export`` of a checkpoint older than the tokenizer record, whose run read an ``s3://`` data folder prepared
on another machine: the tokenizer path its ``meta.json`` names is not here, but ``prepare`` uploaded a copy
beside it (``<url>/tokenizer.json``). Export ships that copy, checked by content against the record, through
the data cache the fit uses; without a copy it refuses as before (tests/test_remote_meta.py). A real S3 server
on 127.0.0.1 (tests/s3_server.py)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from s3_server import BUCKET, session_server

pytestmark = pytest.mark.slow  # a server process and two prepares per session

GONE = "/the/preparing/machine/tokenizer.json"


@pytest.fixture()
def s3(request, tmp_path_factory):
    return session_server(request, tmp_path_factory)


def _prefix(s3, name: str, tokenizer: bytes | None, **changes) -> str:
    """``s3://corpus/<name>``: the session's ``meta.json`` naming a tokenizer path not on this machine (and
    ``changes``), with ``tokenizer`` uploaded as its ``tokenizer.json`` copy; its URL."""
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key=f"{name}/meta.json", Body=json.dumps({**s3.meta, "tokenizer": GONE, **changes}))
    if tokenizer is not None:
        client.put_object(Bucket=BUCKET, Key=f"{name}/tokenizer.json", Body=tokenizer)
    return f"s3://{BUCKET}/{name}"


def _run(tmp_path: Path, url: str, options: dict) -> Path:
    import yaml

    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    data = {"class_path": "scalevec_lit.data.TokenDataModule",
            "init_args": {"data_dir": url, "storage_options": options, "cache_dir": str(tmp_path / "cache")}}
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    return tmp_path / "run" / "checkpoints" / "last.ckpt"


def test_export_ships_the_copy_prepare_uploaded(s3, tmp_path):
    from scalevec_lit.export import find_tokenizer

    real = Path(s3.meta["tokenizer"]).read_bytes()
    url = _prefix(s3, "copy-only", real)
    path, note = find_tokenizer(_run(tmp_path, url, s3.options))
    assert path.read_bytes() == real and path.is_relative_to(tmp_path / "cache")
    assert note == (f"the tokenizer {url}/meta.json was prepared with, from the copy prepare uploaded "
                    f"({url}/tokenizer.json; data.data_dir of {tmp_path / 'run' / 'config.yaml'})")


def test_export_refuses_a_copy_that_is_another_tokenizer(s3, tmp_path):
    from scalevec_lit.export import ExportError, find_tokenizer

    other = json.loads(Path(s3.meta["tokenizer"]).read_text())
    vocab = other["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # a valid tokenizer, two ids swapped: other ids for the same text
    url = _prefix(s3, "copy-other", json.dumps(other).encode())
    with pytest.raises(ExportError, match=rf"^the run's data \({re.escape(url)}/meta\.json\) was prepared with the "
                                          rf"tokenizer .*, but its copy {re.escape(url)}/tokenizer\.json is another "
                                          r"one \(.+\); pass --tokenizer <a copy of the tokenizer\.json"):
        find_tokenizer(_run(tmp_path, url, s3.options))


def test_without_a_copy_export_refuses_as_before(s3, tmp_path):
    from scalevec_lit.export import ExportError, find_tokenizer

    url = _prefix(s3, "no-copy", None)
    with pytest.raises(ExportError, match=r"a path on the machine that prepared it, which is not on this one; pass "
                                          r"--tokenizer <tokenizer\.json>$"):
        find_tokenizer(_run(tmp_path, url, s3.options))


def test_the_session_prepare_uploaded_a_copy(s3):
    body = s3.client().get_object(Bucket=BUCKET, Key=f"{s3.url.split(BUCKET + '/')[1]}/tokenizer.json")["Body"].read()
    assert hashlib.sha256(body).hexdigest() == hashlib.sha256(Path(s3.meta["tokenizer"]).read_bytes()).hexdigest()
