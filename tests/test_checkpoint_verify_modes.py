"""``SafeModelCheckpoint(verify=auto|sizes|checksums)``: how much of a distributed (DCP) checkpoint folder is
hashed at the save (``checksums.json``) and re-read before a resume (``scalevec_lit/checkpoint/folder.py``).
``checksums`` refuses a flipped byte; ``sizes`` never reads the files but still refuses a shard cut short, a
file of another size or a missing one; ``auto`` hashes a folder of at most ``AUTO_CHECKSUM_BYTES`` (set small
here), at both ends. A bad value is one line naming the key, the value and the choices."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from scalevec_lit.callbacks import SafeModelCheckpoint
from scalevec_lit.callbacks._async_write import record_checksums
from scalevec_lit.checkpoint import folder as folder_mod
from scalevec_lit.checkpoint.folder import CHECKSUMS
from scalevec_lit.checkpoint.verify import CheckpointError
from scalevec_lit.errors import UserError
from scalevec_lit.lit.reshard import load_one_file, verify_folder


def _write_dcp(out: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    generator = torch.Generator().manual_seed(0)
    dcp.save({"state_dict": {"w": torch.randn(64, 64, generator=generator)}}, checkpoint_id=str(out), no_dist=True)
    torch.save({"global_step": 4}, out / "meta.pt")
    return out


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name != CHECKSUMS)


@pytest.fixture()
def written(tmp_path):
    """``verify`` -> a DCP folder whose checksums were recorded under it (one rank)."""
    def make(verify: str, name: str = "step") -> Path:
        out = _write_dcp(tmp_path / verify / f"{name}.ckpt")
        record_checksums(out, 0, 1, True, verify=verify)
        return out
    make.root = tmp_path
    return make


@pytest.fixture()
def no_reads(monkeypatch):
    """Count the files hashed: ``sizes`` reads none."""
    read: list[str] = []
    crc32_of = folder_mod.crc32_of
    monkeypatch.setattr(folder_mod, "crc32_of", lambda path: read.append(Path(path).name) or crc32_of(path))
    return read


def _refused(path: Path, verify: str, problem: str) -> None:
    with pytest.raises(CheckpointError) as info:
        verify_folder(path, 0, 1, verify)
    assert str(info.value).startswith(f"checkpoint {str(path)!r} is truncated or corrupt (ValueError: {problem}")


def test_checksums_records_every_crc32_and_refuses_a_flipped_byte(written):
    folder = written("checksums")
    entries = json.loads((folder / CHECKSUMS).read_text())["crc32"]
    assert sorted(entries) == sorted(p.name for p in folder.iterdir() if p.name != CHECKSUMS)
    assert all(len(entry) == 2 for entry in entries.values())
    shard = next(folder.glob("*.distcp"))
    _flip(shard)
    _refused(folder, "checksums", f"its file {shard.name} fails its CRC32 (the bytes changed since it was written)")


def test_sizes_reads_no_file_but_refuses_a_cut_or_resized_file(written, no_reads):
    folder = written("sizes")
    assert json.loads((folder / CHECKSUMS).read_text()) == {
        "sizes": {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.name != CHECKSUMS}}
    shard = next(folder.glob("*.distcp"))
    _flip(shard)
    verify_folder(folder, 0, 1, "sizes")  # a flipped byte is not seen: nothing was hashed
    verify_folder(folder, 0, 1, "checksums")  # nor can it be at the resume: no CRC32 was recorded
    assert no_reads == []
    with open(folder / "meta.pt", "ab") as fh:
        fh.write(b"\0")
    size = (folder / "meta.pt").stat().st_size
    _refused(folder, "sizes", f"its file meta.pt holds {size} bytes, {size - 1} were written")
    whole = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.truncate(whole - 10)
    _refused(folder, "sizes", f"its shard file {shard.name} holds {whole - 10} bytes, .metadata needs {whole}")
    shard.unlink()
    _refused(folder, "sizes", f"its shard file {shard.name} is missing")
    assert no_reads == []


def test_sizes_at_the_resume_leaves_recorded_crc32s_unread(written, no_reads):
    folder = written("checksums")
    no_reads.clear()
    _flip(next(folder.glob("*.distcp")))
    verify_folder(folder, 0, 1, "sizes")
    assert no_reads == []


def test_auto_hashes_a_folder_up_to_its_threshold_at_the_save_and_the_resume(written, monkeypatch):
    size = _size(_write_dcp(written.root / "auto" / "x.ckpt"))
    monkeypatch.setattr(folder_mod, "AUTO_CHECKSUM_BYTES", size)
    small = written("auto", "a")  # exactly at the threshold (.metadata holds the path: names of one length)
    assert _size(small) == size and set(json.loads((small / CHECKSUMS).read_text())) == {"crc32"}
    shard = next(small.glob("*.distcp"))
    _flip(shard)
    _refused(small, "auto", f"its file {shard.name} fails its CRC32")
    monkeypatch.setattr(folder_mod, "AUTO_CHECKSUM_BYTES", size - 1)  # one byte under: sizes only
    verify_folder(small, 0, 1, "auto")  # recorded with CRC32s, not read above the threshold
    _refused(small, "checksums", f"its file {shard.name} fails its CRC32")  # unless asked for
    large = written("auto", "b")
    assert _size(large) == size and set(json.loads((large / CHECKSUMS).read_text())) == {"sizes"}


def test_a_bad_value_is_refused_in_one_line():
    with pytest.raises(UserError) as info:
        SafeModelCheckpoint(verify="crc")
    assert str(info.value) == ("SafeModelCheckpoint.verify: crc: not one of auto, sizes, checksums; use auto (the "
                               "default: CRC32s for a checkpoint folder of at most 2 GiB per process), sizes or "
                               "checksums")
    assert SafeModelCheckpoint().verify == "auto"


@pytest.mark.parametrize("verify, caught", [("sizes", False), ("checksums", True)])
def test_the_callback_saves_and_resumes_by_its_verify(tmp_path, verify, caught):
    """A synchronous DCP save through the callback (a stand-in trainer of one rank) records what ``verify``
    asks, and the resume ``setup`` installs checks by it."""
    callback = SafeModelCheckpoint(dirpath=str(tmp_path), verify=verify)
    strategy = SimpleNamespace(_save_distributed_checkpoint=True, barrier=lambda name=None: None, global_rank=0,
                               world_size=1, optimizers=[], load_checkpoint=lambda path, *a, **k: "loaded")
    trainer = SimpleNamespace(strategy=strategy, is_global_zero=True, global_rank=0, world_size=1, global_step=4,
                              loggers=[], save_checkpoint=lambda path, weights_only: _write_dcp(Path(path)))
    final = tmp_path / "step000004.ckpt"
    callback._save_checkpoint(trainer, str(final))
    assert set(json.loads((final / CHECKSUMS).read_text())) == {"crc32" if caught else "sizes"}
    load_one_file(strategy, callback.verify)
    _flip(next(final.glob("*.distcp")))
    if caught:
        with pytest.raises(CheckpointError, match="fails its CRC32"):
            strategy.load_checkpoint(str(final))
    else:
        assert strategy.load_checkpoint(str(final)) == "loaded"
