"""Tokenizers are compared by content wherever a checkpoint meets data (resume, validate, init_from) or a
tokenizer is given beside a checkpoint (generate, export): the same vocabulary, merges and added tokens
are the same tokenizer whatever the file looks like; a vocabulary of the same size with two tokens swapped
is another one, and is refused with both names."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import scalevec_lit.cli  # noqa: F401 - Lightning imported before stderr is captured (see test_bad_input.py)
from helpers import check, smoke_args
from scalevec_lit.data.tokenizer import DEFAULT_TEXT_DIR, DEFAULT_TOKENIZER, Tokenizer, content_hash


def _resaved(folder: Path) -> Path:
    """The embedded tokenizer written as another version of ``tokenizers`` might: indented, merges as strings."""
    raw = json.loads(DEFAULT_TOKENIZER.read_text())
    raw["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in raw["model"]["merges"]]
    out = folder / "resaved" / "tokenizer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw, indent=4))
    return out


def _swapped(folder: Path) -> Path:
    """The embedded tokenizer with the ids of two frequent tokens swapped: same size, other meaning."""
    raw = json.loads(DEFAULT_TOKENIZER.read_text())
    vocab = raw["model"]["vocab"]
    a, b = "Ġthe", "Ġand"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    out = folder / "swapped" / "tokenizer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw))
    return out


def test_content_hash_ignores_the_file_form_and_sees_the_vocabulary(tmp_path):
    resaved, swapped = _resaved(tmp_path), _swapped(tmp_path)
    assert resaved.read_bytes() != DEFAULT_TOKENIZER.read_bytes()
    assert content_hash(resaved) == content_hash(DEFAULT_TOKENIZER)
    assert Tokenizer(swapped).vocab_size == Tokenizer(DEFAULT_TOKENIZER).vocab_size
    assert content_hash(swapped) != content_hash(DEFAULT_TOKENIZER)
    renamed = tmp_path / "renamed.json"
    renamed.write_text(DEFAULT_TOKENIZER.read_text().replace("<|endoftext|>", "<|end_of_text|>"))
    assert content_hash(renamed) != content_hash(DEFAULT_TOKENIZER)


@pytest.fixture(scope="module")
def setting(prepared_data, tmp_path_factory):
    """A 2-step checkpoint on the embedded data, and small data folders prepared with a re-saved copy of the
    embedded tokenizer and with the swapped one."""
    from scalevec_lit.cli import main
    from scalevec_lit.data.prepare import prepare

    root = tmp_path_factory.mktemp("tokid")
    main(smoke_args(prepared_data, root / "run", 2, "--trainer.limit_val_batches=0"))
    text = root / "text"
    text.mkdir()
    (text / "hamlet.txt").write_text((DEFAULT_TEXT_DIR / "hamlet.txt").read_text()[:120_000])
    data = {}
    for name, tok in (("resaved", _resaved(root)), ("swapped", _swapped(root))):
        data[name] = root / f"data_{name}"
        prepare(input_dir=text, tokenizer=tok, output_dir=data[name], num_workers=1)
    return {"ckpt": root / "run" / "checkpoints" / "last.ckpt", **data, "swapped_tok": root / "swapped" / "tokenizer.json",
            "resaved_tok": root / "resaved" / "tokenizer.json"}


def _run(world, data: Path, *extra) -> list:
    return smoke_args(data, world.path / "out", 3, "--trainer.limit_val_batches=0", *extra)


@pytest.mark.parametrize("how", ["init_from", "resume"])
def test_a_checkpoint_meets_data_of_another_tokenizer_of_the_same_size(world, capfd, setting, how):
    ckpt = setting["ckpt"]
    arg = f"--model.init_from={ckpt}" if how == "init_from" else f"--ckpt_path={ckpt}"
    key = "model.init_from" if how == "init_from" else "--ckpt_path"
    check(world, capfd, _run(world, setting["swapped"], arg), 2,
          f"{key}: {ckpt}: was trained with the tokenizer '{DEFAULT_TOKENIZER}'",
          f"but '{setting['swapped']}' was prepared with '{setting['swapped_tok']}'",
          "their vocabularies differ", "prepare --tokenizer")
    assert not list((world.path / "out").rglob("*.ckpt"))


def test_validate_refuses_it_too(world, capfd, setting):
    check(world, capfd, ["validate", "--config", "recipes/smoke.yaml", f"--data.data_dir={setting['swapped']}",
                         f"--ckpt_path={setting['ckpt']}", "--trainer.limit_val_batches=1",
                         f"--trainer.default_root_dir={world.path / 'out'}",
                         f"--trainer.logger.init_args.save_dir={world.path / 'out'}"], 2,
          "--ckpt_path:", "their vocabularies differ")


def test_the_same_tokenizer_in_another_file_is_accepted(world, capfd, setting):
    check(world, capfd, _run(world, setting["resaved"], f"--model.init_from={setting['ckpt']}"), 0)
    assert (world.path / "out" / "checkpoints" / "last.ckpt").is_file()


def test_generate_compares_the_given_tokenizer_by_content(world, capfd, setting):
    ckpt = setting["ckpt"]
    check(world, capfd, ["generate", "--ckpt", ckpt, "--tokenizer", setting["swapped_tok"], "--prompt", "To be"], 2,
          f"--tokenizer: '{setting['swapped_tok']}': is not the tokenizer the model was trained with",
          f"trained with '{DEFAULT_TOKENIZER}'")
    text = check(world, capfd, ["generate", "--ckpt", ckpt, "--tokenizer", setting["resaved_tok"], "--prompt", "To be",
                                "--max-new-tokens", "2"], 0, "the same, by content")
    assert text.startswith("To be")


def test_data_tokenizer_is_compared_by_content(world, capfd, setting):
    check(world, capfd, _run(world, world.data, f"--data.tokenizer={setting['swapped_tok']}"), 2,
          f"data.tokenizer: '{setting['swapped_tok']}'", "is not the tokenizer")
    check(world, capfd, _run(world, world.data, f"--data.tokenizer={setting['resaved_tok']}",
                             "--trainer.max_steps=1"), 0)
