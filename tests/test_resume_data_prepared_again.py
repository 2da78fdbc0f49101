"""A checkpoint's data position belongs to the data it was saved on: resuming into the same folder (or the
same ``s3://`` URL) after it was prepared again with other data is refused with one line, since that
position would read other sequences (before, only a moved folder was compared, and the resume went on
silently); prepared again from the same inputs, it resumes exactly."""
from __future__ import annotations

import shutil

import pytest

from scalevec_lit.data.integrity import relocate_state
from scalevec_lit.data.prepare import prepare
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER
from scalevec_lit.errors import RunError
from test_data_integrity import _fit

pytestmark = pytest.mark.usefixtures("one_thread")

REFUSAL = ("the checkpoint continues a data position in this folder, which has been prepared again since: it holds "
           "other data (their chunk lists or checksums differ), so that position would read other sequences than "
           "the run's; give the data the checkpoint was trained on (prepare the same inputs again, into this folder "
           "or another), or start from its weights with a fresh data position: --model.init_from <checkpoint> "
           "instead of --ckpt_path")


def _prepare(text_dir, out, overwrite=False):
    prepare(text_dir, DEFAULT_TOKENIZER, out, num_workers=1, val_fraction=0.3, segment_chars=200, chunk_tokens=256,
            overwrite=overwrite)


def _texts(tmp_path, name, words):
    src = tmp_path / name
    src.mkdir()
    (src / "a.txt").write_text("\n\n".join(f"Paragraph {i} {words}." for i in range(300)))
    return src


def test_the_same_folder_prepared_again_resumes_only_with_the_same_data(tmp_path):
    first, other = _texts(tmp_path, "first", "of the text, with some words in it"), _texts(tmp_path, "other", "else")
    data = tmp_path / "data"
    _prepare(first, data)
    reference = _fit(str(data), 8, tmp_path / "a")
    _fit(str(data), 8, tmp_path / "b", save_at=4)
    ckpt = str(tmp_path / "b" / "s4.ckpt")
    _prepare(other, data, overwrite=True)
    with pytest.raises(RunError) as info:
        _fit(str(data), 8, tmp_path / "c", ckpt=ckpt)
    assert str(info.value) == f"data.data_dir: {data}: {REFUSAL}"
    _prepare(first, data, overwrite=True)  # the same inputs again: the same chunks and checksums
    assert _fit(str(data), 8, tmp_path / "d", ckpt=ckpt) == reference[4:]


def test_the_same_url_prepared_again_is_refused_and_the_same_data_follows_the_cache(tmp_path):
    cache = tmp_path / "cache"
    (cache / "train").mkdir(parents=True)
    state = {"dataset": {"input_dir_path": "/elsewhere/cache/train", "input_dir_url": "s3://corpus/mine/train/"}}
    saved = [{"dir": "s3://corpus/mine", "fingerprint": "a" * 64}]
    with pytest.raises(RunError) as info:
        relocate_state(state, ["s3://corpus/mine"], ["b" * 64], saved, [cache])
    assert str(info.value) == f"data.data_dir: s3://corpus/mine: {REFUSAL}"
    moved = relocate_state(state, ["s3://corpus/mine"], ["a" * 64], saved, [cache])
    assert moved["dataset"]["input_dir_path"] == str((cache / "train").resolve())
    shutil.rmtree(cache)
