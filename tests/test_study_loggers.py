"""Studies with any Lightning logger (scalevec_lit/study/loggers.py): each run's loggers write in the run's
folder, `study run` takes its endpoint and `study report` its table from their files (CSV, MLflow, W&B)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from helpers import ROOT, print_config
from scalevec_lit.study.loggers import logger_args
from scalevec_lit.study.metrics_readers import read_csv, read_mlflow, read_wandb

SMOKE = str(ROOT / "recipes" / "smoke.yaml")
LOGGERS = [{"class_path": "lightning.pytorch.loggers.CSVLogger"},
           {"class_path": "lightning.pytorch.loggers.MLFlowLogger", "init_args": {"experiment_name": "tiny"}},
           {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"offline": True, "project": "tiny"}}]


def test_logger_args_place_each_kind_in_the_run(tmp_path):
    root = tmp_path / "runs" / "baseline" / "seed1"
    tb = [f"--trainer.logger.init_args.save_dir={root}", "--trainer.logger.init_args.name=tb",
          "--trainer.logger.init_args.version=0"]
    assert logger_args([SMOKE], [], root, "baseline/seed1") == tb  # the recipe's TensorBoardLogger, as before
    mlflow = "--trainer.logger.class_path=lightning.pytorch.loggers.MLFlowLogger"
    assert logger_args([SMOKE], [mlflow], root, "baseline/seed1") == [
        f"--trainer.logger.init_args.tracking_uri={(root / 'tb' / 'mlruns').as_uri()}",
        "--trainer.logger.init_args.run_name=baseline/seed1"]
    (arg,) = logger_args([SMOKE], ["--trainer.logger=" + json.dumps(LOGGERS)], root, "baseline/seed1")
    placed = json.loads(arg.split("=", 1)[1])
    assert [p["init_args"] for p in placed] == [
        {"save_dir": str(root), "name": "tb", "version": 0},
        {"experiment_name": "tiny", "tracking_uri": (root / "tb" / "mlruns").as_uri(), "run_name": "baseline/seed1"},
        {"offline": True, "project": "tiny", "save_dir": str(root / "tb"), "name": "baseline/seed1"}]
    resolved = yaml.safe_load(print_config("--config", SMOKE, arg))["trainer"]["logger"]  # fit accepts them
    assert [r["class_path"] for r in resolved] == [p["class_path"] for p in LOGGERS]
    assert [resolved[0]["init_args"][k] for k in ("save_dir", "name", "version")] == [str(root), "tb", 0]
    assert resolved[1]["init_args"]["tracking_uri"] == (root / "tb" / "mlruns").as_uri()
    assert [resolved[2]["init_args"][k] for k in ("save_dir", "name")] == [str(root / "tb"), "baseline/seed1"]

@pytest.mark.slow
def test_a_study_logged_with_csv_mlflow_and_wandb_runs_and_reports(prepared_data, tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from test_study import tiny_study

    path = tiny_study(tmp_path, prepared_data)
    spec = yaml.safe_load(path.read_text())
    spec.update(seeds=[1], variants=spec["variants"][:1], claims=[])
    spec["args"].append("--trainer.logger=" + json.dumps(LOGGERS))
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    # W&B settings of this process are left out: an in-process W&B run earlier in this worker leaves
    # WANDB_SERVICE set, and a child that joins that service may exit before it has written the run file
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env = {**inherited, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wandb_home"),
           "WANDB_CACHE_DIR": str(tmp_path / "wandb_home"), "WANDB_DATA_DIR": str(tmp_path / "wandb_home")}
    env.pop("MLFLOW_ALLOW_FILE_STORE", None)  # the runner allows the file store in the run's folder itself
    res = subprocess.run([sys.executable, "-m", "scalevec_lit", "study", "run", str(path), "--report"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=400)
    root = tmp_path / "study" / "runs" / "baseline" / "seed1"
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + (root / "log.txt").read_text()[-3000:]
    assert not list(root.rglob("events.out.tfevents.*"))  # no TensorBoard: the endpoint came from the others
    done = json.loads((root / "done.json").read_text())
    for reader in (read_csv, read_mlflow, read_wandb):
        val = sorted(reader(root / "tb", ("val/loss",))["val/loss"].items())
        assert [s for s, _ in val] == [2, 5], reader.__name__
        assert done["endpoint"] == pytest.approx((val[-1][1] + val[-2][1]) / 2, rel=1e-12), reader.__name__
    row = next(line for line in (tmp_path / "study" / "report.md").read_text().splitlines()
               if line.startswith("| baseline |"))
    assert f"1: {done['endpoint']:.4f}" in row


def test_the_logger_recipes_in_docs_monitoring_parse(tmp_path):
    """Every YAML block of docs/monitoring.md's 'Choosing a logger' is a recipe fit accepts after smoke.yaml."""
    page = (ROOT / "docs" / "monitoring.md").read_text()
    section = page.split("## Choosing a logger\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    assert len(blocks) == 4
    for i, block in enumerate(blocks):
        (tmp_path / f"{i}.yaml").write_text(block)
        want = yaml.safe_load(block)["trainer"]["logger"]
        resolved = print_config("--config", SMOKE, "--config", str(tmp_path / f"{i}.yaml"))
        got = yaml.safe_load(resolved)["trainer"]["logger"]
        want, got = (w if isinstance(w, list) else [w] for w in (want, got))
        assert [g["class_path"] for g in got] == [w["class_path"] for w in want]
        for g, w in zip(got, want):
            assert {k: g["init_args"][k] for k in w["init_args"]} == w["init_args"]
