"""User errors and notices: one paragraph each, the exit codes of every command, no traceback by default.

Every user error is printed as one paragraph on stderr,
``error: <key or file>: <value>: <what is wrong>; <the fix>``, and the command exits with

- 2 for a bad command line or recipe (``UserError``, ``ValueError``, a missing file named on the command
  line, a checkpoint of another model than the recipe's, Lightning's ``MisconfigurationException``),
- 1 for a failure at run time (``RunError``, a corrupt checkpoint, a non-finite loss, an ``OSError``),
- 128 + the signal number after a stop by SIGINT/SIGTERM/SIGUSR1 at any moment (during training a
  checkpoint was saved, ``callbacks/checkpoint.py``; before it, nothing needed saving: ``stopsignal.py``).
- 75 when another rank of the run is lost (``lit/peers.py``): after the line the process ends at once
  (``leave``: ``os._exit``), since a normal interpreter exit may abort or hang then.

Every command whose options argparse reads uses ``CommandLineParser`` (all but ``fit``/``validate``/``test``, whose
jsonargparse errors ``train_cli.py`` turns into one line): a missing or unknown part of its command line, a bad
choice or a bad value is one line with its usage, not argparse's usage block.

``--debug`` (any position on the command line) or ``SCALEVEC_DEBUG=1`` shows the traceback instead.
A dependency that fails to import is a broken install: one line names it, who imports it and the fix
(``import_failure.py``; exit 1, or 2 when it is not installed at all).
Anything else is a bug: one paragraph that says so, and how to see the traceback.

Must not import Lightning or torch at module level (``prepare`` and ``export`` use it too).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Callable, NoReturn, Optional

from .notices import is_rank_zero, notice  # noqa: F401 - the notices live one level down (stopsignal.py prints them too)

DEBUG_ENV = "SCALEVEC_DEBUG"


class UserError(Exception):
    """A mistake the user can fix: ``<key>: <value>: <problem>; <fix>`` (exit 2 by default)."""

    exit_code = 2

    def __init__(self, key: str, value: Any, problem: str, fix: str, exit_code: Optional[int] = None) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(f"{key}: {value}: {problem}; {fix}")


class RunError(UserError):
    """A failure at run time that the user can act on (exit 1)."""

    exit_code = 1


def _one_of(names: list[str], word: str = "or") -> str:
    """``a``, ``a or b``, ``a, b or c`` (``word``: or, and)."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {word} {names[-1]}"


class CommandLineParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line (a ``UserError``, exit 2) instead of its usage block and line:
    ``<command>: <what is wrong or missing>; usage: <the command's usage in one line>``. ``--help`` is argparse's.
    Its subcommands' parsers are of this class too (``add_subparsers`` gives them the parser's class)."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("python -m scalevec_lit ").removeprefix("scalevec-lit ")
        usage = " ".join(self.format_usage().split())
        commands = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        names = list(getattr(commands, "choices", None) or {})
        missing = re.fullmatch(r"the following arguments are required: (.*)", message)
        choice = re.fullmatch(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)", message)
        other = re.fullmatch(r"argument (\S+): (.*)", message)
        if missing and commands is not None and missing.group(1).split(", ")[0] == commands.dest:
            problem = f"no command given; choose {_one_of(names)}"
        elif missing:
            args = missing.group(1).split(", ")
            problem = f"{'the argument' if len(args) == 1 else 'the arguments'} {_one_of(args, 'and')} " \
                      f"{'is' if len(args) == 1 else 'are'} missing"
        elif choice and commands is not None and choice.group(1) == commands.dest:
            import difflib

            close = difflib.get_close_matches(choice.group(2), names, n=1)
            problem = (f"{choice.group(2)}: not a command of {where}; choose {_one_of(names)}"
                       + (f" (did you mean {close[0]!r}?)" if close else ""))
        elif choice:
            problem = f"{choice.group(1)}: {choice.group(2)}: not one of {choice.group(3)}"
        elif other:
            problem = f"{other.group(1)}: {other.group(2)}"
        elif message.startswith("unrecognized arguments: "):
            extra = message.removeprefix("unrecognized arguments: ")
            more = f"; see {self.prog} {names[0]} --help (or {', '.join(names[1:])}) for a command's" if names else ""
            words = extra.split()
            kind = "option" if all(w.startswith("-") for w in words) else "argument"
            problem = f"{extra}: not {f'an {kind}' if len(words) == 1 else f'{kind}s'} it takes{more}"
        else:
            problem = message
        raise UsageError(f"{where}: {problem}; {usage}")


class UsageError(UserError):
    """A mistake on the command line, given as its whole line (argparse's refusals in ``CommandLineParser``; a
    ``trainer`` value Lightning refuses, ``train_cli.py``); exit 2."""

    def __init__(self, line: str) -> None:
        Exception.__init__(self, line)
        self.key, self.value, self.problem, self.fix = line.partition(":")[0], None, line, ""


class ErrorExit(SystemExit):
    """``SystemExit`` with an exit code whose ``str`` is the printed message (for in-process callers)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _known(err: BaseException) -> BaseException:
    """``err``, or for an unexpected error raised by importing another package (a broken install of a
    dependency, ``import_failure.py``) the one-line error that names it."""
    if exit_code_for(err) is not None:
        return err
    from .import_failure import broken_import

    found = broken_import(err)
    if found is None:
        return err
    missing, args = found
    return UserError(*args) if missing else RunError(*args)


def fail(err: BaseException) -> ErrorExit:
    """Print ``err`` as one paragraph; the ``SystemExit`` to raise (``raise fail(err) from None``)."""
    err = _known(err)
    code = report(err)
    return ErrorExit(f"error: {one_paragraph(str(err))}", code)


def debug_enabled(argv: Optional[list[str]] = None) -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0") or bool(argv and "--debug" in argv)


def strip_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug``, and whether it (or ``SCALEVEC_DEBUG``) asks for tracebacks."""
    return [a for a in argv if a != "--debug"], debug_enabled(argv)


