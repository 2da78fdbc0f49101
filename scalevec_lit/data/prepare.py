"""prepare: a folder of text files + a ``tokenizer.json`` → litdata token chunks, split train/val.

``python -m scalevec_lit prepare --input <folder> --tokenizer <tokenizer.json> --output <dir>``

Each file is cut into segments at paragraph breaks (about ``segment_chars`` characters each); a segment
goes to validation when a stable hash of (file, index) falls under ``val_fraction``, so the split is
disjoint, reproducible and unchanged when files are added. Every segment is encoded with an
end-of-text id appended, and the token stream is written with litdata's ``optimize`` (``TokensLoader``),
in parallel workers over files. ``meta.json`` records the tokenizer, its vocabulary and the counts; the
data module checks it. What prepare reads and where it writes (binary and undecodable files, the output
folder it owns, ``--overwrite``) is in ``inputs.py``; it ends with a summary of files read and skipped.

Must not import Lightning.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from functools import partial
from pathlib import Path
from typing import Iterator, Optional

import torch

from .inputs import ERROR_POLICIES, claim_output, scan_inputs
from .tokenizer import DEFAULT_TEXT_DIR, DEFAULT_TOKENIZER, Tokenizer, text_files

META = "meta.json"
_TOKENIZERS: dict[str, Tokenizer] = {}


def segments(text: str, segment_chars: int) -> list[str]:
    """Cut ``text`` at blank lines into pieces of at least ``segment_chars`` characters (the last may be shorter)."""
    out, cur, size = [], [], 0
    for para in text.split("\n\n"):
        cur.append(para)
        size += len(para) + 2
        if size >= segment_chars:
            out.append("\n\n".join(cur))
            cur, size = [], 0
    if cur and "".join(cur).strip():
        out.append("\n\n".join(cur))
    return out


def is_val(rel: str, index: int, val_fraction: float) -> bool:
    return (zlib.crc32(f"{rel}\0{index}".encode()) % 100_000) < val_fraction * 100_000


def _tokenize_file(
    path: str, *, root: str, tokenizer: str, split: str, val_fraction: float, segment_chars: int,
    encoding: str = "utf-8",
) -> Iterator[torch.Tensor]:
    tok = _TOKENIZERS.get(tokenizer) or _TOKENIZERS.setdefault(tokenizer, Tokenizer(tokenizer))
    rel = os.path.relpath(path, root)
    text = Path(path).read_bytes().decode(encoding, errors="replace")  # undecodable files were sorted out before
    for i, seg in enumerate(segments(text, segment_chars)):
        if is_val(rel, i, val_fraction) == (split == "val"):
            yield torch.tensor(tok.encode(seg), dtype=torch.int32)


def prepare(
    input_dir: str | Path = DEFAULT_TEXT_DIR,
    tokenizer: str | Path = DEFAULT_TOKENIZER,
    output_dir: str | Path = "data/prepared/shakespeare",
    val_fraction: float = 0.05,
    segment_chars: int = 4000,
    chunk_tokens: int = 1 << 17,
    num_workers: Optional[int] = None,
    overwrite: bool = False,
    encoding: str = "utf-8",
    errors: str = "skip",
) -> dict:
    """Tokenize and chunk; returns the metadata written to ``<output_dir>/meta.json`` (with ``skipped``:
    the binary and undecodable files left out)."""
    from litdata import TokensLoader, optimize

    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction: {val_fraction}: must be between 0 and 1 (exclusive); e.g. 0.05")
    for key, value, low in (("--segment-chars", segment_chars, 1), ("--chunk-tokens", chunk_tokens, 2)):
        if value < low:
            raise ValueError(f"{key}: {value}: must be at least {low}; use the default or a larger value")
    found = text_files(input_dir, key="--input")
    tok = Tokenizer(tokenizer, key="--tokenizer")
    scan = scan_inputs(found, encoding, errors)
    if not scan.files:
        raise ValueError(f"--input: {str(input_dir)!r}: none of its {len(found)} file(s) is readable text ("
                         + "; ".join(scan.summary(Path(input_dir))) + "); check --encoding or the folder")
    files = scan.files
    out = Path(output_dir)
    claim_output(out, [Path(input_dir)], overwrite)
    workers = num_workers if num_workers is not None else max(1, min(len(files), os.cpu_count() or 1))
    counts = {}
    for split in ("train", "val"):
        fn = partial(
            _tokenize_file,
            root=str(Path(input_dir).resolve()),
            tokenizer=str(tok.path.resolve()),
            split=split,
            val_fraction=val_fraction,
            segment_chars=segment_chars,
            encoding=encoding,
        )
        optimize(
            fn=fn,
            inputs=[str(p.resolve()) for p in files],
            output_dir=str((out / split).resolve()),
            chunk_size=chunk_tokens,
            item_loader=TokensLoader(),
            num_workers=workers,
            mode="overwrite",
            start_method="fork" if os.name == "posix" else None,
            verbose=True,
        )
        index = json.loads((out / split / "index.json").read_text())
        counts[split] = int(sum(c["dim"] or 0 for c in index["chunks"]))
        if counts[split] == 0:
            raise ValueError(
                f"--input: {str(input_dir)!r}: gave no {split} tokens; add text or change --val-fraction ({val_fraction})"
            )
    meta = {
        "source": str(Path(input_dir).resolve()),
        "files": len(files),
        "encoding": encoding,
        "skipped": {"binary": [str(p) for p in scan.binary],
                    "undecodable": {str(p): n for p, n in scan.undecodable.items()},
                    "replaced": {str(p): n for p, n in scan.replaced.items()}},
        "tokenizer": str(tok.path.resolve()),
        "tokenizer_sha256": tok.fingerprint(),
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "tokens": counts,
        "chunk_tokens": chunk_tokens,
        "val_fraction": val_fraction,
        "segment_chars": segment_chars,
    }
    (out / META).write_text(json.dumps(meta, indent=2))
    meta["summary"] = [f"read {len(files)} of {len(found)} text file(s)", *scan.summary(Path(input_dir))]
    return meta


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scalevec_lit prepare",
        description="Tokenize a folder of text files into litdata chunks (train/val split).",
    )
    parser.add_argument("--input", default=str(DEFAULT_TEXT_DIR), help="folder of .txt files (default: embedded corpus)")
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="a tokenizer.json (default: embedded BPE)")
    parser.add_argument("--output", default="data/prepared/shakespeare")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--segment-chars", type=int, default=4000)
    parser.add_argument("--chunk-tokens", type=int, default=1 << 17)
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--encoding", default="utf-8", help="text encoding of the input files (default utf-8)")
    parser.add_argument("--errors", choices=ERROR_POLICIES, default="skip",
                        help="a file that does not decode: skip it and list it (default), replace the bad bytes "
                             "by U+FFFD, or stop (strict)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier output of prepare (removes only prepare's own files)")
    parser.add_argument("--if-missing", action="store_true", help="do nothing when the output is already prepared")
    args = parser.parse_args(argv)
    if args.if_missing and (Path(args.output) / META).exists():
        print(f"{args.output} already prepared")
        return
    meta = prepare(
        args.input, args.tokenizer, args.output, args.val_fraction, args.segment_chars, args.chunk_tokens,
        args.num_workers, args.overwrite, args.encoding, args.errors,
    )
    for line in meta["summary"]:
        print(f"prepare: {line}", file=sys.stderr)
    print(f"prepared {args.output}: {meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val tokens, "
          f"vocab {meta['vocab_size']}")


if __name__ == "__main__":
    from ..errors import run_guarded

    run_guarded(main, sys.argv[1:])
