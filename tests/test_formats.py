"""prepare's row formats: JSON Lines (plain, gzip), parquet, a save_to_disk folder; folders, files and globs
mixed; the tokens equal those of the same texts as .txt files; bad rows counted exactly; a wrong
--text-field named with the file and the fields it has."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from scalevec_lit.data.formats import RowCounts, iter_documents, plan_units, resolve_inputs
from scalevec_lit.data.prepare import is_val, prepare
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer

VAL = 0.3


def _texts(n: int = 40) -> list[str]:
    words = ["thou", "art", "caf\u00e9", "na\u00efve", "\u00fcber", "sea", "moon", "\u2014", "rose", "\U0001F600"]
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(5 + i % 13))
            + ("\n\nA second paragraph, number %d." % i if i % 3 == 0 else "") for i in range(n)]


def _save_to_disk_layout(folder: Path, texts: list[str], shards: int = 2) -> Path:
    """The folder ``datasets.Dataset.save_to_disk`` writes: Arrow IPC stream files, state.json, dataset_info.json."""
    folder.mkdir(parents=True)
    per = -(-len(texts) // shards)
    names = []
    for s in range(shards):
        name = f"data-{s:05d}-of-{shards:05d}.arrow"
        table = pa.table({"id": list(range(s * per, min(len(texts), (s + 1) * per))), "text": texts[s * per:(s + 1) * per]})
        with pa.OSFile(str(folder / name), "wb") as fh, pa.ipc.new_stream(fh, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=4):
                writer.write_batch(batch)
        names.append(name)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                   "_fingerprint": "0", "_format_type": None, "_split": "train"}))
    (folder / "dataset_info.json").write_text(json.dumps(
        {"features": {"id": {"dtype": "int64", "_type": "Value"}, "text": {"dtype": "string", "_type": "Value"}}}))
    return folder


@pytest.fixture()
def row_inputs(tmp_path):
    """40 texts spread over a JSON Lines file with bad rows, a gzip JSON Lines file (found by a glob), a
    parquet file (4 row groups, one null) and a saved dataset; the same 40 texts as .txt files."""
    texts = _texts()
    rows = tmp_path / "rows"
    (rows / "gz").mkdir(parents=True)
    lines = [json.dumps({"id": i, "text": t}) for i, t in enumerate(texts[:10])]
    bad = ['{"id": 100}', '{"text": null}', '{"text": 7}', '{"text": ["a"]}', "{not json", "[1, 2]",
           '{"text": "   "}', '{"text": false}']
    for k, line in enumerate(bad):
        lines.insert(2 + 2 * k, line)
    lines.insert(5, "")  # a blank line is no row
    (rows / "a.jsonl").write_text("\n".join(lines) + "\n")
    with gzip.open(rows / "gz" / "b.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps({"text": t, "meta": {"n": i}}) + "\n" for i, t in enumerate(texts[10:20])))
    pq.write_table(pa.table({"url": [f"u{i}" for i in range(11)], "text": texts[20:25] + [None] + texts[25:30]}),
                   rows / "c.parquet", row_group_size=3)
    _save_to_disk_layout(rows / "saved", texts[30:])
    txt = tmp_path / "txt"
    txt.mkdir()
    for i, t in enumerate(texts):
        (txt / f"{i:02d}.txt").write_text(t)
    return rows, txt, texts


def _read_all(data_dir: Path, split: str) -> list[int]:
    from litdata import StreamingDataset, TokensLoader

    ds = StreamingDataset(str(data_dir / split), item_loader=TokensLoader(block_size=1), shuffle=False)
    return torch.cat([ds[i] for i in range(len(ds))]).tolist()


def _row_docs(rows: Path) -> list[tuple[str, int, str]]:
    """(rel, row index, text) of every usable row, as prepare names them."""
    out = []
    for i, line in enumerate((rows / "a.jsonl").read_text().splitlines()):
        obj = json.loads(line) if line.startswith("{\"") else None
        if isinstance(obj, dict) and isinstance(obj.get("text"), str) and obj["text"].strip():
            out.append(("a.jsonl", i, obj["text"]))
    with gzip.open(rows / "gz" / "b.jsonl.gz", "rt") as fh:
        out += [("b.jsonl.gz", i, json.loads(line)["text"]) for i, line in enumerate(fh)]
    col = pq.read_table(rows / "c.parquet").column("text").to_pylist()
    out += [("c.parquet", i, t) for i, t in enumerate(col) if t is not None]
    for s in range(2):
        name = f"data-{s:05d}-of-00002.arrow"
        with pa.OSFile(str(rows / "saved" / name)) as fh:
            col = pa.ipc.open_stream(fh).read_all().column("text").to_pylist()
        out += [(f"saved/{name}", i, t) for i, t in enumerate(col)]
    return out


def test_row_formats_give_the_tokens_of_the_same_texts_as_txt(row_inputs, tmp_path):
    rows, txt, texts = row_inputs
    tok = Tokenizer(DEFAULT_TOKENIZER)
    inputs = [rows / "a.jsonl", str(rows / "gz" / "*.jsonl.gz"), rows / "c.parquet", rows / "saved"]
    meta = prepare(inputs, DEFAULT_TOKENIZER, tmp_path / "from_rows", val_fraction=VAL, chunk_tokens=256, num_workers=1)
    ref = prepare(txt, DEFAULT_TOKENIZER, tmp_path / "from_txt", val_fraction=VAL, chunk_tokens=256, num_workers=1)

    docs = _row_docs(rows)
    assert sorted(t for _, _, t in docs) == sorted(texts)  # the reference reading finds the 40 texts
    for split in ("train", "val"):  # each row is one document, in the split its (file, row) hash says
        expected = [t for rel, i, text in docs if is_val(rel, i, VAL) == (split == "val") for t in tok.encode(text)]
        got = _read_all(tmp_path / "from_rows", split)
        assert sorted(got) == sorted(expected) and meta["tokens"][split] == len(expected) > 0
    # the same texts as .txt files (one segment each): the same tokens, train and val together
    from_rows = _read_all(tmp_path / "from_rows", "train") + _read_all(tmp_path / "from_rows", "val")
    from_txt = _read_all(tmp_path / "from_txt", "train") + _read_all(tmp_path / "from_txt", "val")
    assert sorted(from_rows) == sorted(from_txt) == sorted(t for text in texts for t in tok.encode(text))
    assert ref["rows"] is None and meta["formats"] == {"jsonl": 2, "parquet": 1, "arrow": 2}

    # bad rows: counted exactly, per file, never silently dropped
    assert meta["rows"] == {"read": 40, "skipped": 9}
    a = RowCounts.from_json(meta["skipped"]["rows"]["a.jsonl"])
    assert (a.rows, a.missing, a.null, a.invalid, a.empty) == (10, 1, 1, 2, 1)
    assert a.not_string == {"number": 1, "array": 1, "boolean": 1} and a.first_bad == [2, "missing"]
    c = RowCounts.from_json(meta["skipped"]["rows"]["c.parquet"])
    assert (c.rows, c.null, c.bad, c.first_bad) == (10, 1, 1, [5, "null"])
    assert set(meta["skipped"]["rows"]) == {"a.jsonl", "c.parquet"}
    summary = "\n".join(meta["summary"])
    assert "read 2 JSON Lines file(s) (20 rows), 1 parquet file(s) (10 rows), 2 arrow file(s) of 1 saved dataset(s) (10 rows)" in summary
    assert ("a.jsonl: skipped 8 of 18 rows: 1 without the field 'text', 1 where it is null, 3 where it is not a "
            "string (array: 1, boolean: 1, number: 1), 1 where it is empty or only whitespace, 2 line(s) that are not "
            "a JSON object (first: line 3)") in summary
    assert "c.parquet: skipped 1 of 11 rows: 1 where it is null (first: row 5)" in summary
    assert "9 of 49 rows skipped (no usable text in 'text'), in 2 file(s):" in summary


def test_parquet_row_groups_become_units_with_their_row_offsets(row_inputs):
    rows, _, texts = row_inputs
    found = resolve_inputs([rows / "c.parquet"])
    units = plan_units(found.sources, "text", unit_bytes=1)  # every row group its own unit
    assert [(u["groups"], u["row0"]) for u in units] == [([0], 0), ([1], 3), ([2], 6), ([3], 9)]
    counts, got = RowCounts(), []
    for unit in units:  # the units together read every row once, in order, with its global index
        seen = []
        got += list(iter_documents(unit, "text", lambda r: seen.append(r) or True, counts))
        assert seen == list(range(unit["row0"], unit["row0"] + (3 if unit["row0"] < 9 else 2)))
    assert got == texts[20:30] and (counts.rows, counts.null) == (10, 1)


def test_inputs_mix_folders_files_and_globs(row_inputs, tmp_path):
    rows, txt, _ = row_inputs
    (rows / "notes.csv").write_text("a,b\n")
    found = resolve_inputs([rows, str(txt / "0*.txt"), txt / "10.txt", rows / "a.jsonl"])
    kinds = [(s.rel, s.kind) for s in found.sources]
    assert kinds[:6] == [("a.jsonl", "jsonl"), ("c.parquet", "parquet"), ("gz/b.jsonl.gz", "jsonl"),
                         ("saved/data-00000-of-00002.arrow", "arrow"), ("saved/data-00001-of-00002.arrow", "arrow"),
                         ("00.txt", "text")]
    assert len(kinds) == 5 + 10 + 1  # a.jsonl given twice is read once; 00..09 by the glob, 10.txt by name
    assert found.datasets == [rows / "saved"] and found.ignored == [rows / "notes.csv"]
    with pytest.raises(FileNotFoundError, match=r"--input: '.*nomatch\*.jsonl': the pattern matches no file"):
        resolve_inputs([str(tmp_path / "nomatch*.jsonl")])
    with pytest.raises(ValueError, match=r"--input: '.*notes.csv': not a format prepare reads; give .*parquet"):
        resolve_inputs([rows / "notes.csv"])


def test_wrong_text_field_names_the_field_the_file_and_the_fields_it_has(row_inputs, tmp_path):
    rows, _, _ = row_inputs
    cases = [
        (rows / "gz" / "b.jsonl.gz", r"--text-field: 'content': .*b.jsonl.gz has no such field in its first 10 JSON "
                                     r"object\(s\); their fields are: text, meta; choose one with --text-field"),
        (rows / "c.parquet", r"--text-field: 'content': .*c.parquet has no such column; its columns are: url \(string\), "
                             r"text \(string\); choose one"),
        (rows / "saved", r"--text-field: 'content': .*data-00000-of-00002.arrow has no such column; its columns are: "
                         r"id \(int64\), text \(string\)"),
    ]
    for source, message in cases:
        with pytest.raises(ValueError, match=message):
            prepare(source, DEFAULT_TOKENIZER, tmp_path / "out", text_field="content")
    with pytest.raises(ValueError, match=r"--text-field: 'id': the column of .*data-00000-of-00002.arrow holds int64, not text"):
        prepare(rows / "saved", DEFAULT_TOKENIZER, tmp_path / "out", text_field="id")
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_truncated_gzip_is_reported_and_its_earlier_lines_kept(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("".join(json.dumps({"text": f"document {i}: " + " ".join(str(i * j % 9973) for j in range(300))}) + "\n"
                         for i in range(200)))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    counts = RowCounts()
    unit = {"kind": "jsonl", "path": str(path), "rel": "t.jsonl.gz"}
    docs = list(iter_documents(unit, "text", lambda r: True, counts))
    assert 0 < len(docs) == counts.rows < 200 and docs[-1].startswith(f"document {len(docs) - 1}: ")
    assert counts.error.startswith(f"the file could not be read after line {len(docs) + counts.invalid}")
    assert "could not be read" in counts.describe("t.jsonl.gz", "text", "jsonl")
