"""Stopping ``study run`` (the runner, under ``errors.run_guarded`` as ``python -m scalevec_lit study run``): the
runs in progress are stopped and waited for, and the line and the exit code name the signal the runner got.
SIGTERM used to be turned into ``KeyboardInterrupt`` by the runner's own handler, which ``run_guarded`` reports
as SIGINT (``stopped by SIGINT during study``, exit 130). In process: the runs are ``sleep`` processes and the
signal is raised by the runner's poll."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from scalevec_lit import study as st
from scalevec_lit.errors import run_guarded
from scalevec_lit.study import callback_check, runner


@pytest.fixture
def study_of_sleeps(tmp_path, monkeypatch):
    """A study of two runs that never end by themselves; the signal comes at the runner's first poll."""
    children = []

    def start(study, run, out, env):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        children.append(proc)
        return proc, out / run.rel(), time.time()

    def stop_then(signum):
        def sleep(seconds):  # the runner's poll, both runs running
            assert len(children) == 2
            signal.raise_signal(signum)
        monkeypatch.setattr(runner, "time", SimpleNamespace(sleep=sleep, time=time.time))

    monkeypatch.setattr(runner, "_start", start)
    monkeypatch.setattr(runner, "code_provenance", lambda: {"commit": "c0ffee", "dirty": False, "dirty_files": []})
    monkeypatch.setattr(callback_check, "check_callbacks", lambda study: None)
    study = st.Study(name="s", base=[], args=[], seeds=[1, 2], variants=[st.Variant("baseline")])
    try:
        yield lambda signum: (stop_then(signum), study, tmp_path / "runs", children)[1:]
    finally:
        for proc in children:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_the_line_names_the_signal_the_runner_got(study_of_sleeps, capsys, signum):
    study, out, children = study_of_sleeps(signum)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_:
        run_guarded(lambda argv: runner.run_study(study, out, parallel=2), ["study", "run", "s.yaml"])
    assert exit_.value.code == 128 + signum
    assert [proc.returncode for proc in children] == [-signal.SIGTERM] * 2  # stopped and waited for
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == (
        f"error: stopped by {name} during study: its 2 run(s) in progress were stopped (each one's log.txt says at "
        "which step); run the same command again: complete runs are skipped, the others resume from their newest "
        "checkpoint\n")
    assert signal.getsignal(signal.SIGTERM) is before  # the runner's handler and run_guarded's are gone
