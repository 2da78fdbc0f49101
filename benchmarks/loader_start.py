"""What loader workers cost to start: forked from the reading process (Python's default on Linux until 3.14)
against started from the fork server (what the data module does with ``data.num_workers`` above 0,
``scalevec_lit/data/loader_workers.py``).

Each round runs one fresh interpreter per start method (``fork``, ``forkserver``), alternating, so a shared
machine's drift hits both. In it, the data module's train loader over the embedded corpus (prepared into a
temporary folder once, before the rounds) is iterated for ``--epochs`` passes of ``--batches`` batches, each
pass starting new workers as a fit's epoch does (and each validation run). Per method, the medians over the
rounds of: the time to the first batch of the first pass (the fork server starts then and imports torch and
litdata), of a later pass (the server is warm), the CPU seconds of the whole process tree (the fork server is
stopped and reaped before the process ends, so its own and its workers' count) and the process's wall time. Prints a table
and the forkserver/fork ratios.

    .venv/bin/python benchmarks/loader_start.py                       # 2 workers, 3 passes, 3 rounds
    .venv/bin/python benchmarks/loader_start.py --workers 4 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from scalevec_lit.data.datamodule import TokenDataModule
import scalevec_lit.data.datamodule as dm
method, data, workers, epochs, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if method == "fork":  # the loaders as they were: workers forked from this process
    forkserver_args = dm.worker_args
    dm.worker_args = lambda n, remote: {**forkserver_args(n, remote), "multiprocessing_context": None}
module = TokenDataModule(data, seq_len=64, batch_size=4, num_workers=workers)
loader = module.train_dataloader()
firsts = []
for _ in range(epochs):
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    firsts.append(time.perf_counter() - start)
    for _ in range(batches - 1):
        next(it)
    del it
if method == "forkserver":  # end the server now and reap it, so that its CPU (and its workers') is counted
    from multiprocessing import forkserver
    forkserver._forkserver._stop()
print(json.dumps({"first": firsts}))
"""


def _run(method: str, data: Path, args) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, method, str(data), str(args.workers), str(args.epochs),
                          str(args.batches)], capture_output=True, text=True, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"first": result["first"][0], "later": statistics.median(result["first"][1:]), "cpu": cpu,
            "wall": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3, help="passes, each starting new workers (at least 2)")
    parser.add_argument("--batches", type=int, default=20, help="batches read per pass")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (the later passes are measured apart from the first)")
    sys.path.insert(0, str(ROOT))
    from scalevec_lit.data.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "shakespeare"
        prepare(output_dir=data, num_workers=1)
        rows: dict[str, list[dict]] = {"fork": [], "forkserver": []}
        for _ in range(args.rounds):
            for method in rows:
                rows[method].append(_run(method, data, args))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("first", "later", "cpu", "wall")}
           for m, rs in rows.items()}
    print(f"loader workers: {args.workers}, {args.epochs} passes of {args.batches} batches, {args.rounds} rounds; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"{'start method':<12} {'first batch, 1st pass (s)':>26} {'first batch, later pass (s)':>28} "
          f"{'process CPU (s)':>16} {'process wall (s)':>17}")
    for method, m in med.items():
        print(f"{method:<12} {m['first']:>26.3f} {m['later']:>28.3f} {m['cpu']:>16.2f} {m['wall']:>17.2f}")
    ratio = {k: med["forkserver"][k] / med["fork"][k] for k in ("first", "later", "cpu", "wall")}
    print("forkserver / fork: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))


if __name__ == "__main__":
    main()
