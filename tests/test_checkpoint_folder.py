"""A distributed (DCP) checkpoint folder is checked before it is read (``scalevec_lit/checkpoint/folder.py``):
a flipped byte in a shard, a shard cut short or gone, a missing ``.metadata`` or a damaged ``meta.pt`` is
refused with one line naming the folder, instead of resuming other weights (a flipped byte) or stopping with
torch's ``CheckpointException`` as an internal error. ``SafeModelCheckpoint`` records every file's size and
CRC32 in ``checksums.json`` (each rank hashes a share), synchronously and with ``async_save``."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from helpers import ROOT, run_cli, smoke_args
from scalevec_lit.checkpoint.folder import CHECKSUMS, checksum_share, write_checksums
from scalevec_lit.checkpoint.verify import CheckpointError, verify_checkpoint


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture()
def folder(tmp_path) -> Path:
    """A DCP folder as ModelParallelStrategy lays it out (shards, ``.metadata``, ``meta.pt``), with checksums."""
    import torch.distributed.checkpoint as dcp

    out = tmp_path / "checkpoints" / "step000004.ckpt"
    generator = torch.Generator().manual_seed(0)
    dcp.save({"state_dict": {"w": torch.randn(64, 64, generator=generator)}}, checkpoint_id=str(out), no_dist=True)
    torch.save({"global_step": 4}, out / "meta.pt")
    write_checksums(out, [checksum_share(out, 0, 2), checksum_share(out, 1, 2)])
    return out


def _refused(path: Path, problem: str) -> None:
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(path, full=True)
    assert str(info.value).startswith(f"checkpoint {str(path)!r} is truncated or corrupt (ValueError: {problem}")


def test_the_checksums_cover_every_file_once(folder):
    entries = json.loads((folder / CHECKSUMS).read_text())["crc32"]
    assert sorted(entries) == sorted(p.name for p in folder.iterdir() if p.name != CHECKSUMS)
    assert entries["meta.pt"][0] == (folder / "meta.pt").stat().st_size
    assert verify_checkpoint(folder, full=True) == folder


def test_a_flipped_byte_in_a_shard_is_refused(folder):
    shard = next(folder.glob("*.distcp"))
    _flip(shard, shard.stat().st_size // 2)
    verify_checkpoint(folder, full=False)  # sizes only: the cheap check on the command line passes
    _refused(folder, f"its file {shard.name} fails its CRC32 (the bytes changed since it was written)")


def test_a_cut_or_missing_shard_is_refused_also_without_checksums(folder):
    (folder / CHECKSUMS).unlink()  # a folder written before checksums were recorded: .metadata's sizes
    shard = next(folder.glob("*.distcp"))
    size = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.truncate(size - 10)
    _refused(folder, f"its shard file {shard.name} holds {size - 10} bytes, .metadata needs {size}")
    shard.unlink()
    _refused(folder, f"its shard file {shard.name} is missing")


def test_a_missing_index_or_a_damaged_meta_pt_is_refused(folder):
    meta = folder / "meta.pt"
    meta.write_bytes(meta.read_bytes()[:100])
    _refused(folder, "its meta.pt is not a complete torch archive (BadZipFile: ")
    (folder / ".metadata").unlink()
    _refused(folder, "its .metadata (the index of the shards) is missing")


def test_a_sound_folder_under_a_one_file_strategy_names_the_strategy_that_loads_it(folder):
    """Resuming an FSDP2 checkpoint with the default or DDP strategy: it was ``[Errno 21] Is a directory``."""
    from scalevec_lit.callbacks.checkpoint import SafeCheckpointIO
    from scalevec_lit.errors import exit_code_for

    with pytest.raises(CheckpointError) as info:
        SafeCheckpointIO().load_checkpoint(folder)
    assert str(info.value) == (
        f"--ckpt_path: {str(folder)!r}: is a distributed (FSDP2) checkpoint folder, which loads only under "
        "ModelParallelStrategy, on any number of processes; resume with that strategy, e.g. "
        "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy --trainer.strategy.data_parallel_size=1 "
        "--trainer.devices=1 for one process (or export it: python -m scalevec_lit export --ckpt <folder> ...)")
    assert exit_code_for(info.value) == 2


def _ckpt_yaml(root: Path, async_save: bool) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "ckpt.yaml"
    path.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 2,"
        f" save_last: true, save_top_k: -1, async_save: {str(async_save).lower()}, verify: checksums}}\n")
    return path


def _fsdp(data: Path, root: Path, steps: int, devices: int, async_save: bool, *extra: str) -> list[str]:
    return smoke_args(
        data, root, steps, "--config", str(_ckpt_yaml(root, async_save)), f"--trainer.devices={devices}",
        "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
        f"--trainer.strategy.data_parallel_size={devices}", "--trainer.strategy.tensor_parallel_size=1",
        "--trainer.strategy.process_group_backend=gloo", "--trainer.limit_val_batches=0", "--data.batch_size=4",
        "--model.config.n_layer=1", "--model.config.n_embd=32", "--model.config.n_head=2",
        "--model.config.n_kv_head=1", "--model.config.seq_len=32", *extra)


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [True])  # a synchronous save's checksums: tests/test_distributed.py
def test_a_run_records_checksums_and_a_resume_refuses_a_changed_shard(prepared_data, tmp_path, async_save):
    root = tmp_path / "run"
    env = {"OMP_NUM_THREADS": "1"}
    done = run_cli(_fsdp(prepared_data, root, 4, 2, async_save), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    last = root / "checkpoints" / "last.ckpt"
    entries = json.loads((last / CHECKSUMS).read_text())["crc32"]
    assert sorted(entries) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]  # both ranks' shards
    assert verify_checkpoint(last, full=True) == last
    copy = tmp_path / "copy"
    shutil.copytree(root / "checkpoints", copy / "checkpoints", ignore=shutil.ignore_patterns(".lock*"))
    # __0_0.distcp is rank 1's share of the check on 2 processes: rank 0 must stop with the same line
    _flip(copy / "checkpoints" / "last.ckpt" / "__0_0.distcp", 1000)
    # last.ckpt, a copy of step000004.ckpt made by copytree, has its mtime: --ckpt_path last would pick either
    # by set order (the same state, but this test flips last.ckpt only); make it the newest
    os.utime(copy / "checkpoints" / "last.ckpt")
    resumed = run_cli(_fsdp(prepared_data, copy, 6, 2, async_save, "--ckpt_path=last"), cwd=tmp_path, env=env)
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("error:")]
    folder = copy / "checkpoints"
    expected = (f"error: checkpoint '{folder / 'last.ckpt'}' is truncated or corrupt (ValueError: its file "
                "__0_0.distcp fails its CRC32 (the bytes changed since it was written)); resume from another "
                f"checkpoint in {folder} (step000002.ckpt, step000004.ckpt)")
    assert lines and set(lines) == {expected}, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
