"""A Hugging Face ``datasets`` folder written by ``save_to_disk`` (``state.json`` naming ``data-*.arrow`` files, or a
``DatasetDict``: ``dataset_dict.json`` and one such folder per split, all splits read): the Arrow IPC stream files
are read with pyarrow, one record batch at a time, so the ``datasets`` library is not needed.

Must not import Lightning.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Optional

from .tables import check_column


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


def check_arrow(path: Path, text_field: str) -> None:
    """Refuse an Arrow file that cannot be read, or whose ``--text-field`` column is missing or not text."""
    import pyarrow as pa

    try:
        with pa.OSFile(str(path)) as fh:
            schema = open_ipc(fh).schema
    except Exception as err:
        raise ValueError(f"--input: {str(path)!r}: could not be read as an Arrow file of a saved dataset "
                         f"({err}); check the folder") from None
    check_column(schema, text_field, path, "column")


def open_ipc(fh):
    import pyarrow as pa

    try:
        return pa.ipc.open_stream(fh)  # what datasets writes
    except pa.ArrowInvalid:
        fh.seek(0)
        return pa.ipc.open_file(fh)


def arrow_columns(path: str, text_field: str) -> Iterator:
    """The ``text_field`` column of the file, one record batch at a time."""
    import pyarrow as pa

    with pa.OSFile(path) as fh:
        reader = open_ipc(fh)
        index = reader.schema.get_field_index(text_field)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i).column(index)
        else:
            for batch in reader:
                yield batch.column(index)
