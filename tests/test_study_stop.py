"""Stopping ``study run`` (the runner, under ``errors.run_guarded`` as ``python -m scalevec_lit study run``): one
stop signal makes each run in progress save its step once and stop, the runner waits for them and exits with
128 + its signal and one line; a second one kills the runs (and their children) at once.

The runs are stand-ins started by the runner's own ``_start`` (``fit_command`` gives their command): each one
records every signal it gets, "saves" for ``SAVE`` seconds after the first and exits 128 + it, and exits at once
(200) on a second one, as ``SafeModelCheckpoint`` does; each leaves a ``sleep`` child in its process group (a
loader worker). The signal is sent at the runner's poll once every run is ready. Before: the runs shared the
runner's process group, so a signal to the group (a terminal's Ctrl-C) reached each run and the runner's
SIGTERM after it was a second one (no save); a SIGINT to the runner reached its runs as SIGTERM; a signal
between a run's Popen and its registration left it running; the children stayed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scalevec_lit import study as st
from scalevec_lit.errors import run_guarded
from scalevec_lit.study import callback_check, runner
from scalevec_lit.study.stopping import STUDY_SIGNALS

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # starts processes (stand-in runs, their sleep children), each test under a second

STAND_IN = """\
import os, signal, subprocess, sys, time
record, save = sys.argv[1], float(sys.argv[2])
got = []
def on(signum, frame):
    got.append(signum)
    with open(record, "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    if len(got) > 1:
        os._exit(200)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, on)
child = subprocess.Popen(["sleep", "60"])
with open(record + ".child", "w") as f:
    f.write(str(child.pid))
open(record + ".ready", "w").close()
while not got:
    time.sleep(0.01)
time.sleep(save)
os._exit(128 + got[0])
"""


def _wait_for(condition, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Running (a zombie is not: its parent is gone and nobody reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Stand:
    def __init__(self, tmp_path: Path, monkeypatch, save: float) -> None:
        self.out, self.procs, self.polls = tmp_path / "runs", [], []
        script = tmp_path / "stand_in.py"
        script.write_text(STAND_IN)
        popen = subprocess.Popen

        def collecting(*args, **kwargs):
            proc = popen(*args, **kwargs)
            self.procs.append(proc)
            if self.on_popen is not None:
                self.on_popen(proc)
            return proc

        self.on_popen = None
        monkeypatch.setattr(subprocess, "Popen", collecting)
        monkeypatch.setattr(runner, "fit_command", lambda study, variant, seed, root, lr=None: [
            sys.executable, str(script), str(root / "signals.txt"), str(save)])
        monkeypatch.setattr(runner, "time", SimpleNamespace(sleep=self._poll, time=time.time))
        monkeypatch.setattr(runner, "code_provenance", lambda: {"commit": "c0ffee", "dirty": False, "dirty_files": []})
        monkeypatch.setattr(callback_check, "check_callbacks", lambda study: None)
        self.study = st.Study(name="s", base=[], args=[], seeds=[1, 2], variants=[st.Variant("baseline")])
        self.at_poll: list = []  # what the runner's polls do, one each, then nothing

    def _poll(self, seconds: float) -> None:
        self.polls.append(seconds)
        if self.at_poll:
            self.at_poll.pop(0)()
        time.sleep(min(seconds, 0.05))

    def record(self, proc) -> Path:
        return Path(proc.args[2])

    def ready(self) -> None:
        _wait_for(lambda: all(Path(f"{self.record(p)}.ready").exists() for p in self.procs))

    def signals(self) -> list[list[str]]:
        return [self.record(p).read_text().split() if self.record(p).exists() else [] for p in self.procs]

    def children(self) -> list[int]:
        return [int(Path(f"{self.record(p)}.child").read_text()) for p in self.procs]

    def run(self):
        before = {s: signal.getsignal(s) for s in STUDY_SIGNALS}
        with pytest.raises(SystemExit) as exit_:
            run_guarded(lambda argv: runner.run_study(self.study, self.out, parallel=2), ["study", "run", "s.yaml"])
        assert {s: signal.getsignal(s) for s in STUDY_SIGNALS} == before  # the runner's handlers are gone
        return exit_.value.code

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL) if os.getpgid(proc.pid) == proc.pid else proc.kill()
                proc.wait()
        for path in Path(self.out).rglob("signals.txt.child"):
            try:
                os.kill(int(path.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def stand(tmp_path, monkeypatch):
    made = []

    def make(save: float) -> Stand:
        made.append(Stand(tmp_path, monkeypatch, save))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture
def hangup_stops():
    """SIGHUP at its default action for the test: a suite started under ``nohup`` inherits it ignored, and the
    runner keeps an ignored SIGHUP ignored (``test_under_nohup_a_hangup_is_not_a_stop``), so the test waited
    forever for its runs to be signalled."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


def _group_wide(signum: int, stand: Stand) -> None:
    """``kill -<signum> -<runner's group>`` (a terminal's Ctrl-C) without reaching pytest's other processes: the
    runner and whatever of the runs is in its group."""
    for proc in stand.procs:
        if os.getpgid(proc.pid) == os.getpgrp():
            os.kill(proc.pid, signum)
    signal.raise_signal(signum)


