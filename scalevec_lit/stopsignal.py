"""Stop signals at any moment of a command: one line on stderr and exit code 128 + the signal number.

SIGINT (Ctrl-C), SIGTERM and SIGUSR1 mean "stop" whenever they arrive:

- during start-up (imports, recipe checks, building the model and the data, the validation sanity check,
  restoring a checkpoint) there is nothing new to save: the command stops at once
  (``stopped by SIGTERM during start-up (before the first training step): nothing was trained since the
  command started, nothing was saved; ...``);
- during training, ``SafeModelCheckpoint`` (``callbacks/checkpoint.py``) takes the signal over: it finishes
  the current step, saves a checkpoint and stops; a second signal stops at once, without saving;
- after training (the last checkpoint, logger flushes) the signal is remembered and the command ends
  normally, then exits 128 + the signal (the run was complete, so scripts still see the signal);
- ``study run`` passes its first signal on once to each run in progress, which saves its step and stops as
  above, and then exits 128 + the signal; a second one kills the runs (``study/stopping.py``);
- any other command (``prepare``, ``export``, ``import``, ``convert``, ``generate``) stops at once; the
  commands that write an output leave it as it was (they write into a temporary sibling). A signal while
  the finished output is moved into place (``held()``) is answered when the move is over; once the output is
  in place (``written()``) the line says so (``stopped by SIGINT after prepare had finished: ...``) and the
  process ends at once with 128 + the signal (its summary may be cut short); a signal that arrives after the
  command returned, while the interpreter exits, is ignored: the exit code is the command's (0);
- the processes prepare forks (litdata's workers) end at once, silently, on a stop signal: the command itself
  reports it, and ends them (``data/workers.py``).

``install_for_imports()`` is called first thing by ``python -m scalevec_lit`` (before Lightning is imported: a
signal then prints its line and ends the process); ``errors.run_guarded`` calls ``install()`` when the command
starts and turns ``StopSignal`` (and a bare ``KeyboardInterrupt``) into the line and the exit code. A
``StopSignal`` that code the command ran swallowed (a ``__del__``, a library's ``except BaseException``) is not
lost: every output checks for one before it moves in (``outdir.Claim.commit``, and prepare's own commit;
``raise_if_swallowed``), so nothing is written, and ``run_guarded`` answers it when the command ends
(``swallowed``), with the same exit code.
Plain Python: no torch, no Lightning.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from .notices import notice

SIGNAL_NAMES = ("SIGINT", "SIGTERM", "SIGUSR1")
STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in SIGNAL_NAMES) if s is not None)

#: Where the command is: ``start-up`` (nothing to save), ``training`` (a checkpoint callback owns the
#: signals), ``finishing`` (training is over; the signal is remembered until the command returns).
_state: dict[str, Any] = {"phase": "start-up", "step": None, "pending": None, "command": None, "depth": 0,
                         "written": None, "raised": None}


class StopSignal(BaseException):
    """Raised by the start-up handler: a stop signal arrived when there was nothing to save."""

    def __init__(self, signum: int, message: Optional[str] = None) -> None:
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(message or describe(self.signum))


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe(signum: int) -> str:
    """The one line for a stop by ``signum`` in the current phase (without ``error:``)."""
    phase, step, command = _state["phase"], _state["step"], _state["command"]
    if phase == "training":
        return (f"stopped at once by a second {name(signum)} at step {step}: the steps since the last checkpoint "
                "were not saved; resume with the same command and --ckpt_path last")
    if phase == "finishing":
        return (f"stopped at once by a second {name(signum)} after the last training step ({step}): the run had "
                "finished, its last checkpoint may not have been written; resume with --ckpt_path last to write it")
    if _state["written"] is not None:
        return (f"stopped by {name(signum)} after {command} had finished: {_state['written']}; nothing to run "
                "again")
    if command in (None, "fit"):
        return (f"stopped by {name(signum)} during start-up (before the first training step): nothing was "
                "trained since the command started, nothing was saved; run the same command again (add "
                "--ckpt_path last to resume an earlier run)")
    return (f"stopped by {name(signum)} during {command}: nothing was written (an output folder is left as it "
            "was); run the same command again")


def _handler(signum: int, frame: Any) -> None:
    if _state["phase"] == "finishing" and _state["pending"] is None:
        _state["pending"] = signum
        notice(f"received {name(signum)} after the last training step: finishing the run's last writes, then "
               f"exiting with {128 + signum} (send it again to stop at once)")
        return
    _state["raised"] = signum  # ``raise_if_swallowed``: Python ignores an exception raised inside ``__del__``
    raise StopSignal(signum)


def swallowed(returned: bool = False) -> Optional[StopSignal]:
    """The ``StopSignal`` of a stop signal whose exception was swallowed (``None`` if none): a handler runs
    wherever the main thread is, and what it raises inside a ``__del__`` (garbage collection of litdata's pipes)
    is only printed, or a library's ``except BaseException`` takes it; the command goes on. ``returned``: the
    command has run to its end meanwhile (``errors.run_guarded`` asks when it returns), and the line says so."""
    signum = _state["raised"]
    if signum is None or _state["depth"] < 1:
        return None
    if returned and _state["written"] is None:
        command = _state["command"] or "the command"
        return StopSignal(signum, f"stopped by {name(signum)} during {command}: the signal was taken by code that "
                                  f"{command} ran (a library's clean-up), which did not stop it, so {command} ran to "
                                  "its end (its output, if it writes one, is complete); nothing to run again")
    return StopSignal(signum)


def raise_if_swallowed() -> None:
    """Raise ``StopSignal`` again for a stop signal whose exception was swallowed (``swallowed``). A command
    that writes an output calls this before it commits it; ``errors.run_guarded`` when the command ends."""
    stop = swallowed()
    if stop is not None:
        raise stop


def _unraisable(info: Any, _default: Any = sys.unraisablehook) -> None:
    """A ``StopSignal`` raised inside a ``__del__`` is not printed (``raise_if_swallowed`` raises it again)."""
    if info.exc_type is not StopSignal:
        _default(info)


def install(command: Optional[str] = None) -> dict[int, Any]:
    """Make every stop signal raise ``StopSignal`` (main thread only); returns the handlers it replaced."""
    _state.update(phase="start-up", step=None, pending=None, command=command, written=None, raised=None)
    sys.unraisablehook = _unraisable
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in STOP_SIGNALS:
        previous[signum] = signal.getsignal(signum)
        signal.signal(signum, _handler)
    return previous


def _exit_now(signum: int, frame: Any) -> None:
    sys.stderr.write(f"error: {describe(signum)}\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def install_for_imports(command: Optional[str] = None) -> None:
    """While the command's modules are imported (nothing written yet): a stop signal prints its line and ends
    the process at once; ``install`` (called by ``errors.run_guarded``) takes over when the command starts."""
    _state.update(phase="start-up", step=None, pending=None, command=command)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        signal.signal(signum, _exit_now)


@contextmanager
def importing() -> Iterator[None]:
    """Around a command's own imports once ``run_guarded`` has started it (``cli.py`` imports Lightning only for
    fit/validate/test, and each other command's module when it runs): as in ``install_for_imports``, a stop
    signal then prints its line and ends the process at once, since an exception raised in the middle of a
    library's import can turn into another error (numpy retries a failed import until the recursion limit)
    and nothing has been written yet. The handlers in place before the block are put back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _exit_now) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def written(command: str, what: str) -> None:
    """``command``, when it is the running command, has put its complete output in place (``what``: where):
    a stop signal from now on says so (``stopped by SIGINT after prepare had finished: <what>; nothing to run
    again``) and still exits 128 + the signal."""
    if _state["command"] != command or _state["depth"] < 1:  # not the guarded command (e.g. fit's data module)
        return
    _state["written"] = what
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:  # from now on the line, then exit at once
            signal.signal(signum, _finished(signal.getsignal(signum)))
        atexit.unregister(_too_late)
        atexit.register(_too_late)


