"""Throughput and memory of ``prepare`` on generated parquet and JSON Lines files.

    .venv/bin/python benchmarks/prepare_formats.py --rows 20000 40000 --num-workers 2

For each size it writes one parquet file (row groups of 2,000 rows) and one JSON Lines file of the same
documents (random words, about ``--doc-chars`` characters each), runs
``python -m scalevec_lit prepare --input <file> --output <dir>`` in a subprocess and samples, every 50 ms,
the resident memory (VmRSS) of that process and all its descendants (litdata's workers) from /proc. It
prints rows/s, input MB/s and the peak RSS, summed over the process tree and of the largest process.
A bounded reader shows a peak RSS that does not grow with the input size.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree_rss(root: int) -> tuple[int, int]:
    kids, stack, total, largest = _children(), [root], 0, 0
    while stack:
        pid = stack.pop()
        rss = _rss_kib(pid)
        total, largest = total + rss, max(largest, rss)
        stack += kids.get(pid, [])
    return total, largest


def run_prepare(args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", "prepare", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_total = peak_one = 0
    while proc.poll() is None:
        total, one = _tree_rss(proc.pid)
        peak_total, peak_one = max(peak_total, total), max(peak_one, one)
        time.sleep(0.05)
    wall = time.perf_counter() - start
    out = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"prepare failed ({proc.returncode}):\n{out[-3000:]}")
    return {"wall_s": wall, "peak_tree_mib": peak_total / 1024, "peak_one_mib": peak_one / 1024,
            "last": [line for line in out.splitlines() if line.startswith("prepared")][-1]}


def documents(n: int, chars: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["the", "of", "and", "to", "in", "model", "scale", "vector", "data", "token", "river", "stone",
             "light", "garden", "number", "system", "paper", "music", "winter", "market", "engine", "story"]
    out = []
    for _ in range(n):
        parts, size = [], 0
        while size < chars:
            w = rng.choice(words) if rng.random() < 0.9 else f"{rng.choice(words)}{rng.randrange(1000)}"
            parts.append(w)
            size += len(w) + 1
        out.append(" ".join(parts))
    return out


def main(argv=None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[20000, 40000])
    ap.add_argument("--doc-chars", type=int, default=2000)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--formats", nargs="+", default=["parquet", "jsonl"], choices=["parquet", "jsonl"])
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    try:
        print(f"{'format':8} {'rows':>8} {'input MB':>9} {'wall s':>7} {'rows/s':>8} {'MB/s':>6} "
              f"{'peak RSS tree MiB':>18} {'largest process MiB':>20}")
        for n in args.rows:
            docs = documents(n, args.doc_chars)
            for fmt in args.formats:
                path = tmp / f"docs{n}.{fmt}"
                if fmt == "parquet":
                    pq.write_table(pa.table({"id": list(range(n)), "text": docs}), path, row_group_size=2000)
                else:
                    with open(path, "w") as fh:
                        for i, d in enumerate(docs):
                            fh.write(json.dumps({"id": i, "text": d}) + "\n")
                mb = sum(len(d.encode()) for d in docs) / 1e6
                r = run_prepare(["--input", str(path), "--output", str(tmp / f"out-{fmt}-{n}"),
                                 "--num-workers", str(args.num_workers)])
                print(f"{fmt:8} {n:>8,} {mb:>9.1f} {r['wall_s']:>7.1f} {n / r['wall_s']:>8,.0f} "
                      f"{mb / r['wall_s']:>6.2f} {r['peak_tree_mib']:>18.0f} {r['peak_one_mib']:>20.0f}", flush=True)
                path.unlink()
                shutil.rmtree(tmp / f"out-{fmt}-{n}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
