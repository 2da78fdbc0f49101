"""Remote data against a real S3-compatible server on 127.0.0.1 (moto's standalone server, started once for
this file: ``tests/s3_server.py``): prepare writes into the bucket, the data module reads the same blocks
from it as from the local folder, a fit runs from it with the standard AWS environment, and each bad case
(missing bucket or prefix, wrong credentials, the endpoint down, a chunk deleted or altered) stops with one
message naming the URL and the fix."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from s3_server import BUCKET, CHUNK_TOKENS, free_port, session_server

pytestmark = pytest.mark.slow  # a server process and two prepares per session


@pytest.fixture()
def s3(request, tmp_path_factory):
    return session_server(request, tmp_path_factory)


def _objects(server, prefix: str) -> dict[str, bytes]:
    c = server.client()
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])]
    return {k[len(prefix) + 1:]: c.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def _copy(server, src: str, dst: str) -> str:
    c = server.client()
    for rel in _objects(server, src):
        c.copy_object(Bucket=BUCKET, Key=f"{dst}/{rel}", CopySource={"Bucket": BUCKET, "Key": f"{src}/{rel}"})
    return f"s3://{BUCKET}/{dst}"


def _module(url, tmp_path, options, **kw):
    from scalevec_lit.data.datamodule import TokenDataModule

    return TokenDataModule(url, seq_len=32, batch_size=4, storage_options=options, cache_dir=str(tmp_path / "cache"),
                           **kw)


def _chunk_holding(split: Path, block: torch.Tensor) -> str:
    """The name of the one chunk file of ``split`` whose tokens hold ``block`` (the chunks store the tokens as
    the batches carry them)."""
    want = block.numpy().tobytes()
    found = [c.name for c in sorted(split.glob("*.bin")) if want in c.read_bytes()]
    assert len(found) == 1, found
    return found[0]


def _download_threads() -> set:
    import threading

    from litdata.streaming.reader import PrepareChunksThread

    return {t for t in threading.enumerate() if isinstance(t, PrepareChunksThread)}


def _error(fn) -> str:
    from scalevec_lit.errors import UserError

    with pytest.raises(UserError) as info:
        fn()
    return str(info.value)


def test_prepare_writes_into_the_bucket(s3):
    objects = _objects(s3, "shakespeare")
    local = {str(p.relative_to(s3.local)): p.read_bytes() for p in s3.local.rglob("*") if p.is_file()}
    chunks = sorted(k for k in local if k.endswith(".bin"))
    assert len(chunks) == len(s3.meta["chunks"]["train"]) + len(s3.meta["chunks"]["val"]) > 100 and sorted(k for k in objects if k.endswith(".bin")) == chunks
    for name in chunks:  # the same bytes as a local prepare
        assert objects[name] == local[name], name
    assert {"meta.json", "train/index.json", "val/index.json", ".scalevec_manifest.json", "tokenizer.json"} <= set(objects)
    assert s3.meta["tokens"] == {"train": 485838, "val": 26313}
    assert not (s3.cwd / "s3:").exists() and list(s3.cwd.iterdir()) == []


def test_prepare_refuses_a_prefix_it_does_not_own(s3, tmp_path):
    from scalevec_lit.data.prepare import prepare

    s3.client().put_object(Bucket=BUCKET, Key="theirs/notes.txt", Body=b"keep me")
    text = _error(lambda: prepare(output_dir=f"s3://{BUCKET}/theirs", storage_options=s3.options))
    assert text.startswith(f"--output: 's3://{BUCKET}/theirs': holds objects that prepare did not write (notes.txt)")
    assert _objects(s3, "theirs") == {"notes.txt": b"keep me"}
    text = _error(lambda: prepare(output_dir=s3.url, storage_options=s3.options))
    assert "it already holds prepared data; pass --overwrite" in text


def test_blocks_equal_the_local_folder(s3, tmp_path):
    """Through the bucket and the cache, the same batches in the same order as from the local folder."""
    remote, local = _module(s3.url, tmp_path, s3.options), _module(str(s3.local), tmp_path, None)
    assert remote.metas[0]["chunks"] == local.metas[0]["chunks"]
    for dm in (remote, local):
        dm.setup("fit")
    threads = _download_threads()
    got = list(itertools.islice(iter(remote.train_dataloader()), 6))
    want = list(itertools.islice(iter(local.train_dataloader()), 6))
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and len(got) == 6
    remote.teardown("fit")  # stops litdata's chunk threads (tests/test_data_threads.py): none outlives the server
    assert _download_threads() <= threads
    # litdata downloads the next chunks of the (shuffled) order in the background: which of them had arrived
    # depends on timing; the chunk the first block was read from had
    cached = remote._local[0]
    first = _chunk_holding(s3.local / "train", got[0][0])
    assert cached.parent == tmp_path / "cache" and (cached / "train" / first).is_file()
    for chunk in (cached / "train").glob("*.bin"):  # published only once complete: the local folder's bytes
        assert chunk.read_bytes() == (s3.local / "train" / chunk.name).read_bytes(), chunk.name
    assert list((cached / "train").glob("*.tmp.*")) == []  # no download left half done
    assert Path(remote.tokenizer_path) == cached / "tokenizer.json"
    val = next(iter(remote.val_dataloader()))
    assert torch.equal(val, next(iter(local.val_dataloader())))
    remote.teardown("fit")
    assert _download_threads() <= threads


def test_mixed_remote_and_local(s3, tmp_path):
    dm = _module([s3.url, str(s3.local)], tmp_path, s3.options, names=["remote", "local"])
    dm.setup("fit")
    assert dm.tokens["train"] == 2 * 485838
    assert next(iter(dm.train_dataloader())).shape == (4, 33)
    assert len(dm.val_dataloader()) == 2
    dm.teardown("fit")


@pytest.mark.parametrize("case", ["bucket", "prefix", "credentials", "endpoint", "scheme", "option", "size"])
def test_bad_remote_folder(s3, tmp_path, case):
    url, options = s3.url, dict(s3.options)
    if case == "bucket":
        url = "s3://no-such-bucket/shakespeare"
    elif case == "prefix":
        url = f"s3://{BUCKET}/no/such/prefix"
    elif case == "credentials":
        options["aws_secret_access_key"] = "wrong"
    elif case == "endpoint":
        options.update(endpoint_url=f"http://127.0.0.1:{free_port()}", retries=2, retry_wait=0.01)
    elif case == "scheme":
        url = "gs://corpus/shakespeare"
    elif case == "option":
        options["endpoint"] = "x"
    text = _error(lambda: _module(url, tmp_path, options, **({"cache_size": "lots"} if case == "size" else {})))
    want = {
        "bucket": (f"data.data_dir: {url}: the bucket 'no-such-bucket' does not exist at {s3.endpoint}; create it",),
        "prefix": (f"data.data_dir: {url}: holds nothing (no such prefix); prepare it: python -m scalevec_lit "
                   f"prepare --input <text> --output {url}",),
        "credentials": (f"data.data_dir: {url}: listing: the endpoint {s3.endpoint} refused the credentials "
                        "(SignatureDoesNotMatch); set the credentials", "data.storage_options"),
        "endpoint": (f"data.data_dir: {url}: listing failed 2 times, the last with EndpointConnectionError",
                     "check that the endpoint is up", "--ckpt_path last"),
        "scheme": (f"data.data_dir: {url}: gs:// is not supported", "endpoint_url: https://storage.googleapis.com"),
        "option": ("data.storage_options: endpoint: not a storage option; use any of endpoint_url",),
        "size": ("data.cache_size: 'lots': not a size; give bytes or a size with a unit, e.g. 50GB",),
    }[case]
    for part in want:
        assert part in text, (part, text)
    assert list((tmp_path / "cache").glob("*/train/*.bin")) == []


def test_a_deleted_chunk_stops_at_start(s3, tmp_path):
    url = _copy(s3, "shakespeare", "deleted")
    s3.client().delete_object(Bucket=BUCKET, Key="deleted/train/chunk-0-7.bin")
    text = _error(lambda: _module(url, tmp_path, s3.options).setup("fit"))
    size = next(c["bytes"] for c in s3.meta["chunks"]["train"] if c["name"] == "chunk-0-7.bin")
    assert text.startswith(f"{url}/train/chunk-0-7.bin: missing: index.json lists this chunk ({size} bytes) but the "
                           f"bucket has no such object; prepare that folder again: python -m scalevec_lit prepare")
    assert f"--output {url} --chunk-tokens {CHUNK_TOKENS} --overwrite" in text


def test_an_altered_or_vanished_chunk_stops_on_download(s3, tmp_path):
    """Same size, other bytes: found by the SHA-256 as the chunk arrives; deleted after the start: missing.
    Nothing corrupt is kept in the cache."""
    url = _copy(s3, "shakespeare", "altered")
    dm = _module(url, tmp_path, s3.options, shuffle=False)
    dm.setup("fit")
    chunk = "altered/train/chunk-0-0.bin"
    body = bytearray(s3.client().get_object(Bucket=BUCKET, Key=chunk)["Body"].read())
    body[100] ^= 0xFF
    s3.client().put_object(Bucket=BUCKET, Key=chunk, Body=bytes(body))
    text = _error(lambda: next(iter(dm.train_dataloader())))
    assert text.startswith(f"data.data_dir: {url}/train/chunk-0-0.bin: corrupt: the SHA-256 of the downloaded bytes "
                           "differs from the one prepare recorded in meta.json")
    assert not (dm._local[0] / "train" / "chunk-0-0.bin").exists()
    dm.teardown("fit")
    assert _module(url, tmp_path, s3.options, verify="sizes").setup("fit") is None  # sizes only: starts

    url = _copy(s3, "shakespeare", "vanished")
    dm = _module(url, tmp_path, s3.options, shuffle=False)
    dm.setup("fit")
    s3.client().delete_object(Bucket=BUCKET, Key="vanished/train/chunk-0-0.bin")
    text = _error(lambda: next(iter(dm.train_dataloader())))
    assert text.startswith(f"data.data_dir: {url}/train/chunk-0-0.bin: missing: index.json lists this chunk (")
    assert "but the bucket no longer has it (deleted after the run started); prepare that folder again: " in text
    assert f" --output {url} " in text, text
    dm.teardown("fit")


def test_cache_follows_a_new_prepare(s3, tmp_path):
    """A prefix prepared again (another meta.json) empties its cache folder before anything is read."""
    url = _copy(s3, "shakespeare", "renewed")
    dm = _module(url, tmp_path, s3.options, shuffle=False)
    dm.setup("fit")
    next(iter(dm.train_dataloader()))
    stale = dm._local[0] / "train" / "stale.bin"
    stale.write_bytes(b"x")
    s3.client().put_object(Bucket=BUCKET, Key="renewed/meta.json",
                           Body=_objects(s3, "renewed")["meta.json"].replace(b'"eos_id"', b'"eos_id" '))
    again = _module(url, tmp_path, s3.options, shuffle=False)
    assert again._local[0] == dm._local[0] and not stale.exists()
    dm.teardown("fit")


def test_other_commands_refuse_a_url_output(tmp_path, monkeypatch):
    """``export --out s3://...`` would have written the local folder ``s3:/...``: refused, nothing written."""
    from scalevec_lit.outdir import OutputFolder

    monkeypatch.chdir(tmp_path)
    text = _error(lambda: OutputFolder("s3://corpus/model", command="export", key="--out"))
    assert text == ("--out: 's3://corpus/model': a URL: export writes a local folder; write it to a local folder and "
                    "copy that to the bucket (only prepare --output takes an s3:// URL)")
    assert list(tmp_path.iterdir()) == []


