"""Bad input to ``prepare``: what it will and will not touch, undecodable and binary files, bad options. Each
case asserts the exit code, the one-paragraph message, no traceback, and unchanged files outside the output
(helpers and the ``world`` fixture from ``test_bad_input.py``)."""
from __future__ import annotations

import json
from pathlib import Path

from helpers import SMOKE, check


# -- prepare ----------------------------------------------------------------------------------------------
def _texts(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"t{i}.txt").write_text("\n\n".join(f"Line {j} of text {i}, with words." for j in range(80)))
    return folder


def prep(world, *args) -> list:
    return ["prepare", "--num-workers", "1", "--segment-chars", "200", "--val-fraction", "0.3", *map(str, args)]


def test_prepare_output_equal_to_input(world, capfd):
    texts = _texts(world.path / "texts")
    check(world, capfd, prep(world, "--input", texts, "--output", texts), 2, "--output:", "is the input",
          "outside the input")


def test_prepare_output_inside_input(world, capfd):
    texts = _texts(world.path / "texts")
    check(world, capfd, prep(world, "--input", texts, "--output", texts / "prepared"), 2, "is inside the input")
    assert not (texts / "prepared").exists()


def test_prepare_output_holding_the_users_files(world, capfd):
    texts = _texts(world.path / "texts")
    mine = world.path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("my thesis")
    check(world, capfd, prep(world, "--input", texts, "--output", mine), 2, "holds files that prepare did not write",
          "thesis.tex")


def test_prepare_overwrite_removes_only_its_own_files(world, capfd):
    texts = _texts(world.path / "texts")
    out = world.path / "out" / "prep"
    check(world, capfd, prep(world, "--input", texts, "--output", out), 0, "prepared")
    (out / "README.txt").write_text("the user's notes")
    check(world, capfd, prep(world, "--input", texts, "--output", out), 2, "already holds prepared data",
          "--overwrite")
    check(world, capfd, prep(world, "--input", texts, "--output", out, "--overwrite"), 0, "prepared")
    assert (out / "README.txt").read_text() == "the user's notes"


def test_prepare_skips_and_lists_undecodable_and_binary_files(world, capfd):
    texts = _texts(world.path / "texts")
    (texts / "latin.txt").write_bytes("Caf\u00e9 cr\u00e8me, na\u00efve fa\u00e7ade.\n".encode("latin-1") * 50)
    (texts / "image.txt").write_bytes(bytes(range(256)) * 40)
    out = world.path / "out" / "prep"
    text = check(world, capfd, prep(world, "--input", texts, "--output", out), 0,
                 "read 3 of 5 text file(s)", "skipped 1 binary file(s): image.txt",
                 "not valid text in the encoding: latin.txt (200 bad bytes)")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["files"] == 3 and len(meta["skipped"]["binary"]) == 1 and len(meta["skipped"]["undecodable"]) == 1
    assert "\ufffd" not in text


def test_prepare_strict_stops_on_an_undecodable_file(world, capfd):
    texts = _texts(world.path / "texts")
    (texts / "latin.txt").write_bytes("na\u00efve\n".encode("latin-1") * 10)
    check(world, capfd, prep(world, "--input", texts, "--output", world.path / "out" / "p", "--errors", "strict"), 2,
          "latin.txt", "10 bytes are not valid utf-8", "--encoding")


def test_prepare_unknown_encoding(world, capfd):
    texts = _texts(world.path / "texts")
    check(world, capfd, prep(world, "--input", texts, "--output", world.path / "out" / "p", "--encoding", "klingon"),
          2, "--encoding: 'klingon': unknown encoding")


def test_prepare_only_binary_files(world, capfd):
    folder = world.path / "bins"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"\x00\x01" * 500)
    check(world, capfd, prep(world, "--input", folder, "--output", world.path / "out" / "p"), 2,
          "none of its 1 file(s) is readable text", "binary")


def test_prepare_bad_val_fraction(world, capfd):
    texts = _texts(world.path / "texts")
    check(world, capfd, prep(world, "--input", texts, "--output", world.path / "out" / "p", "--val-fraction", "1.5"),
          2, "--val-fraction: 1.5: must be between 0 and 1")