SIGNALS = [(signal.SIGINT, True, "SIGINT"), (signal.SIGTERM, True, "SIGTERM"), (signal.SIGINT, False, "SIGINT"),
           (signal.SIGTERM, False, "SIGTERM"), (signal.SIGUSR1, False, "SIGUSR1"), (signal.SIGHUP, False, "SIGTERM")]


@pytest.mark.parametrize("signum, group, passed_on", SIGNALS, ids=[f"{s.name}-{'group' if g else 'runner'}"
                                                                   for s, g, _ in SIGNALS])
def test_one_signal_reaches_each_run_once(stand, capsys, hangup_stops, signum, group, passed_on):
    s = stand(save=0.3)
    own = []  # each run leads its own session: a terminal's signals reach the runner only
    s.at_poll = [lambda: (s.ready(), own.extend(os.getsid(p.pid) == p.pid for p in s.procs),
                          _group_wide(signum, s) if group else signal.raise_signal(signum))]
    assert s.run() == 128 + signum
    assert s.signals() == [[passed_on], [passed_on]]  # each run once: it saved its step and stopped
    assert [p.returncode for p in s.procs] == [128 + signal.Signals[passed_on]] * 2  # waited for
    assert own == [True, True]
    out, err = capsys.readouterr()
    name = signal.Signals(signum).name
    assert err == (
        f"error: stopped by {name} during study: its 2 run(s) in progress were stopped, each after saving its current "
        "step (each one's log.txt says at which step); run the same command again: complete runs are skipped, the "
        "others resume from their newest checkpoint\n")
    assert (f"received {name}: each run in progress saves a checkpoint at the end of its current step, then stops; "
            "send it again to stop them at once, without saving\n") in out
    assert "FAILED" not in out  # a stopped run is not a failure
    _wait_for(lambda: not [pid for pid in s.children() if _alive(pid)], 5)  # each run's children went with it


def test_a_second_signal_kills_the_runs_and_their_children(stand, capsys):
    s = stand(save=8)
    got_first = lambda: all(len(r) == 1 for r in s.signals())  # noqa: E731
    s.at_poll = [lambda: (s.ready(), signal.raise_signal(signal.SIGINT)),
                 lambda: (_wait_for(got_first), signal.raise_signal(signal.SIGINT))]
    t0 = time.monotonic()
    assert s.run() == 130
    assert time.monotonic() - t0 < 6  # not the 8 s each run takes to "save"
    assert s.signals() == [["SIGINT"], ["SIGINT"]]
    assert [p.returncode for p in s.procs] == [-signal.SIGKILL] * 2
    _wait_for(lambda: not [pid for pid in s.children() if _alive(pid)], 5)
    out, err = capsys.readouterr()
    assert err == ("error: stopped at once by a second SIGINT during study: the runs still in progress were killed, "
                   "without saving their steps since their last checkpoint; run the same command again: complete runs "
                   "are skipped, the others resume from their newest checkpoint\n")
    assert "received a second SIGINT: the runs in progress are killed\n" in out


def test_a_signal_while_a_run_starts_reaches_it(stand, capsys):
    """SIGTERM right after the first run's Popen, before the runner has it in its list: the run gets it once, no
    other run starts."""
    s = stand(save=0.2)
    s.on_popen = lambda proc: (_wait_for(lambda: Path(f"{proc.args[2]}.ready").exists()),
                               signal.raise_signal(signal.SIGTERM))
    assert s.run() == 143
    assert s.signals() == [["SIGTERM"]]
    assert [p.returncode for p in s.procs] == [143]
    assert capsys.readouterr().err.startswith("error: stopped by SIGTERM during study: its 1 run(s) in progress were "
                                              "stopped, each after saving its current step")



def test_under_nohup_a_hangup_is_not_a_stop(stand, capsys):
    """SIGHUP ignored when the study starts (``nohup``): it stays ignored, the runs go on until a SIGTERM."""
    s = stand(save=0.2)
    hangup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        s.at_poll = [lambda: (s.ready(), signal.raise_signal(signal.SIGHUP)),
                     lambda: (time.sleep(0.2), signal.raise_signal(signal.SIGTERM))]
        assert s.run() == 143
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, hangup)
    assert s.signals() == [["SIGTERM"], ["SIGTERM"]]
    assert "received SIGHUP" not in capsys.readouterr().out


KILLED_RUNNER = """\
import os, sys, time
from pathlib import Path
from scalevec_lit import study as st
from scalevec_lit.study import runner
runner.fit_command = lambda study, variant, seed, root, lr=None: ["sleep", "60"]
s = st.Study(name="s", base=[], args=[], seeds=[1], variants=[st.Variant("baseline")])
proc, root, t0 = runner._start(s, s.runs()[0], Path(sys.argv[1]), dict(os.environ))
print(proc.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
def test_a_run_dies_with_a_killed_runner(tmp_path):
    """A runner killed with SIGKILL (it cannot pass anything on) takes its runs along: in their own sessions they
    would otherwise go on, holding their folders, as orphans."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fake = subprocess.Popen([sys.executable, "-c", KILLED_RUNNER, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            text=True)
    run = None
    try:
        fake.stdout.readline()  # [study] ... start  baseline/seed1
        run = int(fake.stdout.readline())
        assert _alive(run) and os.getsid(run) == run
        fake.kill()
        fake.wait()
        _wait_for(lambda: not _alive(run), 5)
    finally:
        fake.kill()
        fake.wait()
        fake.stdout.close()
        if run is not None and _alive(run):
            os.kill(run, signal.SIGKILL)
