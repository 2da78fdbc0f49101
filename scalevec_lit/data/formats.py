"""Input formats of ``prepare``: which files its documents come from, and how they are read.

``--input`` takes folders, files and glob patterns, mixed (``resolve_inputs``); a folder is searched
recursively. The format follows the file name:

- text, ``.txt`` ``.md`` ``.text``: a file is cut into segments at paragraph breaks (``prepare.py``); it
  is read whole, after the binary and decoding checks of ``inputs.py``.
- JSON Lines, ``.jsonl`` ``.ndjson`` ``.jsonl.gz`` ``.ndjson.gz`` ``.json.gz``: one JSON object per line,
  the document in the field ``--text-field``; read one line at a time (gzip is decompressed as a stream).
- parquet, ``.parquet``: the column ``--text-field``, read with pyarrow in record batches of that column
  only (``ParquetFile.iter_batches``); the row groups of a large file are shared out between workers.
- a Hugging Face ``datasets`` folder written by ``save_to_disk`` (``state.json`` naming ``data-*.arrow``
  files, or a ``DatasetDict``: ``dataset_dict.json`` and one such folder per split, all splits read):
  the Arrow IPC stream files are read with pyarrow, one record batch at a time, so the ``datasets``
  library is not needed.

A row is one document, encoded with one end-of-text token. A row that holds no usable text (the field
missing, null, not a string or empty; a line that is not a JSON object) is skipped and counted per file
(``RowCounts``); prepare reports every such file. Memory stays bounded by one line or one record batch,
whatever the size of the input.

Must not import Lightning.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from .tokenizer import TEXT_SUFFIXES

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json.gz")
PARQUET_SUFFIXES = (".parquet",)
KIND_NAMES = {"text": "text", "jsonl": "JSON Lines", "parquet": "parquet", "arrow": "dataset arrow"}
FORMATS_HELP = (f"{', '.join(TEXT_SUFFIXES)} text, {', '.join(JSONL_SUFFIXES)} JSON Lines, .parquet, or a folder "
                "written by datasets' save_to_disk")
#: rows peeked at in each JSON Lines file to check that ``--text-field`` exists before tokenizing
PEEK_ROWS = 100
#: parquet row groups are grouped into work units of about this many (uncompressed) bytes
UNIT_BYTES = 64 << 20
BATCH_ROWS = 1024


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
def hf_arrow_files(folder: Path) -> Optional[list[Path]]:
    """The Arrow files of a ``save_to_disk`` folder (a ``Dataset`` or a ``DatasetDict``), or ``None`` when
    ``folder`` is not one."""
    state, splits = folder / "state.json", folder / "dataset_dict.json"
    if state.is_file():
        try:
            names = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
        except (ValueError, KeyError, TypeError):
            return None  # some other state.json: a plain folder
        files = [folder / name for name in names]
        missing = [str(p.name) for p in files if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"--input: {str(folder)!r}: its state.json names Arrow files that are not there ({', '.join(missing[:5])}); "
                "the dataset folder is incomplete: save it again with save_to_disk"
            )
        return files
    if splits.is_file():
        try:
            names = list(json.loads(splits.read_text())["splits"])
        except (ValueError, KeyError, TypeError):
            return None
        files = []
        for name in names:
            sub = hf_arrow_files(folder / name)
            if sub is None:
                raise FileNotFoundError(
                    f"--input: {str(folder)!r}: its dataset_dict.json names the split {name!r}, but {name}/ holds no "
                    "saved dataset (state.json); the dataset folder is incomplete: save it again with save_to_disk"
                )
            files += sub
        return files
    return None


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


# -- bad rows -----------------------------------------------------------------------------------------
_JSON_TYPES = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}


@dataclass
class RowCounts:
    """Rows of one file: used as documents, or skipped and why (the first skipped row kept as an example)."""

    rows: int = 0
    missing: int = 0
    null: int = 0
    not_string: dict = field(default_factory=dict)  # type name -> rows
    invalid: int = 0  # lines that are not a JSON object
    empty: int = 0
    first_bad: Optional[list] = None  # [row, reason]
    error: Optional[str] = None  # the file could not be read to its end (e.g. a truncated gzip)

    def skip(self, what: str, row: int, detail: str = "") -> None:
        if what == "not_string":
            self.not_string[detail] = self.not_string.get(detail, 0) + 1
        else:
            setattr(self, what, getattr(self, what) + 1)
        if self.first_bad is None or row < self.first_bad[0]:
            self.first_bad = [row, what if not detail else f"{what} ({detail})"]

    def take(self, value, row: int) -> Optional[str]:
        """``value`` if it is usable text; otherwise count it and return ``None``."""
        if value is None:
            self.skip("null", row)
        elif not isinstance(value, str):
            self.skip("not_string", row, _JSON_TYPES.get(type(value), type(value).__name__))
        elif not value.strip():
            self.skip("empty", row)
        else:
            self.rows += 1
            return value
        return None

    @property
    def bad(self) -> int:
        return self.missing + self.null + sum(self.not_string.values()) + self.invalid + self.empty

    def merge(self, other: "RowCounts") -> "RowCounts":
        out = RowCounts(self.rows + other.rows, self.missing + other.missing, self.null + other.null,
                        dict(self.not_string), self.invalid + other.invalid, self.empty + other.empty,
                        self.first_bad, self.error or other.error)
        for k, v in other.not_string.items():
            out.not_string[k] = out.not_string.get(k, 0) + v
        if other.first_bad is not None and (out.first_bad is None or other.first_bad[0] < out.first_bad[0]):
            out.first_bad = list(other.first_bad)
        return out

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RowCounts":
        return cls(**data)

    def describe(self, name: str, text_field: str, kind: str) -> Optional[str]:
        """One line for prepare's summary, or ``None`` when every row was used."""
        if not self.bad and not self.error:
            return None
        parts = []
        if self.missing:
            parts.append(f"{self.missing:,} without the field {text_field!r}")
        if self.null:
            parts.append(f"{self.null:,} where it is null")
        if self.not_string:
            parts.append(f"{sum(self.not_string.values()):,} where it is not a string ("
                         + ", ".join(f"{t}: {n:,}" for t, n in sorted(self.not_string.items())) + ")")
        if self.empty:
            parts.append(f"{self.empty:,} where it is empty or only whitespace")
        if self.invalid:
            parts.append(f"{self.invalid:,} line(s) that are not a JSON object")
        line = f"{name}: skipped {self.bad:,} of {self.rows + self.bad:,} rows: " + ", ".join(parts) if parts else \
            f"{name}: read {self.rows:,} rows"
        if self.first_bad is not None:
            where = f"line {self.first_bad[0] + 1}" if kind == "jsonl" else f"row {self.first_bad[0]}"
            line += f" (first: {where})"
        if self.error:
            line += f"; {self.error}"
        return line


