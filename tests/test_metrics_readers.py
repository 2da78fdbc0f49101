"""The readers of other loggers' files (scalevec_lit/study/metrics_readers.py) on files written here by hand,
and the sinks' handling of a logger of unknown kind (callbacks/_log_sinks.py). The same readers on files a
real fit wrote: tests/test_loggers.py."""
from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np
import pytest

from scalevec_lit.callbacks._log_sinks import Histogram, log_to_loggers, takes_figures
from scalevec_lit.study.events import read_scalars
from scalevec_lit.study.metrics_readers import read_csv, read_mlflow, read_wandb, wandb_records

BLOCK = 32768


def _wandb_file(records: list[bytes]) -> bytes:
    """W&B's record log as its format is documented: a 7-byte header, then in 32 KiB blocks chunks of
    (CRC32, 2-byte length, type: 1 full, 2 first, 3 middle, 4 last), a block's tail under 7 bytes zero-padded."""
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for rec in records:
        first = True
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < 7:
                out += b"\0" * left
                continue
            part, rec = rec[:left - 7], rec[left - 7:]
            kind = (1 if not rec else 2) if first else (4 if not rec else 3)
            out += struct.pack("<IHB", zlib.crc32(bytes([kind]) + part), len(part), kind) + part
            first = False
            if not rec:
                break
    return bytes(out)


def _history(step: int, **values) -> bytes:
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    rec = pb.Record()
    for key, value in {**values, "trainer/global_step": step}.items():
        item = rec.history.item.add()
        item.key = key
        item.value_json = json.dumps(value)
    return rec.SerializeToString()


def test_wandb_records_across_blocks_padding_and_a_cut_end(tmp_path):
    big = "x" * 70000  # spans three blocks: first, middle, last
    records = [_history(0, **{"val/loss": 2.5}), _history(1, note=big, **{"val/loss": 2.25})]
    # a record that ends fewer than 7 bytes before its block's end: the next one starts after zero padding
    size = len(_wandb_file(records))
    filler = next(r for n in range(BLOCK) for r in [_history(2, note="z" * n)]
                  if 0 < BLOCK - (size + 7 + len(r)) % BLOCK < 7 and size + 7 + len(r) < BLOCK * 3)
    records.append(filler)
    assert 0 < BLOCK - len(_wandb_file(records)) % BLOCK < 7
    records.append(_history(3, **{"val/loss": 1.75, "train/loss": 3.0}))
    data = _wandb_file(records)
    run = tmp_path / "wandb" / "offline-run-1" / "run-abc.wandb"
    run.parent.mkdir(parents=True)
    run.write_bytes(data)
    assert [len(r) for r in wandb_records(run)] == [len(r) for r in records]
    assert list(wandb_records(run))[1] == records[1]
    assert read_wandb(tmp_path, ("val/",)) == {"val/loss": {0: 2.5, 1: 2.25, 3: 1.75}}
    assert read_wandb(tmp_path, ("train/",)) == {"train/loss": {3: 3.0}}
    run.write_bytes(data[:-5])  # a run killed while writing: its last record is left out
    assert read_wandb(tmp_path, ("val/",)) == {"val/loss": {0: 2.5, 1: 2.25}}


def test_csv_and_mlflow_files_read_the_value_written_last(tmp_path):
    older, newer = tmp_path / "csv" / "version_0", tmp_path / "csv" / "version_1"
    for folder, rows in ((older, "step,val/loss,epoch\n1,3.5,0\n3,3.0,0\n"), (newer, "val/loss,step\n2.5,3\n,4\n")):
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(rows)
    os.utime(older / "metrics.csv", (1, 1))
    assert read_csv(tmp_path) == {"val/loss": {1: 3.5, 3: 2.5}, "epoch": {1: 0.0, 3: 0.0}}
    run = tmp_path / "mlruns" / "1" / "abc"
    (run / "metrics" / "val").mkdir(parents=True)
    (run / "meta.yaml").write_text("run_id: abc\n")
    (run / "metrics" / "val" / "loss").write_text("1700000000000 2.0 5\n1700000000001 1.5 6\n")
    assert read_mlflow(tmp_path) == {"val/loss": {5: 2.0, 6: 1.5}}
    assert read_scalars(tmp_path, ("val/",)) == {"val/loss": [(1, 3.5), (3, 2.5), (5, 2.0), (6, 1.5)]}


def test_a_logger_of_unknown_kind_gets_the_scalars_only():
    class Plain:
        def __init__(self):
            self.calls = []

        def log_metrics(self, metrics, step):
            self.calls.append((dict(metrics), step))

    plain = Plain()
    assert not takes_figures([plain])
    log_to_loggers([plain], 7, {"a": 1.0}, {"h": np.ones(3)}, {"i": np.zeros((2, 2, 3), np.uint8)})
    assert plain.calls == [({"a": 1.0}, 7)]
    h = Histogram.of(np.array([0.0, 1.0, np.nan, np.inf, 1.0]))
    assert (h.counts.sum(), h.counts[0], h.counts[-1], h.nonfinite, h.edges[0], h.edges[-1]) == (3, 1, 2, 2, 0.0, 1.0)


def test_a_wandb_run_without_the_wandb_package_is_one_line(tmp_path, monkeypatch):
    import sys

    from scalevec_lit.errors import UserError

    run = tmp_path / "wandb" / "offline-run-1" / "run-abc.wandb"
    run.parent.mkdir(parents=True)
    run.write_bytes(_wandb_file([b""]))
    monkeypatch.setitem(sys.modules, "wandb.proto", None)  # as if wandb were not installed
    with pytest.raises(UserError) as err:
        read_scalars(tmp_path)
    assert str(err.value) == (f"W&B run file: {run}: reading it needs the wandb package, which is not installed; "
                              "pip install 'scalevec-lit[wandb]'")
