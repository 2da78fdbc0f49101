"""The study rows of docs/troubleshooting.md's exit-code table, through the real command line
(``python -m scalevec_lit study ...``): a malformed study file exits 2 with one ``error:`` line naming the file,
the key and the fix, before any run (``plan``, ``run --dry-run`` and ``run`` alike); a study with a failed run
exits 1, so that ``study run ... && study report ...`` stops."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # each case starts `python -m scalevec_lit` (and `fit` for the failed run)


def _study(tmp_path: Path, name: str, **changes) -> Path:
    spec = {"name": name, "out": str(tmp_path / name / "runs"), "base": [str(ROOT / "recipes" / "smoke.yaml")],
            "args": ["--trainer.max_steps=2"], "seeds": [1],
            "variants": [{"name": "baseline", "configs": [str(ROOT / "recipes" / "strategy" / "baseline.yaml")]}]}
    spec.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "scalevec_lit", "study", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def _one_error(res: subprocess.CompletedProcess, code: int, *phrases: str) -> str:
    assert res.returncode == code, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr[-3000:]
    for phrase in phrases:
        assert phrase in errors[0], errors[0]
    return errors[0]


def test_malformed_study_files_exit_2_before_any_run(tmp_path):
    seeds = _study(tmp_path, "seeds", seeds=[1, "two"])
    _one_error(_run(tmp_path, "plan", str(seeds)), 2,
               f"error: {seeds}: seeds[1]: two: not an integer seed; write the seeds as integers")
    typo = _study(tmp_path, "typo", variants=[
        {"name": "baseline", "configs": [str(ROOT / "recipes" / "strategy" / "baseline.yaml")]},
        {"name": "unified", "configs": [str(ROOT / "recipes" / "strategy" / "unifed.yaml")]}])
    for args in (["plan"], ["run", "--dry-run"], ["run"]):
        res = _run(tmp_path, *args, str(typo))
        _one_error(res, 2, f"{typo}: variants[unified].configs[0]: ", "unifed.yaml: no such file")
        assert "python -m scalevec_lit fit" not in res.stdout  # no command printed, nothing run
    assert not (tmp_path / "typo").exists()  # not even the runs folder
    callback = _study(tmp_path, "callback", callbacks={"scalevec_lit.callbacks.SharpnessMonitor": {"every_n_step": 5}})
    _one_error(_run(tmp_path, "run", "--dry-run", str(callback)), 2,
               f"{callback}: callbacks.scalevec_lit.callbacks.SharpnessMonitor.every_n_step: every_n_step: not an "
               "argument of SharpnessMonitor; did you mean 'every_n_steps'?")
    _one_error(_run(tmp_path, "report", str(tmp_path / "nothing")), 2, "no complete runs (done.json) there")


def test_a_study_with_a_failed_run_exits_1(tmp_path):
    failing = _study(tmp_path, "failing", args=["--trainer.max_steps=0"])  # fit refuses it: the run fails
    res = _run(tmp_path, "run", str(failing))
    _one_error(res, 1, "error: study: failing: 1 run(s) failed")
    assert "[study] FAILED baseline/seed1 (exit 2)" in res.stdout
