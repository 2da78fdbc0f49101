"""Tokenizer: a thin wrapper over a Hugging Face ``tokenizer.json`` (local file only), and BPE training.

``python -m scalevec_lit.data.tokenizer train <text folder> <out tokenizer.json> --vocab-size 4096``

Must not import Lightning.
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import Iterable, Optional

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
TEXT_SUFFIXES = (".txt", ".md", ".text")

#: The embedded default corpus and its tokenizer (shipped inside the package).
CORPUS_DIR = Path(__file__).parent / "corpus"
DEFAULT_TEXT_DIR = CORPUS_DIR / "shakespeare"
DEFAULT_TOKENIZER = CORPUS_DIR / "tokenizer.json"


class Tokenizer:
    """Load a ``tokenizer.json`` and encode documents with an end-of-text id appended."""

    def __init__(self, path: str | Path, key: str = "tokenizer") -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.path = Path(path)
        if self.path.is_dir():
            self.path = self.path / "tokenizer.json"
        if not self.path.is_file():
            raise FileNotFoundError(
                f"{key}: {str(path)!r} is not a tokenizer.json file; give the path of a Hugging Face "
                f"tokenizer.json (the embedded one is {DEFAULT_TOKENIZER})"
            )
        try:
            self._tok = HFTokenizer.from_file(str(self.path))
        except Exception as err:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(
                f"{key}: {str(self.path)!r} could not be read as a Hugging Face tokenizer.json ({err}); "
                "check the file or train one with `python -m scalevec_lit.data.tokenizer train`"
            ) from err
        self.eos_id = next((self._tok.token_to_id(t) for t in EOS_CANDIDATES if self._tok.token_to_id(t) is not None), None)
        if self.eos_id is None:
            raise ValueError(
                f"{key}: {str(self.path)!r} has none of the end-of-text tokens {EOS_CANDIDATES}; "
                "add one as a special token"
            )

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, eos: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ids + [self.eos_id] if eos else ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids))

    def fingerprint(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]


def text_files(folder: str | Path, key: str = "input") -> list[Path]:
    """Every text file under ``folder`` (recursively), sorted; a clear error when there is none."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{key}: {str(folder)!r} is not a folder; give a folder of .txt files")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise FileNotFoundError(
            f"{key}: {str(folder)!r} holds no text files ({', '.join(TEXT_SUFFIXES)}); add some or point elsewhere"
        )
    return files


def train_bpe(folder: str | Path, out: str | Path, vocab_size: int = 4096, eos: str = "<|endoftext|>") -> Tokenizer:
    """Train a byte-level BPE on every text file of ``folder`` and save a standard ``tokenizer.json``."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train([str(p) for p in text_files(folder)], trainer)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return Tokenizer(out)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scalevec_lit.data.tokenizer")
    sub = parser.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="train a byte-level BPE tokenizer.json on a folder of text")
    tr.add_argument("input")
    tr.add_argument("output")
    tr.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args(argv)
    tok = train_bpe(args.input, args.output, args.vocab_size)
    print(f"wrote {tok.path} (vocab {tok.vocab_size}, eos id {tok.eos_id})")


if __name__ == "__main__":
    main()
