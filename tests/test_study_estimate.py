"""The expected wall time of a study (``study/estimate.py``, ``study plan``): the formula on hand values, the
plan it reads from ``fit --print_plan --plan_json``, and the CPU estimate from complete runs."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from scalevec_lit.study.estimate import (PEAK_BF16, STARTUP_S, cpu_estimate, format_gpu, gpu_estimate,
                                         is_gpu_study, run_flops)
from scalevec_lit.errors import UserError
from scalevec_lit.study.spec import load_study

ROOT = Path(__file__).resolve().parents[1]


def _plan(**kw) -> dict:
    plan = {"recipes": "r", "devices": 1, "flops_per_token": 1.0e9, "params_total": 100, "params_active": 100,
            "micro_tokens": 1000, "seq_len": 100, "data_parallel": 2, "tokens_per_step": 8000, "max_steps": 100,
            "val_check_interval": 25, "limit_val_batches": 10, "accelerator": "gpu", "compile": True}
    plan.update(kw)
    return plan


def test_run_flops_on_hand_values(monkeypatch):
    study = load_study(ROOT / "recipes/ablation/claims_0.12b.yaml")
    study.callbacks = {}
    f = run_flops(_plan(), study)
    assert f["train"] == 100 * 8000 * 1.0e9
    assert f["val"] == 4 * 10 * 1000 * 2 * 1.0e9 / 3.0          # 4 evaluations of 10 batches, forward only
    assert f["monitor"] == 0.0 and f["total"] == f["train"] + f["val"] and f["tokens"] == 800_000
    # a fractional limit_val_batches (a share of the split) is not countable: validation left out, not guessed
    assert run_flops(_plan(limit_val_batches=None), study)["val"] == 0.0
    # the sharpness monitor: (steps / N + 1) calls × iterations × subsets × 2 problems × its tokens × 3
    # (an HVP ~ three forward-backward passes); its batch is the first val batch (micro-batch tokens) or batch_size rows of seq_len
    study.callbacks = {"scalevec_lit.callbacks.SharpnessMonitor": {"every_n_steps": 20, "iterations": 10,
                                                                   "params": ["all", "scales:input"]}}
    assert run_flops(_plan(), study)["monitor"] == 6 * 10 * 2 * 2 * 1000 * 3.0 * 1.0e9
    study.callbacks["scalevec_lit.callbacks.SharpnessMonitor"].update(batch_size=4, params="all", precondition=False)
    assert run_flops(_plan(), study)["monitor"] == 6 * 10 * 1 * 1 * 400 * 3.0 * 1.0e9
    # no global batch in the recipe: micro-batch tokens × data-parallel ranks
    assert run_flops(_plan(tokens_per_step=None), study)["train"] == 100 * 2000 * 1.0e9


def test_gpu_estimate_divides_by_devices_peak_and_mfu():
    study = load_study(ROOT / "recipes/ablation/claims_0.12b.yaml")
    plans = {1: _plan(devices=1), 8: _plan(devices=8)}
    rows = gpu_estimate(study, [1, 8], "H200", 0.5, plans=plans)
    total = run_flops(plans[1], study)["total"]
    assert rows[0]["run_s"] == pytest.approx(total / (PEAK_BF16["H200"] * 0.5) + STARTUP_S, rel=1e-12)
    assert rows[1]["run_s"] == pytest.approx(total / (8 * PEAK_BF16["H200"] * 0.5) + STARTUP_S, rel=1e-12)
    assert rows[0]["study_s"] == len(study.runs()) * rows[0]["run_s"]
    assert rows[0]["run_s"] > rows[1]["run_s"]
    text = format_gpu(rows, study)
    assert "1 × H200" in text and "8 × H200" in text and "MFU 0.50" in text
    with pytest.raises(UserError, match="^study plan: --device: V100: is not known; give one of A100, H100, H200$"):
        gpu_estimate(study, [1], "V100", 0.35, plans=plans)
    with pytest.raises(UserError, match=r"^study plan: --mfu: 1.5: must be in \(0, 1\]; e.g. --mfu 0.35$"):
        gpu_estimate(study, [1], "H200", 1.5, plans=plans)


def test_cpu_estimate_from_complete_runs(tmp_path):
    study = load_study(ROOT / "recipes/ablation/iwd_cpu.yaml")  # 3 variants × 3 seeds
    assert not is_gpu_study(study) and is_gpu_study(load_study(ROOT / "recipes/ablation/claims_0.12b.yaml"))
    assert cpu_estimate(study, tmp_path) is None
    for i, wall in enumerate([100.0, 200.0, 300.0]):
        d = tmp_path / f"v{i}" / "seed1"
        d.mkdir(parents=True)
        (d / "done.json").write_text(json.dumps({"wall_s_last_attempt": wall}))
    est = cpu_estimate(study, tmp_path)
    assert est == {"complete": 3, "mean_run_s": 200.0, "left": 6, "left_s": 1200.0}


@pytest.mark.slow
def test_study_plan_command_reads_the_recipe_plan():
    """The command end to end: the plan subprocess counts the 0.12B model's parameters exactly and the times
    follow the formula from the plan it read (FLOPs per token printed with 3 decimals)."""
    proc = subprocess.run([sys.executable, "-m", "scalevec_lit", "study", "plan",
                           "recipes/ablation/claims_0.12b.yaml", "--devices", "8", "--mfu", "0.4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "33 runs" in out and "121,129,728 parameters" in out and "2,621,440,000 tokens per run" in out
    assert "MFU 0.40" in out and "8 × H200" in out
    gflop = float(out.split(" GFLOP per token")[0].rsplit(", ", 1)[1])
    expect_run_min = 2_621_440_000 * gflop * 1e9 / (8 * PEAK_BF16["H200"] * 0.4) / 60.0
    row = next(line for line in out.splitlines() if "8 × H200" in line).split()
    per_run = int(row[row.index("H200") + 1]) * 60 + int(row[row.index("H200") + 3]) if row[row.index("H200") + 2] == "h" \
        else int(row[row.index("H200") + 1])
    # validation (5 × 50 batches, forward only) and the 3-minute start-up come on top of training
    assert expect_run_min + STARTUP_S / 60.0 - 1 <= per_run <= math.ceil(expect_run_min * 1.02 + STARTUP_S / 60.0) + 1
