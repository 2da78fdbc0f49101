"""Where a checkpoint meets data, their tokenizers must be the same by content, or the run is refused.

A model's embedding rows stand for the tokens of the tokenizer it was trained with. Training it on data
tokenized by another tokenizer, even one of the same size, silently gives each row another meaning. The
tokenizers are compared by content (vocabulary, merges, added tokens: ``data/tokenizer.py``
``content_hash``), so a copy or a re-saved file is the same tokenizer, and a vocabulary with two tokens
swapped is not. Checked on resume and ``validate``/``test --ckpt_path`` (``CausalLM.on_load_checkpoint``),
and on ``fit --model.init_from`` (``CausalLM.setup``); ``generate`` and ``export`` compare the
``--tokenizer`` they are given (``export/tokenizer.py``).

Must not import Lightning.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..data.tokenizer import Tokenizer, data_tokenizer, describe_tokenizer, same_tokenizer
from ..errors import UserError


def data_identity(dm: Any) -> Optional[dict]:
    """The tokenizer of the data module's prepared data (``None`` without a data module or a record)."""
    meta = getattr(dm, "meta", None) or {}
    if dm is None or not meta:
        return None
    data_dir = str(getattr(dm, "data_dir", ""))
    where = f"{data_dir}/meta.json" if "://" in data_dir else str(Path(data_dir) / "meta.json")
    return data_tokenizer(meta, where)


def checkpoint_identity(path: str, extra: dict) -> Optional[dict]:
    """The tokenizer a checkpoint was trained with: recorded in a ``.ckpt`` (``checkpoint['scalevec']``), or
    the ``tokenizer.json`` inside a native folder (``import``, ``convert``, ``export --format native``)."""
    if extra.get("tokenizer"):
        return dict(extra["tokenizer"])
    folder = Path(path)
    if folder.is_dir() and (folder / "tokenizer.json").is_file():
        return Tokenizer(folder / "tokenizer.json", key=str(folder)).identity()
    return None


def check_same_tokenizer(key: str, ckpt: str, saved: Optional[dict], data: Optional[dict]) -> None:
    """``UserError`` when the checkpoint's tokenizer and the data's differ (or cannot be told apart)."""
    if not saved or not data:
        return  # nothing recorded on one side (a checkpoint of fit without meta.json, a test module)
    same = same_tokenizer(saved, data)
    if same:
        return
    data_dir = str(data.get("source", "the data")).removesuffix("/meta.json")
    problem = ("was trained with the tokenizer " + describe_tokenizer(saved) + ", but " + repr(data_dir) +
               " was prepared with " + describe_tokenizer(data) + (
                   ": their vocabularies differ, so the embeddings would stand for other tokens" if same is False else
                   ": their files differ and the checkpoint predates content hashes, so they cannot be told equal"))
    raise UserError(key, ckpt, problem, "prepare the data with the checkpoint's tokenizer (python -m scalevec_lit "
                    f"prepare --tokenizer {saved.get('path')} --output <folder>) and pass that folder as "
                    "--data.data_dir, or start from a checkpoint trained with the data's tokenizer")
