"""Tokenizer: a thin wrapper over a Hugging Face ``tokenizer.json`` (local file only), and BPE training.

``python -m scalevec_lit.data.tokenizer train <text folder> <out tokenizer.json> --vocab-size 4096``

Must not import Lightning.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Iterable, Optional

from ..errors import CommandLineParser, run_guarded


EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
TEXT_SUFFIXES = (".txt", ".md", ".text")

#: The embedded default corpus and its tokenizer (shipped inside the package).
CORPUS_DIR = Path(__file__).parent / "corpus"
DEFAULT_TEXT_DIR = CORPUS_DIR / "shakespeare"
DEFAULT_TOKENIZER = CORPUS_DIR / "tokenizer.json"


class Tokenizer:
    """Load a ``tokenizer.json`` and encode documents with an end-of-text id appended.

    ``path``: the file, or a folder that holds one; ``eos_id``: the id of the first of ``EOS_CANDIDATES`` that
    the file has (one is required). ``key`` is the option named in errors."""

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
        """Number of ids, added tokens included: the model's vocabulary must hold every one."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, eos: bool = True) -> list[int]:
        """The ids of ``text`` (no special token added by the tokenizer), then ``eos_id`` when ``eos``: the
        end-of-text id that separates documents in the training data."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ids + [self.eos_id] if eos else ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, special tokens (the end-of-text one included) left out."""
        return self._tok.decode(list(ids))

    def fingerprint(self) -> str:
        """The file's bytes (a copy is the same; a re-saved file may not be: see ``content_hash``)."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]

    def content_hash(self) -> str:
        """What maps text to ids: the vocabulary (token → id), the merges and the added tokens, hashed in a
        canonical form, so that a tokenizer re-saved by another version of ``tokenizers`` (other
        whitespace, merges as pairs or as strings) has the same hash and one with two tokens swapped does not."""
        return content_hash(self.path)

    def identity(self) -> dict:
        """What a checkpoint records about the tokenizer of its data (``same_tokenizer`` compares two)."""
        return {"path": str(self.path.resolve()), "sha256": self.fingerprint(), "content": self.content_hash(),
                "vocab_size": self.vocab_size}


def content_hash(path: str | Path) -> str:
    """``Tokenizer.content_hash`` of a ``tokenizer.json`` file."""
    import json

    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    model = raw.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        vocab = sorted(((int(i), t) for t, i in vocab.items()))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    added = sorted((int(t["id"]), t["content"], bool(t.get("special"))) for t in raw.get("added_tokens") or [])
    canonical = json.dumps({"type": model.get("type"), "vocab": vocab, "merges": merges, "added": added},
                           ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def data_tokenizer(meta: dict, where: str) -> Optional[dict]:
    """The identity of the tokenizer a prepared folder was made with, from its ``meta.json`` (``where``):
    the content hash it records, or (folders prepared before it was recorded) that of the tokenizer file it
    names when that file is still there with the recorded bytes; ``None`` when nothing is recorded."""
    if not meta.get("tokenizer_sha256"):
        return None
    ident = {"path": meta.get("tokenizer"), "sha256": meta["tokenizer_sha256"], "vocab_size": meta.get("vocab_size"),
             "source": where}
    content = meta.get("tokenizer_content")
    if content is None and meta.get("tokenizer") and Path(meta["tokenizer"]).is_file():
        tok = Path(meta["tokenizer"])
        if hashlib.sha256(tok.read_bytes()).hexdigest()[:16] == meta["tokenizer_sha256"]:
            content = content_hash(tok)
    if content is not None:
        ident["content"] = content
    return ident


def same_tokenizer(a: dict, b: dict) -> Optional[bool]:
    """Whether two recorded tokenizers map text to the same ids: by content when both record it, else by the
    file's bytes (equal bytes: the same; different bytes and no content: ``None``, cannot tell)."""
    if a.get("content") and b.get("content"):
        return a["content"] == b["content"]
    if a.get("sha256") and a.get("sha256") == b.get("sha256"):
        return True
    return None


def describe_tokenizer(ident: dict) -> str:
    """``'path' (vocab N, content 1a2b…)`` for error messages."""
    parts = [f"vocab {ident['vocab_size']}"] if ident.get("vocab_size") is not None else []
    if ident.get("content") or ident.get("sha256"):
        parts.append(f"content {ident['content']}" if ident.get("content") else f"file sha256 {ident['sha256']}")
    return f"{ident.get('path')!r} ({', '.join(parts)})"


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


def utf8_files(folder: str | Path) -> list[Path]:
    """The text files of ``folder`` that the trainer can read (UTF-8): prepare's scan (``inputs.scan_inputs``)
    skips a binary or undecodable file with a note naming it; none left is a ``ValueError`` naming the first
    such file and the fix (the trainer stopped with ``stream did not contain valid UTF-8``, naming no file)."""
    from ..errors import notice
    from .inputs import scan_inputs

    files = text_files(folder)
    scan = scan_inputs(files, "utf-8", "skip")
    root = Path(folder)
    if scan.files:
        for line in scan.summary(root):
            notice(f"tokenizer train: {line} (the tokenizer reads UTF-8 text only)")
        return scan.files
    if scan.undecodable:
        first, bad = next(iter(scan.undecodable.items()))
        what, fix = f"{bad} bytes are not valid UTF-8", (
            f"convert it to UTF-8 (e.g. iconv -f latin-1 -t utf-8 {first} > {first}.utf8 && mv {first}.utf8 "
            f"{first}), or give a folder of UTF-8 text")
    else:
        first, what, fix = scan.binary[0], "a binary file, not text", "give a folder of UTF-8 text"
    others = len(files) - 1
    where = f"as are the other {others} file(s) of {str(folder)!r}" if others else \
        f"the only text file of {str(folder)!r}"
    raise ValueError(f"input: {first}: {what} ({where}: nothing to train on; the tokenizer reads UTF-8 text only); "
                     f"{fix}")


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
    tok.train([str(p) for p in utf8_files(folder)], trainer)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return Tokenizer(out)


def main(argv: Optional[list[str]] = None) -> None:
    parser = CommandLineParser(prog="python -m scalevec_lit.data.tokenizer")
    sub = parser.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="train a byte-level BPE tokenizer.json on a folder of text")
    tr.add_argument("input")
    tr.add_argument("output")
    tr.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args(argv)
    tok = train_bpe(args.input, args.output, args.vocab_size)
    print(f"wrote {tok.path} (vocab {tok.vocab_size}, eos id {tok.eos_id})")


if __name__ == "__main__":
    run_guarded(main, sys.argv[1:])
