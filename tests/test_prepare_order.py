"""``prepare`` is reproducible: the same inputs give the same token stream, whatever the number of workers.

litdata's ``optimize`` (since about 0.2.6x, ``keep_data_ordered=None``) hands the inputs to its workers from one
shared queue, in whatever order they ask: two preparations of the same corpus then differed in chunk contents,
and a run (or a study's seed) trained on another stream each time its data was prepared again. ``prepare`` asks
for the ordered mode: each worker takes a contiguous slice of the inputs, in order, so the stream read back in
index order is the one a single worker writes, and the chunks are the same at every preparation.
"""
from __future__ import annotations

from pathlib import Path

from scalevec_lit.data.prepare import prepare
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER
from test_prepare_heldout import _folder, _read


def test_prepare_gives_the_same_stream_with_one_or_two_workers_and_the_same_chunks_each_time(tmp_path):
    src = _folder(tmp_path / "texts", "gamma", 12, 20)
    kw = dict(val_fraction=0.2, segment_chars=200, chunk_tokens=256)
    one = prepare(src, DEFAULT_TOKENIZER, tmp_path / "one", num_workers=1, **kw)
    two = [prepare(src, DEFAULT_TOKENIZER, tmp_path / f"two{i}", num_workers=2, **kw) for i in range(2)]
    assert two[0]["chunks"] == two[1]["chunks"]  # the same files, bytes and checksums
    assert {c["name"].split("-")[1] for c in two[0]["chunks"]["train"]} == {"0", "1"}  # both workers wrote
    for split in ("train", "val"):
        assert _read(tmp_path / "two0" / split) == _read(tmp_path / "one" / split)
    assert two[0]["tokens"] == one["tokens"]
