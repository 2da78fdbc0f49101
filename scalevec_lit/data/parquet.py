"""Parquet (``.parquet``): the column ``--text-field``, read with pyarrow in record batches of that column only
(``ParquetFile.iter_batches``); the row groups of a large file are shared out between workers (work units of
about ``UNIT_BYTES``).

Must not import Lightning.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .tables import check_column

PARQUET_SUFFIXES = (".parquet",)
#: parquet row groups are grouped into work units of about this many (uncompressed) bytes
UNIT_BYTES = 64 << 20
BATCH_ROWS = 1024


def parquet_units(path: Path, text_field: str, base: dict, unit_bytes: int = UNIT_BYTES) -> list[dict]:
    """Check the file's ``--text-field`` column and cut it into work units (``base`` plus its row groups and the
    index of its first row): one per group of row groups of about ``unit_bytes``."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
        schema = meta.schema.to_arrow_schema()
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a file that is not parquet
        raise ValueError(f"--input: {str(path)!r}: could not be read as parquet ({err}); check the file") from None
    check_column(schema, text_field, path, "column")
    units: list[dict] = []
    groups, size, start = [], 0, 0
    for g in range(meta.num_row_groups):
        groups.append(g)
        size += meta.row_group(g).total_byte_size
        if size >= unit_bytes or g == meta.num_row_groups - 1:
            units.append({**base, "groups": groups, "row0": start})
            start += sum(meta.row_group(i).num_rows for i in groups)
            groups, size = [], 0
    if meta.num_row_groups == 0:
        units.append({**base, "groups": [], "row0": 0})
    return units


def parquet_columns(path: str, text_field: str, groups: list[int]) -> Iterator:
    """The ``text_field`` column of the row groups ``groups``, one record batch of ``BATCH_ROWS`` at a time."""
    import pyarrow.parquet as pq

    if not groups:
        return
    # buffer_size: read column chunks as buffered streams, not whole, so memory stays at about a batch
    pf = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=[text_field], use_threads=False):
        yield batch.column(0)
