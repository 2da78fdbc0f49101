"""Input formats of ``prepare``: which files its documents come from, and which reader reads each.

``--input`` takes folders, files and glob patterns, mixed (``resolve_inputs``); a folder is searched
recursively. The format follows the file name, and each row format has its own file:

- text, ``.txt`` ``.md`` ``.text``: a file is cut into segments at paragraph breaks (``prepare.py``); it
  is read whole, after the binary and decoding checks of ``inputs.py``.
- JSON Lines, ``.jsonl`` ``.ndjson`` ``.jsonl.gz`` ``.ndjson.gz`` ``.json.gz`` (``jsonl.py``): one JSON object
  per line, the document in the field ``--text-field``; read one line at a time.
- parquet, ``.parquet`` (``parquet.py``): the column ``--text-field``, in record batches of that column only;
  the row groups of a large file are shared out between workers.
- a Hugging Face ``datasets`` folder written by ``save_to_disk`` (``saved_dataset.py``): its Arrow files, one
  record batch at a time, without the ``datasets`` library.

A row is one document, encoded with one end-of-text token. A row that holds no usable text (the field
missing, null, not a string or empty; a line that is not a JSON object) is skipped and counted per file
(``RowCounts``, ``rows.py``); prepare reports every such file. Memory stays bounded by one line or one
record batch, whatever the size of the input.

Must not import Lightning.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from .jsonl import JSONL_SUFFIXES, jsonl_documents, peek_jsonl
from .parquet import PARQUET_SUFFIXES, UNIT_BYTES, parquet_columns, parquet_units
from .rows import RowCounts
from .saved_dataset import arrow_columns, check_arrow, hf_arrow_files
from .tables import table_documents
from .tokenizer import TEXT_SUFFIXES

KIND_NAMES = {"text": "text", "jsonl": "JSON Lines", "parquet": "parquet", "arrow": "dataset arrow"}
FORMATS_HELP = (f"{', '.join(TEXT_SUFFIXES)} text, {', '.join(JSONL_SUFFIXES)} JSON Lines, .parquet, or a folder "
                "written by datasets' save_to_disk")


def kind_of(path: Path) -> Optional[str]:
    """``text``, ``jsonl`` or ``parquet`` from the file name; ``None`` for any other file."""
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if path.suffix.lower() in TEXT_SUFFIXES:
        return "text"
    return None


@dataclass(frozen=True)
class Source:
    """One input file. ``rel`` is its name relative to the input it was found through: the train/val split
    hashes it, and reports show it."""

    path: Path
    rel: str
    kind: str  # text | jsonl | parquet | arrow


@dataclass
class Resolved:
    sources: list[Source] = field(default_factory=list)
    roots: list[Path] = field(default_factory=list)  # what --input named (folders, files, glob matches)
    ignored: list[Path] = field(default_factory=list)  # files of other kinds found in folders and globs
    datasets: list[Path] = field(default_factory=list)  # save_to_disk folders


# -- finding the inputs -------------------------------------------------------------------------------
def _has_magic(text: str) -> bool:
    return any(c in text for c in "*?[")


def _add_folder(res: Resolved, folder: Path, base: Path) -> None:
    arrows = hf_arrow_files(folder)
    if arrows is not None:
        res.datasets.append(folder)
        res.sources += [Source(p, p.relative_to(base).as_posix(), "arrow") for p in arrows]
        return
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        if here != folder and hf_arrow_files(here) is not None:
            dirnames.clear()
            _add_folder(res, here, base)
            continue
        dirnames.sort()
        for name in sorted(filenames):
            _add_file(res, here / name, base, explicit=False)


def _add_file(res: Resolved, path: Path, base: Path, explicit: bool) -> None:
    kind = kind_of(path)
    if kind is None:
        if explicit:
            raise ValueError(f"--input: {str(path)!r}: not a format prepare reads; give {FORMATS_HELP}")
        if not path.name.startswith("."):
            res.ignored.append(path)
        return
    rel = path.relative_to(base).as_posix() if path.is_relative_to(base) else path.name
    res.sources.append(Source(path, rel, kind))


def resolve_inputs(inputs: list) -> Resolved:
    """Every input file under the folders, files and glob patterns of ``inputs`` (each found once)."""
    res = Resolved()
    for item in inputs:
        text = str(item)
        path = Path(text)
        if path.is_dir():
            res.roots.append(path)
            # a saved dataset named itself keeps its own name in ``rel``, as a file named itself does
            _add_folder(res, path, path.parent if hf_arrow_files(path) is not None else path)
        elif path.is_file():
            res.roots.append(path)
            _add_file(res, path, path.parent, explicit=True)
        elif _has_magic(text):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise FileNotFoundError(f"--input: {text!r}: the pattern matches no file or folder; check it (quote it "
                                        "so that the shell does not expand it)")
            parts = Path(text).parts
            base = Path(*[p for p in parts[:next(i for i, p in enumerate(parts) if _has_magic(p))]] or ["."])
            for match in map(Path, matches):
                res.roots.append(match)
                if match.is_dir():
                    _add_folder(res, match, base)
                else:
                    _add_file(res, match, base, explicit=False)
        else:
            raise FileNotFoundError(f"--input: {text!r}: is not a folder, a file or a glob pattern that matches; give "
                                    f"a folder of text, JSON Lines or parquet files, or files of those kinds")
    seen, unique = set(), []
    for src in res.sources:  # the same file through two inputs: once
        key = src.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(src)
    res.sources = unique
    return res


# -- checking the row files before the run, and cutting them into work units ------------------------------
def plan_units(sources: list[Source], text_field: str, unit_bytes: int = UNIT_BYTES) -> list[dict]:
    """Check each row file against ``--text-field`` and cut the inputs into work units (plain dicts, sent to
    the workers as JSON): one per text, JSON Lines or Arrow file, one per group of parquet row groups."""
    units: list[dict] = []
    for src in sources:
        base = {"kind": src.kind, "path": str(src.path.resolve()), "rel": src.rel}
        if src.kind == "parquet":
            units += parquet_units(src.path, text_field, base, unit_bytes)
        elif src.kind == "arrow":
            check_arrow(src.path, text_field)
            units.append(base)
        else:
            if src.kind == "jsonl":
                peek_jsonl(src.path, text_field)
            units.append(base)
    for i, unit in enumerate(units):
        unit["id"] = i
    return units


# -- reading documents ------------------------------------------------------------------------------------
def iter_documents(unit: dict, text_field: str, want: Callable[[int], bool], counts: RowCounts) -> Iterator[str]:
    """The documents of one work unit (a row file or part of one) whose row index ``want`` accepts; every
    accepted row that holds no usable text is counted in ``counts``."""
    kind, path = unit["kind"], unit["path"]
    if kind == "jsonl":
        yield from jsonl_documents(Path(path), text_field, want, counts)
    elif kind == "parquet":
        yield from table_documents(parquet_columns(path, text_field, unit["groups"]), unit["row0"], want, counts)
    elif kind == "arrow":
        yield from table_documents(arrow_columns(path, text_field), 0, want, counts)
    else:
        raise ValueError(f"not a row format: {kind}")


__all__ = ["FORMATS_HELP", "JSONL_SUFFIXES", "KIND_NAMES", "PARQUET_SUFFIXES", "Resolved", "RowCounts", "Source",
           "UNIT_BYTES", "hf_arrow_files", "iter_documents", "kind_of", "plan_units", "resolve_inputs"]
