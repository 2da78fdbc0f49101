"""A study's endpoints are taken at the scheduled validations (every ``val_check_interval`` steps and the final
step), never at the extra validation Lightning makes where a run stops on a signal: a study interrupted with
SIGINT between its last two scheduled validations and run again gives the endpoint of the uninterrupted run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalevec_lit import study as st
from scalevec_lit.study.events import scheduled, validation_schedule
from scalevec_lit.study.regime import embedding_params_from_log, regime_line

ROOT = Path(__file__).resolve().parents[1]


def test_scheduled_steps_from_the_runs_config_and_log(tmp_path):
    (tmp_path / "tb" / "version_0").mkdir(parents=True)
    (tmp_path / "tb" / "version_0" / "config.yaml").write_text(yaml.safe_dump(
        {"trainer": {"max_steps": 10, "val_check_interval": 5, "check_val_every_n_epoch": None}}))
    (tmp_path / "log.txt").write_text("note: stopped by SIGINT at step 7: saved ...\n")
    sched = validation_schedule(tmp_path)
    assert sched == {"interval": 5, "final": 10, "stops": [6]}
    val = [(4, 7.2), (6, 7.0), (9, 7.1)]
    assert scheduled(val, sched) == ([(4, 7.2), (9, 7.1)], [6])
    assert st.endpoint(scheduled(val, sched)[0])["steps"] == [4, 9]
    # an interval that is not a whole number of optimizer steps: only the stop-step validation is left out
    (tmp_path / "log.txt").write_text("trainer.accumulate_grad_batches = 2 (from global_batch_tokens)\n"
                                      "stopped by SIGTERM at step 7: saved ...\nstopped by SIGTERM at step 10\n")
    (tmp_path / "tb" / "version_0" / "config.yaml").write_text(yaml.safe_dump(
        {"trainer": {"max_steps": 10, "val_check_interval": 5, "check_val_every_n_epoch": None}}))
    sched = validation_schedule(tmp_path)
    assert sched == {"interval": None, "final": 10, "stops": [6, 9]}
    assert scheduled(val, sched) == ([(4, 7.2), (9, 7.1)], [6])  # the final step stays, stop or not
    (tmp_path / "tb" / "version_0" / "config.yaml").write_text(yaml.safe_dump(
        {"trainer": {"max_steps": 12, "val_check_interval": 6, "check_val_every_n_epoch": None}}))
    assert validation_schedule(tmp_path)["interval"] == 3  # 6 batches = 3 optimizer steps of 2 batches


@pytest.mark.slow
def test_an_interrupted_and_resumed_study_keeps_the_uninterrupted_endpoint(prepared_data, tmp_path):
    tiny = [f"--data.data_dir={prepared_data}", "--trainer.max_steps=9", "--trainer.val_check_interval=3",
            "--trainer.check_val_every_n_epoch=null", "--trainer.limit_val_batches=1",
            "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--data.batch_size=2", "--model.config.n_layer=1",
            "--model.config.n_embd=32", "--model.config.n_head=2", "--model.config.n_kv_head=1",
            "--model.config.seq_len=32", "--model.schedule.init_args.warmup_steps=1"]
    # two identical variants; the first is interrupted after step 7, between the validations after steps 6 and 9
    probe = ["--trainer.callbacks+=study_probes.InterruptStudyAt", "--trainer.callbacks.step=7"]
    spec = {"name": "stop", "out": str(tmp_path / "runs"), "base": [str(ROOT / "recipes" / "smoke.yaml")],
            "args": tiny, "seeds": [1], "baseline": "plain",
            "callbacks": {"scalevec_lit.callbacks.SafeModelCheckpoint": {"every_n_train_steps": 3},
                          "scalevec_lit.callbacks.ScaleVectorMonitor": {"every_n_steps": 100, "heatmap": False,
                                                                        "histogram_every_n_steps": 0}},
            "variants": [{"name": "interrupted", "args": probe}, {"name": "plain"}]}
    path = tmp_path / "stop.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "scalevec_lit", "study", "run", str(path), "--allow-code-change"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 130, first.stdout[-2000:] + first.stderr[-2000:]
    root = tmp_path / "runs" / "interrupted" / "seed1"
    assert not (root / st.DONE).exists() and "stopped by SIGINT at step 7" in (root / "log.txt").read_text()
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resume interrupted/seed1" in again.stdout
    stopped = json.loads((root / st.DONE).read_text())
    plain = json.loads((tmp_path / "runs" / "plain" / "seed1" / st.DONE).read_text())
    assert [s for s, _ in stopped["val"]] == [2, 5, 6, 8]  # the stop-step validation is in its events
    assert [s for s, _ in plain["val"]] == [2, 5, 8]
    assert stopped["endpoint_steps"] == plain["endpoint_steps"] == [5, 8]
    assert stopped["unscheduled_val_steps"] == [6] and plain["unscheduled_val_steps"] == []
    assert stopped["endpoint"] == plain["endpoint"]  # resuming is bitwise: the same validation losses
    # what the regime line is computed from: fit's parameter count and the tokens trained (9 steps x 2 x 32)
    assert stopped["params"] == plain["params"] > 0 and stopped["trained_tokens"] == plain["trained_tokens"] == 576
    report = st.load_study(path)
    from scalevec_lit.study.report import write_report

    text = write_report(tmp_path / "runs", report).read_text()
    tokens = json.loads((prepared_data / "meta.json").read_text())["tokens"]["train"]
    outside = plain["params"] - embedding_params_from_log(tmp_path / "runs" / "plain" / "seed1")  # embedding, head
    assert f"\n{regime_line(576, plain['params'], tokens, outside)}.\n" in text
    assert ("logged at 0-based steps [5, 8] in every run (validations made where a run stopped on a signal are off "
            "the schedule and left out: `interrupted/seed1` at [6])") in text


def test_report_takes_an_old_runs_endpoint_again_from_its_scheduled_validations(tmp_path):
    """A run recorded before this rule (its endpoint over steps [6, 9], 6 being a stop-step validation) is read
    with the endpoint of the scheduled validations [4, 9]; a run without a stop keeps its recorded endpoint."""
    from scalevec_lit.study.report import write_report

    runs = tmp_path / "s" / "runs"
    (runs).mkdir(parents=True)
    (runs / "study.yaml").write_text(yaml.safe_dump({"name": "s", "seeds": [1], "variants": [
        {"name": "baseline"}, {"name": "no_scale"}]}))
    for variant, val, log in (("baseline", [[4, 7.18], [9, 7.17]], ""),
                              ("no_scale", [[4, 7.2], [6, 7.0], [9, 7.1]], "stopped by SIGINT at step 7: saved x\n")):
        root = runs / variant / "seed1"
        (root / "tb" / "version_0").mkdir(parents=True)
        (root / "tb" / "version_0" / "config.yaml").write_text(yaml.safe_dump(
            {"trainer": {"max_steps": 10, "val_check_interval": 5, "check_val_every_n_epoch": None}}))
        (root / "log.txt").write_text(log)
        last = val[-2:]
        (root / st.DONE).write_text(json.dumps({
            "variant": variant, "seed": 1, "lr": None, "final_val_loss": val[-1][1], "final_step": 9,
            "last_train_step": 9, "endpoint": sum(v for _, v in last) / 2, "endpoint_steps": [s for s, _ in last],
            "val": val}))
    text = write_report(tmp_path / "s").read_text()
    assert "| no_scale | recipe | 1 | 7.1500 ± " in text and "| baseline | recipe | 1 | 7.1750 ± " in text
    assert ("[4, 9] in every run (validations made where a run stopped on a signal are off the schedule and left "
            "out: `no_scale/seed1` at [6]); the endpoints of `no_scale/seed1` were recorded with such a validation "
            "and are taken again from their scheduled validations here") in text
