"""A remote ``data.data_dir``'s ``meta.json``, read where it lies by the commands that need only its record
(``scalevec_lit/data/prepared_meta.py``): ``fit --print_plan`` plans with the data's vocabulary
(``lit/plan_count.py``), and ``export`` of a checkpoint older than the tokenizer record finds the tokenizer
through its run's ``config.yaml`` (``export/tokenizer.py``). Against the real S3 server on 127.0.0.1
(``tests/s3_server.py``, the embedded corpus prepared into ``s3://corpus/shakespeare``)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import SMOKE, main_in_process
from s3_server import BUCKET, free_port, session_server

import scalevec_lit.cli  # noqa: F401  (Lightning's log handlers bind to the session's stderr, not to one test's capture)

pytestmark = pytest.mark.slow  # a server process and two prepares per session


@pytest.fixture()
def s3(request, tmp_path_factory):
    return session_server(request, tmp_path_factory)


def _plan(capfd, data_dir, options: dict) -> tuple[int, str]:
    return main_in_process(capfd, ["fit", "--config", SMOKE, "--data.data_dir", str(data_dir),
                                   "--data.storage_options", json.dumps(options), "--print_plan"])


def _upload_meta(s3, prefix: str, **changes) -> str:
    """``s3://corpus/<prefix>`` holding the session's ``meta.json`` with ``changes``; its URL."""
    s3.client().put_object(Bucket=BUCKET, Key=f"{prefix}/meta.json", Body=json.dumps({**s3.meta, **changes}))
    return f"s3://{BUCKET}/{prefix}"


def _line(text: str, start: str) -> str:
    (line,) = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(start)]
    return line


# -- fit --print_plan --------------------------------------------------------------------------------------------
def test_plan_reads_the_vocabulary_of_a_remote_folder_as_of_its_local_copy(s3, capfd):
    code, text = _plan(capfd, s3.url, s3.options)
    assert code == 0, text
    vocab = s3.meta["vocab_size"]
    assert vocab != 32000
    model = _line(text, "model ")
    assert model.endswith(f"vocab {vocab:,} (from {s3.url}/meta.json)"), model
    code, local = _plan(capfd, s3.local, {})
    assert code == 0, local
    assert _line(local, "model ") == model.replace(f"{s3.url}/meta.json", str(s3.local / "meta.json"))
    for row in ("parameters ", "FLOPs ", "total "):  # every count follows the vocabulary
        assert _line(text, row) == _line(local, row)


def test_plan_says_in_one_line_why_a_remote_meta_json_could_not_be_read(s3, capfd):
    down = {"endpoint_url": f"http://127.0.0.1:{free_port()}", "aws_access_key_id": "x",
            "aws_secret_access_key": "y", "region_name": "us-east-1", "retry_wait": 0.01}
    code, text = _plan(capfd, s3.url, down)
    assert code == 0, text
    assert _line(text, "model ").endswith("vocab 32,000 (assumed: data.data_dir could not be read, see the note)")
    note = _line(text, "note: data.data_dir")
    assert re.fullmatch(
        rf"note: data\.data_dir: {s3.url}: {s3.url}/meta\.json could not be read, so the vocabulary is assumed "
        r"\(reading failed 2 times, the last with EndpointConnectionError: .+ \(endpoint http://127\.0\.0\.1:\d+\)\); "
        r"set --model\.config\.vocab_size to the data's vocabulary to plan with it, or check that the endpoint is up "
        r"and reachable \(AWS_ENDPOINT_URL or data\.storage_options endpoint_url\)", note), note

    code, text = _plan(capfd, s3.url, {**s3.options, "aws_secret_access_key": "wrong"})
    assert code == 0, text
    note = _line(text, "note: data.data_dir")
    assert f"{s3.url}/meta.json could not be read, so the vocabulary is assumed (reading: the endpoint " in note
    assert "refused the credentials (SignatureDoesNotMatch)); set --model.config.vocab_size" in note
    assert note.endswith("or data.storage_options {aws_access_key_id: ..., aws_secret_access_key: ...}")