def test_prepare_overwrites_its_own_prefix_only(s3, tmp_path):
    """--overwrite replaces an earlier prepare (its old chunks removed, another chunk size); an interrupted
    upload (a manifest, no meta.json) is prepared again without --overwrite."""
    from scalevec_lit.data.prepare import prepare

    text = tmp_path / "in" / "a.txt"
    text.parent.mkdir()
    text.write_text("\n\n".join(f"Paragraph {i}: " + "the quick brown fox jumps over the lazy dog. " * 20
                                for i in range(60)))
    url = f"s3://{BUCKET}/small"
    first = prepare(text.parent, output_dir=url, chunk_tokens=512, num_workers=1, storage_options=s3.options)
    before = {k for k in _objects(s3, "small") if k.endswith(".bin")}
    second = prepare(text.parent, output_dir=url, chunk_tokens=4096, num_workers=1, overwrite=True,
                     storage_options=s3.options)
    objects = _objects(s3, "small")
    after = {k for k in objects if k.endswith(".bin")}
    assert after == {f"{s}/{c['name']}" for s in ("train", "val") for c in second["chunks"][s]}
    assert len(before) > len(after) and first["tokens"] == second["tokens"]
    assert json.loads(objects["meta.json"])["chunk_tokens"] == 4096
    s3.client().delete_object(Bucket=BUCKET, Key="small/meta.json")  # as an upload cut short leaves it
    prepare(text.parent, output_dir=url, chunk_tokens=4096, num_workers=1, storage_options=s3.options)
    assert "meta.json" in _objects(s3, "small")
