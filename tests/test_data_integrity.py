"""Data integrity: the chunk record of meta.json checked at start, resume at the right position (also after the
prepared folder moved), and val tokens from CRLF text and text without blank lines."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch

from helpers import check, fit
from scalevec_lit.data.datamodule import TokenDataModule
from scalevec_lit.data.prepare import prepare
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer
from scalevec_lit.errors import RunError

pytestmark = pytest.mark.usefixtures("one_thread")


def _prepare_text(tmp: Path, name: str, text: str, **kw) -> Path:
    src = tmp / f"{name}-text"
    src.mkdir()
    (src / "a.txt").write_bytes(text.encode())
    out = tmp / name
    prepare(src, DEFAULT_TOKENIZER, out, num_workers=1, **{"val_fraction": 0.3, "segment_chars": 200,
                                                            "chunk_tokens": 256, **kw})
    return out


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A small prepared folder (several chunks per split, about 30 batches of 4 x 33 tokens per epoch)."""
    tmp = tmp_path_factory.mktemp("small")
    return _prepare_text(tmp, "small", "\n\n".join(f"Paragraph {i} of the text, with some words in it." for i in range(300)))


def _copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)
    return dest


# -- the chunk record, checked at start ---------------------------------------------------------------------
def test_prepare_records_every_chunk_with_size_and_sha256(small):
    meta = json.loads((small / "meta.json").read_text())
    assert meta["chunks"]["algorithm"] == "sha256"
    for split in ("train", "val"):
        listed = [c["filename"] for c in json.loads((small / split / "index.json").read_text())["chunks"]]
        assert len(listed) > 1
        assert meta["chunks"][split] == [
            {"name": n, "bytes": (small / split / n).stat().st_size,
             "sha256": hashlib.sha256((small / split / n).read_bytes()).hexdigest()} for n in listed]


