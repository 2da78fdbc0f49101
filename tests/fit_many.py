"""Run several ``python -m scalevec_lit`` commands one after another in the same processes, under one launch:

    python -m torch.distributed.run --nproc_per_node 2 tests/fit_many.py <commands.json> <results.json>

``commands.json`` is a list of argument lists (``["fit", "--config", ...]``). Every rank runs every command
(Lightning reads torchrun's environment, so each ``fit`` uses the same 2 processes and process group);
one launch and one import of torch/Lightning serve them all, and torch.compile's caches are shared.
Rank 0 writes ``results.json``: the exit code and wall time of each command. Used by
``tests/test_global_batch.py``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    commands = json.loads(Path(sys.argv[1]).read_text())
    from scalevec_lit.cli import main as cli_main

    results = []
    for argv in commands:
        start = time.perf_counter()
        code = 0
        try:
            cli_main(list(argv))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        results.append({"argv": argv, "code": code, "seconds": round(time.perf_counter() - start, 1)})
        print(f"fit_many: rank {os.environ.get('RANK')}: {code} in {results[-1]['seconds']} s: {' '.join(argv[:3])}",
              file=sys.stderr, flush=True)
        if code != 0:  # the other rank stopped too (Lightning raises on every rank); later commands would hang
            break
    if os.environ.get("RANK", "0") == "0":
        Path(sys.argv[2]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
