"""What the CRC32s of a distributed (DCP) checkpoint folder cost: at the save and at the resume.

For folders of a few sizes, a real single-rank ``torch.distributed.checkpoint.save`` (fp32 tensors, fsync, as
``SafeModelCheckpoint`` writes one: shards, ``.metadata`` and a small ``meta.pt``) into a temporary folder, then
what ``scalevec_lit/checkpoint/folder.py`` adds to it, one rank:

- **write**: the DCP save itself (no checksums), the reference;
- **checksum**: the save's checksum pass (``checksum_share`` + ``write_checksums``), right after the write, so
  it reads the files from the page cache: its cost is the CRC32's CPU time;
- **structure**: the resume's check without reading the files (``.metadata``, every shard there and long
  enough, ``meta.pt``'s zip directory, every size against ``checksums.json``: ``folder_problem(full=False)``);
- **full (cached)**: ``folder_problem(full=True)`` with the files in the page cache (a resume on the machine
  that wrote them, soon after);
- **full (cold)**: the same after the files were dropped from the page cache (``posix_fadvise(DONTNEED)``:
  a resume on another node or after a reboot); on a network file system this read is the resume's main cost.

Rounds of every size run in the same process, sizes interleaved. Prints a table (medians over rounds), GB/s
of each pass and the ratios checksum/write and full/structure.

    .venv/bin/python benchmarks/checkpoint_checksums.py                       # 64 MiB, 256 MiB, 1 GiB; 2 rounds
    .venv/bin/python benchmarks/checkpoint_checksums.py --sizes 4096 --rounds 1 --dir /shared/scratch
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalevec_lit.checkpoint.folder import checksum_share, folder_problem, write_checksums  # noqa: E402

_TENSOR = 16 << 20  # bytes per tensor: a model's parameters and AdamW moments, in 16 MiB pieces


def state_of(mib: int) -> dict[str, torch.Tensor]:
    count = max(1, (mib << 20) // _TENSOR)
    gen = torch.Generator().manual_seed(mib)
    return {f"layer{i}.weight": torch.randn(_TENSOR // 4, generator=gen) for i in range(count)}


def write(state: dict, folder: Path) -> float:
    import torch.distributed.checkpoint as dcp

    start = time.perf_counter()
    folder.mkdir(parents=True)
    torch.save({"global_step": 1, "epoch": 0, "loops": {}}, folder / "meta.pt")
    dcp.save({"state_dict": state}, storage_writer=dcp.FileSystemWriter(str(folder), sync_files=True))
    with open(folder / "meta.pt", "rb+") as fh:
        os.fsync(fh.fileno())
    return time.perf_counter() - start


def drop_cache(folder: Path) -> None:
    """Evict the folder's (clean, fsynced) pages from the page cache: the next read comes from the disk."""
    for p in folder.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn) -> float:
    start = time.perf_counter()
    result = fn()
    assert result is None, result  # a sound folder: no problem found
    return time.perf_counter() - start


def one_round(mib: int, root: Path) -> dict[str, float]:
    state = state_of(mib)
    folder = root / f"step{mib}.ckpt"
    row = {"write": write(state, folder)}
    del state
    row["checksum"] = timed(lambda: write_checksums(folder, [checksum_share(folder)]))
    row["structure"] = timed(lambda: folder_problem(folder, full=False))
    row["full_cached"] = timed(lambda: folder_problem(folder, full=True))
    drop_cache(folder)
    row["full_cold"] = timed(lambda: folder_problem(folder, full=True))
    row["bytes"] = sum(p.stat().st_size for p in folder.iterdir())
    shutil.rmtree(folder)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024], help="folder sizes in MiB")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where folders are written (default: a temporary folder here)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process, on purpose
    rows: dict[int, list[dict[str, float]]] = {m: [] for m in args.sizes}
    with tempfile.TemporaryDirectory(dir=args.dir or ".", prefix="checkpoint_checksums.") as tmp:
        for r in range(args.rounds):
            order = args.sizes if r % 2 == 0 else list(reversed(args.sizes))
            for mib in order:
                row = one_round(mib, Path(tmp) / f"r{r}")
                rows[mib].append(row)
                print(f"round {r + 1}/{args.rounds} {mib:5d} MiB: write {row['write']:.2f} s, checksum "
                      f"{row['checksum']:.2f} s, structure {row['structure'] * 1e3:.1f} ms, full cached "
                      f"{row['full_cached']:.2f} s, full cold {row['full_cold']:.2f} s", flush=True)
    print(f"\none rank, medians of {args.rounds} round(s); {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}")
    print("| folder | write (no checksums) | checksum pass | checksum/write | structure check | full check, cached "
          "| full check, cold | full cold/structure |")
    print("|---|---|---|---|---|---|---|---|")
    for mib in args.sizes:
        m = {k: statistics.median(r[k] for r in rows[mib]) for k in rows[mib][0]}
        gb = m["bytes"] / 1e9

        def cell(key: str) -> str:
            return f"{m[key]:.2f} s ({gb / m[key]:.2f} GB/s)"

        print(f"| {m['bytes'] / 2**20:,.0f} MiB | {cell('write')} | {cell('checksum')} | "
              f"**{m['checksum'] / m['write']:.2f}×** | {m['structure'] * 1e3:.1f} ms | {cell('full_cached')} | "
              f"{cell('full_cold')} | {m['full_cold'] / m['structure']:,.0f}× |")


if __name__ == "__main__":
    main()
