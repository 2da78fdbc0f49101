"""Stopping ``study run`` on a signal: its runs save their step once and stop, or are killed at once.

Each run (``python -m scalevec_lit fit``) is started in its own session, so a Ctrl-C at the terminal or a
signal to the runner's process group reaches the runner only. The runner (``runner.run_study``) passes its
first stop signal on to each run in progress exactly once: ``SafeModelCheckpoint`` then finishes the step,
saves a checkpoint at it and stops (a run still starting up stops at once, with nothing trained). A second
signal kills every run's process group (the run, its loader workers, its ranks) at once. Before, the runs
shared the runner's group: a Ctrl-C reached each run as its first signal and the runner's SIGTERM after it
was a second one, on which a run stops without saving.

Plain Python: no torch, no Lightning.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Callable, Optional

from ..stopsignal import STOP_SIGNALS, name as signal_name

AGAIN = "run the same command again: complete runs are skipped, the others resume from their newest checkpoint"

#: The signals that stop a study: those of every command, and SIGHUP (its terminal closed: the runs, in their
#: own sessions, do not get it). Each run is sent the same signal, SIGTERM for SIGHUP.
SIGHUP = getattr(signal, "SIGHUP", None)
STUDY_SIGNALS = STOP_SIGNALS + ((SIGHUP,) if SIGHUP is not None else ())


def stopped_line(signum: int, runs: int) -> str:
    """The line of a study stopped by ``signum`` (the runner's own) while ``runs`` runs were in progress."""
    if not runs:
        return f"stopped by {signal_name(signum)} during study: no run was in progress; {AGAIN}"
    return (f"stopped by {signal_name(signum)} during study: its {runs} run(s) in progress were stopped, each after "
            f"saving its current step (each one's log.txt says at which step); {AGAIN}")


def killed_line(signum: int) -> str:
    """The line of a study stopped at once by a second signal (``signum``): its runs were killed."""
    return (f"stopped at once by a second {signal_name(signum)} during study: the runs still in progress were "
            f"killed, without saving their steps since their last checkpoint; {AGAIN}")


def kill_group(pid: int) -> None:
    """SIGKILL to the process group that the run ``pid`` leads (``start_new_session``), if any is left."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_setup() -> Optional[Callable[[], None]]:
    """What a run calls before it starts (``preexec_fn``), on Linux, in its own new session:

    - it gets SIGKILL when the runner dies. A runner killed with SIGKILL (alone, or with its process group:
      ``kill -9 -<pgid>``) then takes its runs along, as when they shared its group;
    - it keeps the runner's niceness where the scheduler looks. With autogroups (the Linux default), CPU time
      is shared between sessions first and niceness counts only inside a session, so a run in its own
      session under ``nice -n 10 ... study run`` took a full share beside other work; its session's
      autogroup gets the runner's niceness (``/proc/self/autogroup``; raising a priority is never tried).

    Elsewhere ``None``, and the runs go on when the runner dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl, runner, niceness = ctypes.CDLL(None, use_errno=True).prctl, os.getpid(), os.nice(0)  # before the fork

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != runner:  # the runner died before that
            os.kill(os.getpid(), signal.SIGKILL)
        if niceness > 0:
            try:
                fd = os.open("/proc/self/autogroup", os.O_WRONLY)
                try:
                    os.write(fd, str(min(niceness, 19)).encode())
                finally:
                    os.close(fd)
            except OSError:  # a kernel without autogroups: niceness alone already applies
                pass

    return preexec


class Runs:
    """The runs in progress (``add``) and the stop signals the runner got (``handler``, for ``STUDY_SIGNALS``).

    The first signal is passed on once to each run, to the run's own process (its loader workers, forked from
    it, would take a signal as an error; with several ranks, the ranks agree on the stop), and to a run started
    meanwhile as soon as it is added; a second one kills each run's process group. Each of these happens once
    per run, whether the handler or the runner's loop gets there first (``dict.setdefault`` is one step, which
    a handler cannot cut into). A run that has exited leaves ``procs`` and has what is left of its group killed
    before it is reaped (``exited``): no signal is sent to a process id the system may have given to another."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.got: list[int] = []
        self._done: dict[tuple[int, int], object] = {}
        self._told = 0

    def install(self) -> dict:
        """Take the study's signals over (main thread only; SIGHUP stays ignored under ``nohup``); returns the
        handlers to ``restore``."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {s: signal.signal(s, self.handler) for s in STUDY_SIGNALS
                if s != SIGHUP or signal.getsignal(s) is not signal.SIG_IGN}

    @staticmethod
    def restore(previous: dict) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def handler(self, signum: int, frame) -> None:
        self.got.append(signum)
        self.deliver()

    def add(self, proc: subprocess.Popen) -> None:
        self.procs.append(proc)
        self.deliver()  # a signal that came while it started

    def deliver(self) -> None:
        first = self.got[0] if self.got else None
        for proc in list(self.procs):
            for level in range(1, min(len(self.got), 2) + 1):
                mine = object()
                if self._done.setdefault((proc.pid, level), mine) is not mine:
                    continue  # done already
                if level == 2:
                    kill_group(proc.pid)
                    continue
                try:
                    os.kill(proc.pid, signal.SIGTERM if first == SIGHUP else first)
                except ProcessLookupError:
                    pass

    def passed_on(self) -> int:
        """How many runs the first signal was passed on to."""
        return sum(1 for _, level in self._done if level == 1)

    def news(self) -> Optional[str]:
        """What the signal received since the last call does, once (the runner prints it: a print in the
        handler could cut into one in progress)."""
        told, self._told = self._told, min(len(self.got), 2)
        if told == self._told:
            return None
        if self._told == 1:
            return (f"received {signal_name(self.got[0])}: each run in progress saves a checkpoint at the end of its "
                    "current step, then stops; send it again to stop them at once, without saving")
        return f"received a second {signal_name(self.got[1])}: the runs in progress are killed"

    def exited(self, proc: subprocess.Popen) -> Optional[int]:
        """The exit code of ``proc`` once it has exited (then it leaves ``procs``), else ``None``."""
        if not hasattr(os, "waitid"):  # no wait that leaves it unreaped
            if proc.poll() is None:
                return None
            self.procs.remove(proc)
            return proc.returncode
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return None
        except ChildProcessError:  # reaped already
            pass
        self.procs.remove(proc)
        if proc.returncode is None:
            kill_group(proc.pid)  # its children left behind: the group's id is its own until it is reaped
        return proc.wait()

    def wait(self, seconds: float = 0.1) -> None:
        """Until every run has exited (after the runner failed: their exit codes are not needed)."""
        import time

        while self.procs:
            time.sleep(seconds)
            for proc in list(self.procs):
                self.exited(proc)
