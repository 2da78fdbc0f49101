"""benchmarks/gpu_check.sh runs end to end on CPU as a dry run (tiny sizes, fp32, FSDP2 with one rank)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import ROOT


@pytest.mark.slow
def test_gpu_check_dry_run_on_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = {(r["size"], r["preset"]): r for r in result["rows"]}
    assert set(rows) == {(s, p) for s in ("tiny", "tiny_deep") for p in ("baseline", "unified")}
    for r in rows.values():
        assert r["finite"] and r["tokens_per_s"] > 0 and 0 < r["mfu"]
        assert r["syncs"] is None and r["sync_sites"] == []  # counted on CUDA only (set_sync_debug_mode)
    assert rows[("tiny", "unified")]["params"] > rows[("tiny", "baseline")]["params"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| tiny | unified |" in table and "matmul peak" in table
    assert "| syncs/step |" in table and "n/a (CPU) |" in table
    assert (tmp_path / "gpu_check.log").exists() and (tmp_path / "env.txt").exists()