# -- checking a file before the run, and cutting it into work units ----------------------------------------
def _is_text_type(t) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    checks = [pa.types.is_string, pa.types.is_large_string]
    if hasattr(pa.types, "is_string_view"):
        checks.append(pa.types.is_string_view)
    return any(check(t) for check in checks)


def _check_column(schema, text_field: str, src: Source, what: str) -> None:
    if text_field not in schema.names:
        have = ", ".join(f"{f.name} ({f.type})" for f in schema)
        raise ValueError(f"--text-field: {text_field!r}: {src.path} has no such {what}; its {what}s are: {have}; "
                         f"choose one with --text-field")
    t = schema.field(text_field).type
    if not _is_text_type(t):
        raise ValueError(f"--text-field: {text_field!r}: the {what} of {src.path} holds {t}, not text; choose a "
                         f"text {what} with --text-field (its {what}s: "
                         + ", ".join(f"{f.name} ({f.type})" for f in schema) + ")")


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _peek_jsonl(src: Source, text_field: str) -> None:
    """Refuse a ``--text-field`` that none of the first ``PEEK_ROWS`` JSON objects of the file has."""
    keys: dict[str, None] = {}
    objects = 0
    try:
        with _open_binary(src.path) as fh:
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
        raise ValueError(f"--input: {str(src.path)!r}: could not be read as {'gzip-compressed ' if src.path.name.lower().endswith('.gz') else ''}"
                         f"JSON Lines ({err}); check the file") from None
    if objects:
        raise ValueError(
            f"--text-field: {text_field!r}: {src.path} has no such field in its first {objects} JSON object(s); their "
            f"fields are: {', '.join(keys) or '(none)'}; choose one with --text-field"
        )


