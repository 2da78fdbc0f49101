"""What the Arrow-backed formats share (parquet, a saved dataset): the text column's check before the run, and
the documents of a stream of that column's record batches (memory bounded by one batch).

Must not import Lightning.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from .rows import RowCounts


def is_text_type(t) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    checks = [pa.types.is_string, pa.types.is_large_string]
    if hasattr(pa.types, "is_string_view"):
        checks.append(pa.types.is_string_view)
    return any(check(t) for check in checks)


def check_column(schema, text_field: str, path: Path, what: str) -> None:
    if text_field not in schema.names:
        have = ", ".join(f"{f.name} ({f.type})" for f in schema)
        raise ValueError(f"--text-field: {text_field!r}: {path} has no such {what}; its {what}s are: {have}; "
                         f"choose one with --text-field")
    t = schema.field(text_field).type
    if not is_text_type(t):
        raise ValueError(f"--text-field: {text_field!r}: the {what} of {path} holds {t}, not text; choose a "
                         f"text {what} with --text-field (its {what}s: "
                         + ", ".join(f"{f.name} ({f.type})" for f in schema) + ")")


def table_documents(columns: Iterator, row0: int, want: Callable[[int], bool], counts: RowCounts) -> Iterator[str]:
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
