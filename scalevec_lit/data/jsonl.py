"""JSON Lines (``.jsonl`` ``.ndjson`` ``.jsonl.gz`` ``.ndjson.gz`` ``.json.gz``): one JSON object per line, the
document in the field ``--text-field``; read one line at a time (gzip is decompressed as a stream).

Must not import Lightning.
"""
from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Callable, Iterator

from .rows import RowCounts

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json.gz")
#: rows peeked at in each JSON Lines file to check that ``--text-field`` exists before tokenizing
PEEK_ROWS = 100


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def peek_jsonl(path: Path, text_field: str) -> None:
    """Refuse a ``--text-field`` that none of the first ``PEEK_ROWS`` JSON objects of the file has."""
    keys: dict[str, None] = {}
    objects = 0
    try:
        with _open_binary(path) as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    objects += 1
                    if text_field in obj:
                        return
                    keys.update(dict.fromkeys(obj))
                if objects >= PEEK_ROWS:
                    break
    except (OSError, EOFError, zlib.error) as err:
        raise ValueError(f"--input: {str(path)!r}: could not be read as {'gzip-compressed ' if path.name.lower().endswith('.gz') else ''}"
                         f"JSON Lines ({err}); check the file") from None
    if objects:
        raise ValueError(
            f"--text-field: {text_field!r}: {path} has no such field in its first {objects} JSON object(s); their "
            f"fields are: {', '.join(keys) or '(none)'}; choose one with --text-field"
        )


def jsonl_documents(path: Path, text_field: str, want: Callable[[int], bool], counts: RowCounts) -> Iterator[str]:
    lineno = -1
    try:
        with _open_binary(path) as fh:
            for lineno, line in enumerate(fh):
                if not want(lineno) or not line.strip():
                    continue
                try:
                    obj = json.loads(line)  # bytes: UTF-8 (with or without BOM), UTF-16/32 are detected
                except ValueError:  # JSONDecodeError, UnicodeDecodeError
                    counts.skip("invalid", lineno)
                    continue
                if not isinstance(obj, dict):
                    counts.skip("invalid", lineno)
                elif text_field not in obj:
                    counts.skip("missing", lineno)
                else:
                    doc = counts.take(obj[text_field], lineno)
                    if doc is not None:
                        yield doc
    except (OSError, EOFError, zlib.error) as err:
        counts.error = f"the file could not be read after line {lineno + 1} ({err}); the lines before it were used"