def test_plan_of_a_prefix_without_meta_json_says_so(s3, capfd):
    code, text = _plan(capfd, f"s3://{BUCKET}/not-prepared", s3.options)
    assert code == 0, text
    assert _line(text, "model ").endswith(
        f"vocab 32,000 (assumed: no prepared data at data.data_dir (s3://{BUCKET}/not-prepared): no "
        f"s3://{BUCKET}/not-prepared/meta.json; set --model.config.vocab_size to plan another)")
    assert "note: data.data_dir" not in text


# -- export of a checkpoint older than the tokenizer record -------------------------------------------------------
def _run(tmp_path: Path, url: str, options: dict) -> Path:
    """A run folder as LightningCLI saved it (``config.yaml`` beside ``checkpoints/``); its checkpoint path."""
    import yaml

    (tmp_path / "checkpoints").mkdir(parents=True)
    data = {"class_path": "scalevec_lit.data.TokenDataModule", "init_args": {"data_dir": url, "storage_options": options}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    return tmp_path / "checkpoints" / "last.ckpt"


def test_export_finds_the_tokenizer_through_a_remote_meta_json(s3, tmp_path):
    from scalevec_lit.export import find_tokenizer

    path, note = find_tokenizer(_run(tmp_path, s3.url, s3.options))
    assert path == Path(s3.meta["tokenizer"])  # the prepare of this session ran on this machine
    assert note == f"the tokenizer {s3.url}/meta.json was prepared with (data.data_dir of {tmp_path / 'config.yaml'})"


def test_export_refuses_a_tokenizer_a_remote_meta_json_names_that_is_not_here(s3, tmp_path):
    from scalevec_lit.export import ExportError, find_tokenizer

    url = _upload_meta(s3, "meta-gone-tokenizer", tokenizer="/the/preparing/machine/tokenizer.json")
    with pytest.raises(ExportError) as err:
        find_tokenizer(_run(tmp_path, url, s3.options))
    assert str(err.value) == (f"the run's data ({url}/meta.json) was prepared with the tokenizer "
                              "'/the/preparing/machine/tokenizer.json', a path on the machine that prepared it, which "
                              "is not on this one; pass --tokenizer <tokenizer.json>")


def test_export_refuses_another_tokenizer_under_the_path_a_remote_meta_json_names(s3, tmp_path):
    from scalevec_lit.export import ExportError, find_tokenizer

    url = _upload_meta(s3, "meta-other-tokenizer", tokenizer_content="0" * 16, tokenizer_sha256="1" * 16)
    with pytest.raises(ExportError, match=rf"^the run's data \({re.escape(url)}/meta\.json\) was prepared with the "
                                          r"tokenizer .*content 0000.*, but '.+tokenizer\.json' here is another one "
                                          r"\(.+\); pass --tokenizer <a copy of the tokenizer\.json"):
        find_tokenizer(_run(tmp_path, url, s3.options))


def test_export_refuses_when_a_remote_meta_json_cannot_be_read(s3, tmp_path):
    from scalevec_lit.errors import RunError
    from scalevec_lit.export import find_tokenizer

    down = {"endpoint_url": f"http://127.0.0.1:{free_port()}", "aws_access_key_id": "x",
            "aws_secret_access_key": "y", "region_name": "us-east-1", "retries": 1}
    ckpt = _run(tmp_path, s3.url, down)
    with pytest.raises(RunError) as err:
        find_tokenizer(ckpt)
    text = str(err.value)
    assert text.startswith(f"data.data_dir of {tmp_path / 'config.yaml'}: {s3.url}/meta.json: reading failed 1 "
                           "times, the last with EndpointConnectionError"), text
    assert text.endswith("; pass --tokenizer <the tokenizer.json the data was prepared with>, or check that the "
                         "endpoint is up and reachable (AWS_ENDPOINT_URL or data.storage_options endpoint_url)"), text