def _too_late() -> None:
    """The interpreter is exiting after the command finished (its exit code is set): a stop signal from now on
    is ignored (Python would otherwise restore the default handlers and be killed by it, with no line)."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def _finished(handler: Any) -> Any:
    """``handler``, or ``_exit_now`` in place of ``_handler`` once the command's output is in place."""
    return _exit_now if handler is _handler and _state["written"] is not None else handler


@contextmanager
def held(answer: bool = True) -> Iterator[None]:
    """A stop signal inside the block (moving a finished output into place) is answered when it ends: the
    handlers in place before the block get the first signal then (main thread; elsewhere a plain block).
    ``answer=False``: it is only noted (a lost rank being named: that rank stops anyway, with the line that says
    why); signals count again after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, _finished(handler) if handler is not None else signal.SIG_DFL)
        if got and answer:
            signal.raise_signal(got[0])


def enter_command() -> bool:
    """Count a guarded command; ``True`` when it runs inside another (the outer one reports signals)."""
    _state["depth"] += 1
    return _state["depth"] > 1


def leave_command() -> None:
    _state["depth"] -= 1
    if _state["depth"] < 1:
        _state["raised"] = None


def restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        if handler not in (_handler, _exit_now):
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def enter_training() -> None:
    """A checkpoint callback has taken the signals over (until ``leave_training``)."""
    _state.update(phase="training")


def at_step(step: int) -> None:
    _state["step"] = step


def leave_training(step: int) -> None:
    """Training is over: a first signal from now on is remembered and reported when the command returns."""
    _state.update(phase="finishing", step=step)


def remember(signum: int) -> None:
    """A signal that arrived after training's last check: the command exits with it when it returns."""
    if _state["pending"] is None:
        _state["pending"] = int(signum)


def describe_pending() -> str:
    signum = _state["pending"]
    return (f"stopped by {name(signum)} after the last training step ({_state['step']}): the run had finished and "
            "wrote its last checkpoint; nothing is left to resume")


def pending_exit_code() -> int:
    """128 + the signal received after training (0 if none)."""
    return 128 + _state["pending"] if _state["pending"] is not None else 0