def plan_units(sources: list[Source], text_field: str, unit_bytes: int = UNIT_BYTES) -> list[dict]:
    """Check each row file against ``--text-field`` and cut the inputs into work units (plain dicts, sent to
    the workers as JSON): one per text, JSON Lines or Arrow file, one per group of parquet row groups."""
    units: list[dict] = []
    for src in sources:
        base = {"kind": src.kind, "path": str(src.path.resolve()), "rel": src.rel}
        if src.kind == "parquet":
            import pyarrow.parquet as pq

            try:
                meta = pq.ParquetFile(src.path).metadata
                schema = meta.schema.to_arrow_schema()
            except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a file that is not parquet
                raise ValueError(f"--input: {str(src.path)!r}: could not be read as parquet ({err}); check the file") from None
            _check_column(schema, text_field, src, "column")
            groups, row0, size, start = [], 0, 0, 0
            for g in range(meta.num_row_groups):
                groups.append(g)
                size += meta.row_group(g).total_byte_size
                if size >= unit_bytes or g == meta.num_row_groups - 1:
                    units.append({**base, "groups": groups, "row0": start})
                    start += sum(meta.row_group(i).num_rows for i in groups)
                    groups, size = [], 0
            if meta.num_row_groups == 0:
                units.append({**base, "groups": [], "row0": 0})
        elif src.kind == "arrow":
            import pyarrow as pa

            try:
                with pa.OSFile(str(src.path)) as fh:
                    schema = _open_ipc(fh).schema
            except Exception as err:
                raise ValueError(f"--input: {str(src.path)!r}: could not be read as an Arrow file of a saved dataset "
                                 f"({err}); check the folder") from None
            _check_column(schema, text_field, src, "column")
            units.append(base)
        else:
            if src.kind == "jsonl":
                _peek_jsonl(src, text_field)
            units.append(base)
    for i, unit in enumerate(units):
        unit["id"] = i
    return units


# -- reading documents ------------------------------------------------------------------------------------
def _open_ipc(fh):
    import pyarrow as pa

    try:
        return pa.ipc.open_stream(fh)  # what datasets writes
    except pa.ArrowInvalid:
        fh.seek(0)
        return pa.ipc.open_file(fh)


def _arrow_columns(path: str, text_field: str) -> Iterator:
    import pyarrow as pa

    with pa.OSFile(path) as fh:
        reader = _open_ipc(fh)
        index = reader.schema.get_field_index(text_field)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i).column(index)
        else:
            for batch in reader:
                yield batch.column(index)


def _parquet_columns(path: str, text_field: str, groups: list[int]) -> Iterator:
    import pyarrow.parquet as pq

    if not groups:
        return
    # buffer_size: read column chunks as buffered streams, not whole, so memory stays at about a batch
    pf = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=[text_field], use_threads=False):
        yield batch.column(0)


def _table_documents(columns: Iterator, row0: int, want: Callable[[int], bool], counts: RowCounts) -> Iterator[str]:
    import pyarrow as pa

    row = row0
    for col in columns:
        n = len(col)
        keep = [i for i in range(n) if want(row + i)]
        if keep:
            values = col.take(pa.array(keep, type=pa.int64())).to_pylist()
            for i, value in zip(keep, values):
                doc = counts.take(value, row + i)
                if doc is not None:
                    yield doc
        row += n


def _jsonl_documents(path: Path, text_field: str, want: Callable[[int], bool], counts: RowCounts) -> Iterator[str]:
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


def iter_documents(unit: dict, text_field: str, want: Callable[[int], bool], counts: RowCounts) -> Iterator[str]:
    """The documents of one work unit (a row file or part of one) whose row index ``want`` accepts; every
    accepted row that holds no usable text is counted in ``counts``."""
    kind, path = unit["kind"], unit["path"]
    if kind == "jsonl":
        yield from _jsonl_documents(Path(path), text_field, want, counts)
    elif kind == "parquet":
        yield from _table_documents(_parquet_columns(path, text_field, unit["groups"]), unit["row0"], want, counts)
    elif kind == "arrow":
        yield from _table_documents(_arrow_columns(path, text_field), 0, want, counts)
    else:
        raise ValueError(f"not a row format: {kind}")
