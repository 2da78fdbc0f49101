"""Stop signals at any moment of a run: one line on stderr, exit code 128 + the signal, nothing lost.

During training a signal saves the current step (``tests/test_resume.py``); here, the moments around it:
start-up (imports, set-up, the validation sanity check), and after the last step.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, run_cli, smoke_args

PROBE_ENV = {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}


def _probe(signame: str, at: str) -> list[str]:
    return [f"--trainer.callbacks+=probes.SendSignal", f"--trainer.callbacks.signal={signame}",
            f"--trainer.callbacks.at={at}"]


def _one_line_stop(res, signum: int, phrase: str) -> None:
    assert res.returncode == 128 + signum, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and phrase in errors[0], res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("signame, at", [("SIGTERM", "sanity"), ("SIGINT", "setup"), ("SIGUSR1", "sanity")])
def test_a_signal_during_start_up_stops_at_once_with_its_exit_code(signame, at, prepared_data, tmp_path):
    signum = int(getattr(signal, signame))
    res = run_cli(smoke_args(prepared_data, tmp_path, 5, *_probe(signame, at)), cwd=tmp_path, env=PROBE_ENV)
    _one_line_stop(res, signum, f"stopped by {signame} during start-up")
    assert not list((tmp_path / "checkpoints").glob("*.ckpt"))  # nothing trained, nothing to save
    assert not (tmp_path / "checkpoints" / "run.lock").exists()  # the folder is free for the next run
    again = run_cli(smoke_args(prepared_data, tmp_path, 2), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]  # "run the same command again" works


@pytest.mark.slow
def test_ctrl_c_while_importing_is_one_line_and_exit_130(prepared_data, tmp_path):
    env = {**os.environ, **PROBE_ENV}
    proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *smoke_args(prepared_data, tmp_path, 5)],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)  # Python has started; Lightning's import alone takes seconds
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    _one_line_stop(subprocess.CompletedProcess([], proc.returncode, "", stderr), signal.SIGINT, "stopped by SIGINT")


@pytest.mark.slow
def test_a_signal_after_the_last_step_lets_the_run_finish_then_exits_with_it(prepared_data, tmp_path):
    res = run_cli(smoke_args(prepared_data, tmp_path, 3, "--config", _ckpt(tmp_path), *_probe("SIGTERM", "train_end")),
                  cwd=tmp_path, env=PROBE_ENV)
    _one_line_stop(res, signal.SIGTERM, "after the last training step (3)")
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()  # the run's last writes were made


def _ckpt(tmp_path: Path) -> str:
    cfg = tmp_path / "ckpt.yaml"
    cfg.write_text("trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
                   "      init_args: {save_last: true, every_n_train_steps: 100}\n")
    return str(cfg)
