"""prepare + TokenDataModule: round trip, block shapes, disjoint split, resumable position, errors."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from scalevec_lit.data.datamodule import TokenDataModule
from scalevec_lit.data.prepare import is_val, prepare, segments
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer, text_files, train_bpe


def _expected_tokens(folder: Path, split: str, tok: Tokenizer, val_fraction=0.05, segment_chars=4000) -> list[int]:
    out = []
    for path in text_files(folder):
        rel = str(path.relative_to(folder))
        for i, seg in enumerate(segments(path.read_text(encoding="utf-8"), segment_chars)):
            if is_val(rel, i, val_fraction) == (split == "val"):
                out.extend(tok.encode(seg))
    return out


def _read_all(data_dir: Path, split: str, block: int) -> list[int]:
    from litdata import StreamingDataset, TokensLoader

    ds = StreamingDataset(str(data_dir / split), item_loader=TokensLoader(block_size=block), shuffle=False)
    return torch.cat([ds[i] for i in range(len(ds))]).tolist()


@pytest.fixture()
def small_corpus(tmp_path):
    folder = tmp_path / "text"
    (folder / "sub").mkdir(parents=True)
    paras = [f"Paragraph {i} of the first file, with some words in it." for i in range(60)]
    (folder / "a.txt").write_text("\n\n".join(paras))
    (folder / "sub" / "b.txt").write_text("\n\n".join(p.replace("first", "second") for p in paras))
    (folder / "ignored.bin").write_bytes(b"\x00\x01")
    return folder


def test_prepare_round_trip_tokens_in_equal_tokens_out(small_corpus, tmp_path):
    tok = train_bpe(small_corpus, tmp_path / "tok.json", vocab_size=300)
    meta = prepare(small_corpus, tok.path, tmp_path / "prep", val_fraction=0.3, segment_chars=200, chunk_tokens=256,
                   num_workers=1)
    assert meta["vocab_size"] == tok.vocab_size and meta["files"] == 2
    for split in ("train", "val"):
        expected = _expected_tokens(small_corpus, split, tok, 0.3, 200)
        assert meta["tokens"][split] == len(expected) > 0
        got = _read_all(tmp_path / "prep", split, block=1)
        assert sorted(got) == sorted(expected)  # same multiset of tokens (chunk order may follow files)
        assert len(got) == len(expected)


def test_train_and_val_segments_are_disjoint(prepared_data):
    from scalevec_lit.data.tokenizer import DEFAULT_TEXT_DIR

    train_segs, val_segs = set(), set()
    for path in text_files(DEFAULT_TEXT_DIR):
        rel = str(path.relative_to(DEFAULT_TEXT_DIR))
        for i, seg in enumerate(segments(path.read_text(encoding="utf-8"), 4000)):
            (val_segs if is_val(rel, i, 0.05) else train_segs).add(seg)
    assert val_segs and train_segs and not (val_segs & train_segs)
    meta = json.loads((prepared_data / "meta.json").read_text())
    assert 0.02 < meta["tokens"]["val"] / (meta["tokens"]["train"] + meta["tokens"]["val"]) < 0.10


def test_datamodule_blocks_are_seq_len_plus_one(prepared_data):
    dm = TokenDataModule(str(prepared_data), seq_len=48, batch_size=3)
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (3, 49)
    assert int(batch.max()) < dm.vocab_size == Tokenizer(DEFAULT_TOKENIZER).vocab_size
    val = next(iter(dm.val_dataloader()))
    assert val.shape[1] == 49


def test_loader_state_restores_the_next_batches(prepared_data):
    """The loader's own state (Lightning saves and restores it; test_data_integrity.py: through a Trainer)."""
    dm = TokenDataModule(str(prepared_data), seq_len=32, batch_size=4)
    loader = dm.train_dataloader()
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    expected = [next(it) for _ in range(2)]
    loader2 = TokenDataModule(str(prepared_data), seq_len=32, batch_size=4).train_dataloader()
    loader2.load_state_dict(state)
    it2 = iter(loader2)
    for want in expected:
        assert torch.equal(next(it2), want)
    assert dm.state_dict() == {"sources": [{"dir": str(prepared_data), "fingerprint": dm._fingerprints[0]}]}


def test_missing_data_folder_names_path_and_fix(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"data.data_dir: '.*nowhere' does not exist; run `python -m scalevec_lit prepare"):
        TokenDataModule(str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no meta.json \(not prepared\)"):
        TokenDataModule(str(tmp_path / "empty"))


def test_empty_text_folder_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"input: '.*empty' holds no text files"):
        prepare(tmp_path / "empty", DEFAULT_TOKENIZER, tmp_path / "out")


def test_sequence_longer_than_the_data_is_refused(prepared_data):
    with pytest.raises(ValueError, match=r"model.config.seq_len: 100000 needs blocks of 100001 tokens"):
        TokenDataModule(str(prepared_data), seq_len=100_000)


