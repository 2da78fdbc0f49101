"""What ``prepare``'s ordered mode costs: the same inputs prepared with litdata's ordered hand-out (each worker a
contiguous slice, in order: what ``prepare`` uses, so that the same inputs give the same chunks) against its
shared work queue (litdata's default, whatever order the workers ask in), alternating, in one process.

    .venv/bin/python benchmarks/prepare_order.py --input data/corpus/docs/train --num-workers 2 --rounds 2

Prints the wall time of each preparation, the median of each mode and their ratio, and whether each mode gave
the same chunks at every round (the ordered one must; the queue usually does not).
"""
from __future__ import annotations

import argparse
import json
import platform
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _prepare(src: str, out: Path, workers: int, ordered: bool) -> tuple[float, str]:
    import litdata

    from scalevec_lit.data.prepare import prepare
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER

    original = litdata.optimize
    litdata.optimize = partial(lambda *a, _ordered, **kw: original(*a, **{**kw, "keep_data_ordered": _ordered}),
                               _ordered=ordered)
    try:
        start = time.perf_counter()
        meta = prepare(src, DEFAULT_TOKENIZER, out, num_workers=workers)
        took = time.perf_counter() - start
    finally:
        litdata.optimize = original
    return took, json.dumps(meta["chunks"], sort_keys=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="a text folder (prepare's --input)")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    times: dict[str, list[float]] = {"ordered": [], "queue": []}
    chunks: dict[str, set[str]] = {"ordered": set(), "queue": set()}
    with tempfile.TemporaryDirectory(prefix="prepare-order-") as tmp:
        for r in range(args.rounds):
            for mode in ("ordered", "queue"):
                took, record = _prepare(args.input, Path(tmp) / f"{mode}{r}", args.num_workers, mode == "ordered")
                times[mode].append(took)
                chunks[mode].add(record)
    print(f"prepare {args.input}: {args.num_workers} workers, {args.rounds} rounds; {platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"{'mode':<10}{'wall (s) per round':>30}{'median (s)':>12}{'same chunks every round':>26}")
    for mode in ("ordered", "queue"):
        walls = " ".join(f"{t:.1f}" for t in times[mode])
        print(f"{mode:<10}{walls:>30}{statistics.median(times[mode]):>12.1f}{str(len(chunks[mode]) == 1):>26}")
    print(f"ordered / queue: {statistics.median(times['ordered']) / statistics.median(times['queue']):.2f}x wall")


if __name__ == "__main__":
    main()