def test_prepare_missing_input(world, capfd):
    check(world, capfd, prep(world, "--input", world.path / "nowhere", "--output", world.path / "out" / "p"), 2,
          "--input:", "nowhere", "is not a folder")


def test_prepare_tokenizer_that_is_not_json(world, capfd):
    texts = _texts(world.path / "texts")
    bad = world.path / "tok.json"
    bad.write_text("{not json")
    check(world, capfd, prep(world, "--input", texts, "--output", world.path / "out" / "p", "--tokenizer", bad), 2,
          "--tokenizer:", "tok.json", "could not be read")


# -- row formats through the command line -------------------------------------------------------------------
def test_prepare_reads_parquet_and_jsonl_with_a_text_field_and_reports_bad_rows(world, capfd):
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards = world.path / "shards"
    shards.mkdir()
    docs = [f"Document {i}: " + " ".join(f"word{(i * j) % 97}" for j in range(60)) for i in range(30)]
    pq.write_table(pa.table({"content": docs[:20], "n": list(range(20))}), shards / "part-0.parquet")
    (shards / "part-1.jsonl").write_text("".join(json.dumps({"content": d}) + "\n" for d in docs[20:])
                                         + '{"content": 3}\n{"body": "x"}\n')
    out = world.path / "out" / "prep"
    check(world, capfd, prep(world, "--input", shards, "--output", out, "--text-field", "content"), 0,
          "read 1 JSON Lines file(s) (10 rows), 1 parquet file(s) (20 rows)",
          "2 of 32 rows skipped (no usable text in 'content'), in 1 file(s):",
          "part-1.jsonl: skipped 2 of 12 rows: 1 without the field 'content', 1 where it is not a string (number: 1) "
          "(first: line 11)", "prepared")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["rows"] == {"read": 30, "skipped": 2} and meta["text_field"] == "content"


def test_prepare_wrong_text_field(world, capfd):
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards = world.path / "shards"
    shards.mkdir()
    pq.write_table(pa.table({"content": ["a b c"], "n": [1]}), shards / "part-0.parquet")
    check(world, capfd, prep(world, "--input", str(shards / "*.parquet"), "--output", world.path / "out" / "p"), 2,
          "--text-field: 'text':", "part-0.parquet has no such column", "its columns are: content (string), n (int64)",
          "choose one with --text-field")
    assert not (world.path / "out" / "p").exists()


# -- the embedded default prepares itself; any other folder names the prepare command ----------------------
def _fresh_fit(world, *extra) -> list:
    root = world.path / "out" / "runs"
    return ["fit", "--config", SMOKE, "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.save_dir={root}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", *extra]


def test_fit_smoke_prepares_the_embedded_corpus_itself(world, capfd, monkeypatch, prepared_data):
    fresh = world.path / "out" / "checkout"
    fresh.mkdir(parents=True)
    monkeypatch.chdir(fresh)
    text = check(world, capfd, _fresh_fit(world), 0,
                 "data.data_dir: data/prepared/shakespeare is not prepared yet: preparing the embedded Shakespeare corpus")
    assert sum("preparing the embedded" in line for line in text.splitlines()) == 1
    meta = json.loads((fresh / "data/prepared/shakespeare/meta.json").read_text())
    assert meta["tokens"] == json.loads((prepared_data / "meta.json").read_text())["tokens"]
    assert (world.path / "out" / "runs" / "smoke" / "version_0").is_dir()  # and it trained


def test_fit_with_another_missing_folder_names_the_prepare_command(world, capfd, monkeypatch):
    fresh = world.path / "out" / "checkout"
    fresh.mkdir(parents=True)
    monkeypatch.chdir(fresh)
    check(world, capfd, _fresh_fit(world, "--data.data_dir=data/prepared/mine"), 2,
          "data.data_dir: 'data/prepared/mine' does not exist",
          "run `python -m scalevec_lit prepare --input <text folder> --output data/prepared/mine`")
    assert not (fresh / "data").exists()