def test_wrong_tokenizer_is_refused(prepared_data, small_corpus, tmp_path):
    other = train_bpe(small_corpus, tmp_path / "other.json", vocab_size=280)
    with pytest.raises(ValueError, match=r"data.tokenizer: '.*other.json' \(vocab 280\) is not the tokenizer"):
        TokenDataModule(str(prepared_data), tokenizer=str(other.path))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"could not be read as a Hugging Face tokenizer.json"):
        Tokenizer(bad)


def test_tokenizer_round_trip_and_eos():
    tok = Tokenizer(DEFAULT_TOKENIZER)
    text = "To be, or not to be, that is the question."
    ids = tok.encode(text)
    assert ids[-1] == tok.eos_id == 0
    assert tok.decode(ids[:-1]) == text


def test_mixing_two_prepared_folders_by_weight(prepared_data, small_corpus, tmp_path):
    second = tmp_path / "second"
    prepare(small_corpus, DEFAULT_TOKENIZER, second, val_fraction=0.3, segment_chars=200, chunk_tokens=256,
            num_workers=1)
    dm = TokenDataModule([str(prepared_data), str(second)], weights=[0.5, 0.5], seq_len=16, batch_size=4)
    small = set(_read_all(second, "train", block=1))
    it = iter(dm.train_dataloader())
    from_second = sum(all(int(t) in small for t in row) for _ in range(20) for row in next(it))
    assert 20 <= from_second <= 60  # about half of 80 rows come from the small folder (it alone cannot be all of them)
    with pytest.raises(ValueError, match=r"data.weights: 1 weights for 2 folders"):
        TokenDataModule([str(prepared_data), str(second)], weights=[1.0], seq_len=16)
    other = train_bpe(small_corpus, tmp_path / "other.json", vocab_size=280)
    third = tmp_path / "third"
    prepare(small_corpus, other.path, third, val_fraction=0.3, segment_chars=200, chunk_tokens=256, num_workers=1)
    with pytest.raises(ValueError, match=r"mixed datasets must share one tokenizer"):
        TokenDataModule([str(prepared_data), str(third)], seq_len=16)


def _direct_val_loss(model, data_dir: Path, block: int) -> tuple[float, int]:
    """Token-weighted mean next-token loss of ``model`` over every block of ``data_dir``'s val split."""
    import torch.nn.functional as F
    from litdata import StreamingDataset, TokensLoader

    ds = StreamingDataset(str(data_dir / "val"), item_loader=TokensLoader(block_size=block), shuffle=False)
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(len(ds)):
            x = ds[i].long()[None]
            logits = model(x[:, :-1])
            total += F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten(), reduction="sum").item()
            n += x.shape[1] - 1
    return total / n, n


def test_per_source_validation_losses_are_the_models_loss_on_each_source(prepared_data, small_corpus, tmp_path):
    import lightning as L
    from helpers import tiny_config

    from scalevec_lit.lit.module import CausalLM

    second = tmp_path / "second"
    prepare(small_corpus, DEFAULT_TOKENIZER, second, val_fraction=0.3, segment_chars=200, chunk_tokens=256,
            num_workers=1)
    dm = TokenDataModule([str(prepared_data), str(second)], seq_len=32, batch_size=8)
    assert dm.source_names == ["shakespeare", "second"]
    model = CausalLM(tiny_config(seq_len=32), vocab_size=dm.vocab_size)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False)
    trainer.validate(model, datamodule=dm, verbose=False)
    got = {k: float(v) for k, v in trainer.callback_metrics.items()}
    model.model.eval()
    direct = {name: _direct_val_loss(model.model, Path(d), 33) for name, d in zip(dm.source_names, dm.data_dirs)}
    for name, (loss, _) in direct.items():
        assert got[f"val/{name}/loss"] == pytest.approx(loss, rel=1e-5)
        assert got[f"val/{name}/ppl"] == pytest.approx(math.exp(loss), rel=1e-5)
    # val/loss keeps its meaning: the token-weighted mean over every validation block of every source
    overall = sum(loss * n for loss, n in direct.values()) / sum(n for _, n in direct.values())
    assert got["val/loss"] == pytest.approx(overall, rel=1e-5) and got["val/ppl"] == pytest.approx(math.exp(overall), rel=1e-5)
    assert direct["shakespeare"][1] > 10 * direct["second"][1] and abs(direct["shakespeare"][0] - direct["second"][0]) > 1e-3
    # one source: no per-source metrics; configured names replace the folder names
    single = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                       limit_val_batches=2)
    single.validate(CausalLM(tiny_config(seq_len=32), vocab_size=dm.vocab_size),
                    datamodule=TokenDataModule(str(second), seq_len=32, batch_size=8), verbose=False)
    assert sorted(single.callback_metrics) == ["val/loss", "val/ppl"]
    assert TokenDataModule([str(prepared_data), str(second)], names=["web", "code"], seq_len=32).source_names == ["web", "code"]
    with pytest.raises(ValueError, match=r"data.names: \['web', 'web'\]: each name must be distinct"):
        TokenDataModule([str(prepared_data), str(second)], names=["web", "web"], seq_len=32)
    with pytest.raises(ValueError, match=r"data.names: 1 names for 2 folders"):
        TokenDataModule([str(prepared_data), str(second)], names=["web"], seq_len=32)
