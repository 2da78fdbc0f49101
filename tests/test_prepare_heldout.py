"""prepare_heldout: the validation split comes from other sources than the training split."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scalevec_lit.data.integrity import check_prepared
from scalevec_lit.data.prepare import prepare
from scalevec_lit.data.prepare_heldout import SET_ASIDE, main, prepare_heldout
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer


def _read(split_dir: Path) -> list[int]:
    from litdata import StreamingDataset, TokensLoader

    ds = StreamingDataset(str(split_dir), item_loader=TokensLoader(block_size=1), shuffle=False)
    return torch.cat([ds[i] for i in range(len(ds))]).tolist()


def _folder(root: Path, word: str, files: int, paragraphs: int) -> Path:
    root.mkdir()
    for f in range(files):
        text = "\n\n".join(f"The {word} paragraph {f} {i} tells of {word} things." for i in range(paragraphs))
        (root / f"{word}{f}.txt").write_text(text + "\n")
    return root


@pytest.fixture
def sources(tmp_path):
    return _folder(tmp_path / "train", "alpha", 3, 30), _folder(tmp_path / "val", "omega", 2, 80)


def test_val_split_is_the_sample_of_the_other_sources_and_train_holds_none_of_it(sources, tmp_path):
    train, val = sources
    out = tmp_path / "out"
    kw = dict(segment_chars=200, chunk_tokens=256, num_workers=1)
    meta = prepare_heldout([str(train)], [str(val)], str(DEFAULT_TOKENIZER), str(out), val_sample=0.3, **kw)
    # exactly what prepare makes of each side: train's train split, and val's val split at --val-sample
    ref_train = prepare(train, DEFAULT_TOKENIZER, tmp_path / "ref_train", SET_ASIDE, **kw)
    ref_val = prepare(val, DEFAULT_TOKENIZER, tmp_path / "ref_val", 0.3, **kw)
    assert _read(out / "train") == _read(tmp_path / "ref_train" / "train")
    assert _read(out / "val") == _read(tmp_path / "ref_val" / "val")
    assert meta["tokens"] == {"train": ref_train["tokens"]["train"], "val": ref_val["tokens"]["val"]}
    assert 0 < meta["tokens"]["val"] < ref_val["tokens"]["val"] + ref_val["tokens"]["train"]
    tok = Tokenizer(DEFAULT_TOKENIZER)
    train_text, val_text = tok.decode(_read(out / "train")), tok.decode(_read(out / "val"))
    assert "alpha" in train_text and "omega" not in train_text
    assert "omega" in val_text and "alpha" not in val_text
    on_disk = json.loads((out / "meta.json").read_text())
    assert on_disk["tokens"] == meta["tokens"] and on_disk["val_source"] == str(val.resolve())
    assert on_disk["heldout"]["unused_tokens"] == {"train_inputs": ref_train["tokens"]["val"],
                                                   "val_inputs": ref_val["tokens"]["train"]}
    assert check_prepared(str(out), on_disk, verify="checksums") == "checksums"  # the moved chunks are recorded


def test_refusals_name_the_option_and_the_value(sources, tmp_path):
    train, val = sources
    with pytest.raises(ValueError, match=r"--val: .*also given as --train; validation must come from other sources"):
        prepare_heldout([str(train), str(val)], [str(val)], str(DEFAULT_TOKENIZER), str(tmp_path / "o"))
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=rf"--val-sample: {bad}: must lie above 0 and at most 1 .*1 keeps all"):
            prepare_heldout([str(train)], [str(val)], str(DEFAULT_TOKENIZER), str(tmp_path / "o"), val_sample=bad)
    assert not (tmp_path / "o").exists()


def test_val_sample_1_keeps_all_of_the_validation_text(sources, tmp_path):
    """``--val-sample 1``: the val split is every token of the validation inputs (both splits of prepare's run)."""
    train, val = sources
    kw = dict(segment_chars=200, chunk_tokens=256, num_workers=1)
    meta = prepare_heldout([str(train)], [str(val)], str(DEFAULT_TOKENIZER), str(tmp_path / "o"), val_sample=1.0, **kw)
    ref = prepare(val, DEFAULT_TOKENIZER, tmp_path / "ref", SET_ASIDE, **kw)
    everything = _read(tmp_path / "ref" / "train") + _read(tmp_path / "ref" / "val")
    assert _read(tmp_path / "o" / "val") == everything
    assert meta["tokens"]["val"] == len(everything) == ref["tokens"]["train"] + ref["tokens"]["val"]
    on_disk = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert on_disk["heldout"]["val_sample"] == 1.0 and on_disk["heldout"]["unused_tokens"]["val_inputs"] == 0
    assert check_prepared(str(tmp_path / "o"), on_disk, verify="checksums") == "checksums"


def test_cli_prints_the_counts(sources, tmp_path, capsys):
    train, val = sources
    main(["--train", str(train), "--val", str(val), "--tokenizer", str(DEFAULT_TOKENIZER),
          "--output", str(tmp_path / "o"), "--val-sample", "0.3", "--num-workers", "1"])
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert (f"prepared {tmp_path / 'o'}: {meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val tokens "
            f"(val from {val.resolve()}), vocab {meta['vocab_size']}") in capsys.readouterr().out
