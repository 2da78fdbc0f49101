"""A run's scalars from the files its loggers wrote, whichever Lightning logger it had (``events.read_scalars``
reads TensorBoard events and merges these):

- CSV (``CSVLogger``): every ``metrics.csv`` under the folder, one column per tag, a ``step`` column;
- MLflow file store (``MLFlowLogger`` with a ``file:`` tracking URI): every run folder (``meta.yaml`` beside
  ``metrics/``) under the folder; each metric is a file ``metrics/<tag>`` of ``timestamp value step`` lines;
- Weights & Biases offline runs (``WandbLogger``): every ``run-*.wandb`` file under the folder, W&B's
  append-only record log (a 7-byte header, then 32 KiB blocks of chunks: CRC32, length, type); each
  history record holds one ``log`` call's values as JSON and, from Lightning, ``trainer/global_step``.

Each returns ``tag -> {step: value}`` for the tags that start with one of ``prefixes``, the value written last
for a step. W&B files need the ``wandb`` package (its record format); the others need nothing.
"""
from __future__ import annotations

import csv
import json
import struct
from pathlib import Path
from typing import Iterator

__all__ = ["read_csv", "read_mlflow", "read_wandb", "read_logged", "wandb_history", "wandb_records"]

Series = dict[str, dict[int, float]]
WANDB_STEP = "trainer/global_step"  # the x axis Lightning's WandbLogger logs with every row


def _wanted(tag: str, prefixes: tuple[str, ...]) -> bool:
    return any(tag.startswith(p) for p in prefixes)


def _newest_last(paths) -> list[Path]:
    return sorted(paths, key=lambda p: (p.stat().st_mtime, str(p)))


def read_csv(folder: Path, prefixes: tuple[str, ...] = ("",)) -> Series:
    out: Series = {}
    for path in _newest_last(Path(folder).rglob("metrics.csv")):
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                step = row.get("step")
                if not step:
                    continue
                for tag, value in row.items():
                    if tag != "step" and value not in (None, "") and _wanted(tag, prefixes):
                        out.setdefault(tag, {})[int(float(step))] = float(value)
    return out


def read_mlflow(folder: Path, prefixes: tuple[str, ...] = ("",)) -> Series:
    out: Series = {}
    runs = [m.parent for m in Path(folder).rglob("meta.yaml") if (m.parent / "metrics").is_dir()]
    for run in _newest_last(runs):
        metrics = run / "metrics"
        for path in sorted(p for p in metrics.rglob("*") if p.is_file()):
            tag = path.relative_to(metrics).as_posix()
            if not _wanted(tag, prefixes):
                continue
            series = out.setdefault(tag, {})
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 3:
                    series[int(parts[2])] = float(parts[1])
    return out


def wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a W&B run file (``run-*.wandb``), in order; a record cut short at the end is left out."""
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        return
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too short for a chunk header is zero padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        if kind == 0 or len(chunk) < length:
            break
        pos += 7 + length
        if kind == 1:  # full
            yield chunk
        elif kind == 2:  # first
            pending = chunk
        elif kind == 3:  # middle
            pending += chunk
        elif kind == 4:  # last
            yield pending + chunk
            pending = b""


def wandb_history(path: Path) -> Iterator[tuple[int, dict]]:
    """``(step, values)`` of every history record (one ``log`` call) of a W&B run file, in order: ``values``
    maps each key to its value decoded from JSON (a media value, such as a histogram or an image, as the dict
    of its fields); ``step`` is ``trainer/global_step`` where the row has it, else W&B's own step."""
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError:
        from ..errors import UserError

        raise UserError("W&B run file", str(path), "reading it needs the wandb package, which is not installed",
                        "pip install 'scalevec-lit[wandb]'") from None

    for raw in wandb_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        values: dict = {}
        for item in record.history.item:
            keys = list(item.nested_key) or [item.key]
            target = values
            for key in keys[:-1]:
                target = target.setdefault(key, {})
            target[keys[-1]] = json.loads(item.value_json)
        yield int(values.get(WANDB_STEP, record.history.step.num)), values


def read_wandb(folder: Path, prefixes: tuple[str, ...] = ("",)) -> Series:
    out: Series = {}
    for path in _newest_last(Path(folder).rglob("run-*.wandb")):
        for step, values in wandb_history(path):
            for tag, value in values.items():
                if (tag != WANDB_STEP and not tag.startswith("_") and isinstance(value, (int, float))
                        and not isinstance(value, bool) and _wanted(tag, prefixes)):
                    out.setdefault(tag, {})[step] = float(value)
    return out


def read_logged(folder: Path, prefixes: tuple[str, ...] = ("",)) -> Series:
    """The scalars of every CSV, MLflow file-store and W&B offline run under ``folder``, merged."""
    out: Series = {}
    for reader in (read_csv, read_mlflow, read_wandb):
        for tag, series in reader(folder, prefixes).items():
            out.setdefault(tag, {}).update(series)
    return out