def exit_code_for(err: BaseException) -> Optional[int]:
    """The exit code of a user-facing error, or ``None`` for an unexpected one (a bug)."""
    if isinstance(err, UserError):
        return err.exit_code
    names = {cls.__name__ for cls in type(err).__mro__}
    if names & {"MissingCheckpointError", "MismatchedCheckpointError"}:  # not there, or another model's
        return 2
    if names & {"CheckpointError", "NonFiniteLossError"}:
        return 1
    if names & {"MisconfigurationException", "ExportError", "ValueError", "FileNotFoundError", "FileExistsError",
                "NotADirectoryError", "IsADirectoryError", "ArgumentError"}:
        return 2
    if isinstance(err, OSError):
        return 1
    return None


def one_paragraph(message: str) -> str:
    """Collapse runs of whitespace (jsonargparse and Lightning write several lines) into one paragraph."""
    text = " ".join(str(message).split())
    return text[len("error: "):] if text.startswith("error: ") else text


def say(line: str) -> None:
    """``line`` on stderr in one write: ``print`` writes the text and its newline apart, which an unbuffered
    stderr (``python -u``, ``PYTHONUNBUFFERED``) passes on as two writes, so the ranks of a run, writing to the
    same pipe, could glue their lines together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def report(err: BaseException) -> int:
    """Print ``err`` as one paragraph and return its exit code (1 for an unexpected error)."""
    err = _known(err)
    code = exit_code_for(err)
    if "OutOfMemoryError" in {cls.__name__ for cls in type(err).__mro__}:
        say(f"error: device memory: {one_paragraph(str(err))[:300]}: out of memory; lower data.batch_size (a recipe "
            "with global_batch_tokens keeps its global batch by accumulating more; otherwise raise "
            "trainer.accumulate_grad_batches), or turn on model.parallel.activation_checkpointing")
        return 1
    if code is None:
        say(f"error: internal: {type(err).__name__}: {one_paragraph(str(err))}; this looks like a bug in "
            f"scalevec_lit: run again with --debug (or {DEBUG_ENV}=1) for the traceback and report it")
        return 1
    say(f"error: {one_paragraph(str(err))}")
    return code


def leave(err: BaseException, debug: bool = False) -> NoReturn:
    """Print ``err`` as one paragraph (its traceback first with ``debug``), flush, and end the process with its
    exit code by ``os._exit``: for an error after which the interpreter must not exit normally (a lost peer:
    ``PeerLostError`` in ``lit/peers.py`` says why)."""
    if debug:
        import traceback

        traceback.print_exception(err)
    code = report(err)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the line is all that could be written
            pass
    os._exit(code)


def _stopped(stop: Any, debug: bool) -> SystemExit:
    """Print the line of ``stop`` (a ``StopSignal``; with ``debug`` the traceback of the exception being handled
    first); the ``SystemExit`` with 128 + its signal."""
    if debug:
        import traceback

        traceback.print_exc()
    say(f"error: {stop}")
    return SystemExit(stop.exit_code)


def run_guarded(fn: Callable[[list[str]], Any], argv: list[str]) -> Any:
    """Call ``fn(argv without --debug)``; turn any exception into one paragraph and ``SystemExit(code)``, and a
    stop signal at any moment into one line and ``SystemExit(128 + signal)`` (``stopsignal.py``): also one whose
    ``StopSignal`` code the command ran swallowed (a ``__del__``, a library's ``except BaseException``), when the
    command then returns, exits 0 or fails."""
    from . import stopsignal

    argv, debug = strip_debug(list(argv))
    command = next((a for a in argv if not a.startswith("-")), None)
    nested = stopsignal.enter_command()  # e.g. `python -m scalevec_lit export` calls export's main through here
    previous = {} if nested else stopsignal.install(command)
    debug_before = os.environ.get(DEBUG_ENV)  # --debug holds for this command (and what it starts), not after it
    try:
        if debug:
            os.environ[DEBUG_ENV] = "1"
        try:
            result = fn(argv)
        except SystemExit as err:
            if err.code not in (0, None) or nested or stopsignal.swallowed() is None:
                raise  # a command's own exit code (its line, if any, is printed)
            raise stopsignal.swallowed(returned=True) from None  # e.g. fit --print_plan
        pending = 0 if nested else stopsignal.pending_exit_code()
        if pending:
            say(f"error: {stopsignal.describe_pending()}")
            raise SystemExit(pending)
        lost = None if nested else stopsignal.swallowed(returned=True)
        if lost is not None:
            raise lost
        return result
    except SystemExit:
        raise
    except (stopsignal.StopSignal, KeyboardInterrupt) as err:
        if nested:
            raise
        stop = err if isinstance(err, stopsignal.StopSignal) else stopsignal.StopSignal(2)  # 2: SIGINT
        raise _stopped(stop, debug) from None
    except BaseException as err:  # noqa: BLE001 - the point of this function
        if getattr(err, "leave_at_once", False):
            leave(err, debug)
        stop = stopsignal.swallowed()  # the command failed after a stop signal was taken: the stop is the answer
        if stop is not None:
            if nested:
                raise stop from err
            raise _stopped(stop, debug) from None
        if debug:
            raise
        raise fail(err) from None
    finally:
        if debug_before is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = debug_before
        stopsignal.leave_command()
        stopsignal.restore(previous)