def _damage(folder: Path, how: str) -> Path:
    chunk = folder / "train" / "chunk-0-1.bin"
    data = chunk.read_bytes()
    if how == "missing":
        chunk.unlink()
    elif how == "truncated":
        chunk.write_bytes(data[: len(data) // 2])
    elif how == "corrupt":  # same size, other bytes
        chunk.write_bytes(data[:100] + bytes(len(data) - 200) + data[-100:])
    return chunk


@pytest.mark.parametrize("how, verify, what", [
    ("missing", "auto", "missing: index.json lists this chunk"),
    ("truncated", "auto", "truncated: prepare wrote"),
    ("truncated", "sizes", "truncated: prepare wrote"),
    ("corrupt", "auto", "corrupt: its sha256 differs from the one prepare recorded"),
    ("corrupt", "checksums", "corrupt: its sha256 differs"),
])
def test_a_bad_chunk_stops_the_run_at_start_naming_it(small, tmp_path, how, verify, what):
    folder = _copy(small, tmp_path / "data")
    chunk = _damage(folder, how)
    dm = TokenDataModule(str(folder), seq_len=32, batch_size=4, verify=verify)
    with pytest.raises(RunError, match=r"^" + str(chunk).replace(".", r"\.") + r": .*" + what) as info:
        dm.setup("fit")
    assert info.value.exit_code == 1
    assert f"--output {folder}" in str(info.value) and "--overwrite" in str(info.value)
    assert f"--input {small.parent / 'small-text'}" in str(info.value)  # the command rebuilds it from its input


def test_a_corrupt_chunk_of_the_same_size_passes_a_sizes_only_check(small, tmp_path):
    folder = _copy(small, tmp_path / "data")
    _damage(folder, "corrupt")
    TokenDataModule(str(folder), seq_len=32, batch_size=4, verify="sizes").setup("fit")  # as documented


def test_a_folder_prepared_before_the_record_is_checked_by_index_sizes(small, tmp_path):
    folder = _copy(small, tmp_path / "data")
    meta = json.loads((folder / "meta.json").read_text())
    del meta["chunks"]
    (folder / "meta.json").write_text(json.dumps(meta))
    TokenDataModule(str(folder), seq_len=32, batch_size=4).setup("fit")
    with pytest.raises(RunError, match=r"data.verify: checksums: .*records no chunk checksums.*--data.verify=sizes"):
        TokenDataModule(str(folder), seq_len=32, batch_size=4, verify="checksums").setup("fit")
    chunk = _damage(folder, "truncated")
    with pytest.raises(RunError, match=str(chunk).replace(".", r"\.") + r": \d+ bytes: truncated: prepare wrote"):
        TokenDataModule(str(folder), seq_len=32, batch_size=4).setup("fit")


def test_index_and_meta_from_different_prepares_are_refused(small, tmp_path):
    folder = _copy(small, tmp_path / "data")
    meta = json.loads((folder / "meta.json").read_text())
    meta["tokens"]["val"] += 7
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(RunError, match=r"val/index.json: \d+ tokens: meta.json records \d+ val tokens"):
        TokenDataModule(str(folder), seq_len=32, batch_size=4).setup("fit")


def test_a_truncated_chunk_from_the_cli_is_one_paragraph_exit_1(world, capfd):
    folder = _copy(world.data, world.path / "data")
    chunk = _damage(folder, "truncated")
    check(world, capfd, fit(world, f"--data.data_dir={folder}"), 1, f"error: {chunk}: ", "truncated: prepare wrote",
          "--overwrite")


# -- val tokens from any text --------------------------------------------------------------------------------
def _tokens(folder: Path, split: str) -> list[int]:
    from litdata import StreamingDataset, TokensLoader

    ds = StreamingDataset(str(folder / split), item_loader=TokensLoader(block_size=1), shuffle=False)
    return [int(ds[i]) for i in range(len(ds))]


@pytest.mark.parametrize("kind", ["crlf", "no_blank_lines", "one_short_paragraph"])
def test_any_text_gives_val_tokens(tmp_path, kind):
    lines = [f"Line {i}: some words of a text, then more words." for i in range(400)]
    text = {"crlf": "\r\n\r\n".join("\r\n".join(lines[i:i + 3]) for i in range(0, 400, 3)),
            "no_blank_lines": "\n".join(lines),
            "one_short_paragraph": "\n".join(lines[:3])}[kind]
    out = _prepare_text(tmp_path, "out", text, val_fraction=0.05, segment_chars=400)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokens"]["val"] > 0 and meta["tokens"]["train"] > 0
    assert meta["balanced_split"] == (kind == "one_short_paragraph")  # the others are split by the hash alone
    tok = Tokenizer(DEFAULT_TOKENIZER)
    val, train = _tokens(out, "val"), _tokens(out, "train")
    from scalevec_lit.data.split import split_text

    pieces = [seg for seg, _ in split_text(text, "a.txt", 400, 0.05, balanced=meta["balanced_split"])]
    assert len(pieces) == 2 if kind == "one_short_paragraph" else len(pieces) > 10  # main: one segment per file
    strip = str.maketrans("", "", "\r\n")
    assert "".join(pieces).translate(strip) == text.translate(strip)  # every line in one segment (cut at line ends)
    assert sorted(val + train) == sorted(t for p in pieces for t in tok.encode(p))


def test_the_embedded_corpus_split_is_unchanged(prepared_data):
    meta = json.loads((prepared_data / "meta.json").read_text())
    assert meta["tokens"] == {"train": 485838, "val": 26313} and meta["balanced_split"] is False


# -- resume at the right position -----------------------------------------------------------------------------
class _Recorder(L.LightningModule):
    """Records each training batch (its step and rows); learns nothing, so that runs differ only in their data."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, list]] = []

    def training_step(self, batch, i):
        self.seen.append((self.global_step, batch.tolist()))
        return self.w.sum() * 0.0 + batch.float().mean() * self.w.sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(data, steps: int, root: Path, ckpt=None, save_at=None, **kw) -> list:
    from lightning.pytorch.callbacks import ModelCheckpoint

    model = _Recorder()
    callbacks = [ModelCheckpoint(dirpath=root, every_n_train_steps=save_at, save_top_k=-1, filename="s{step}",
                                 auto_insert_metric_name=False)] if save_at else []
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=bool(save_at), callbacks=callbacks,
                        limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=root)
    trainer.fit(model, datamodule=TokenDataModule(data, seq_len=32, batch_size=4, **kw), ckpt_path=ckpt)
    return model.seen


@pytest.mark.parametrize("save_at, sources", [(5, 1), (29, 1), (33, 1), (7, 2)],
                         ids=["mid-epoch", "epoch-end", "next-epoch", "two-folders"])
def test_resume_continues_at_the_saved_batch(small, prepared_data, tmp_path, save_at, sources):
    """Lightning restores the loader position (the data module does not): this fails when that restore is off."""
    data = str(small) if sources == 1 else [str(prepared_data), str(small)]
    steps = save_at + 6
    reference = _fit(data, steps, tmp_path / "a")
    _fit(data, steps, tmp_path / "b", save_at=save_at)
    resumed = _fit(data, steps, tmp_path / "c", ckpt=str(tmp_path / "b" / f"s{save_at}.ckpt"))
    assert [s for s, _ in resumed] == list(range(save_at, steps))
    assert resumed == reference[save_at:]


def test_resume_after_the_prepared_folder_moved(small, tmp_path):
    first = _copy(small, tmp_path / "first")
    reference = _fit(str(first), 10, tmp_path / "a")
    _fit(str(first), 10, tmp_path / "b", save_at=4)
    ckpt = tmp_path / "b" / "s4.ckpt"
    moved = tmp_path / "elsewhere" / "data"
    moved.parent.mkdir()
    shutil.move(first, moved)
    assert _fit(str(moved), 10, tmp_path / "c", ckpt=str(ckpt)) == reference[4:]


def test_resume_on_other_data_in_another_folder_is_refused(small, tmp_path):
    first = _copy(small, tmp_path / "first")
    _fit(str(first), 6, tmp_path / "b", save_at=4)
    other = _prepare_text(tmp_path, "other", "\n\n".join(f"Another text, paragraph {i}." for i in range(300)))
    with pytest.raises(RunError, match=rf"data.data_dir: {other}: the checkpoint continues a data position in "
                                       rf"{first}, which holds other data .* --data.data_dir={first} .*--model.init_from"):
        _fit(str(other), 6, tmp_path / "c", ckpt=str(tmp_path / "b" / "s4.ckpt"))


def test_an_older_checkpoint_follows_a_copied_folder_and_refuses_a_moved_one(small, tmp_path):
    """A checkpoint written before the fingerprints: the old folder, when still there, shows the data are the same."""
    first = _copy(small, tmp_path / "first")
    reference = _fit(str(first), 8, tmp_path / "a")
    _fit(str(first), 8, tmp_path / "b", save_at=4)
    ckpt = torch.load(tmp_path / "b" / "s4.ckpt", map_location="cpu", weights_only=False)
    ckpt["TokenDataModule"] = {"train_loader": None}  # what the data module saved before
    torch.save(ckpt, tmp_path / "old.ckpt")
    copy = _copy(first, tmp_path / "copy")
    assert _fit(str(copy), 8, tmp_path / "c", ckpt=str(tmp_path / "old.ckpt")) == reference[4:]
    shutil.rmtree(first)
    with pytest.raises(RunError, match=rf"the checkpoint continues a data position in {first}, which is gone, and "
                                       "the checkpoint predates data fingerprints"):
        _fit(str(copy), 8, tmp_path / "d", ckpt=str(tmp_path / "old.ckpt"))
