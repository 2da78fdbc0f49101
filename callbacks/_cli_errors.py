"""The library's own sentence first (issue 32, item 6): when the command line builds a recipe's classes
(``trainer.callbacks``, the model, the optimizer …) and a class's ``__init__`` refuses an argument, jsonargparse
wraps that sentence in about 1,000 characters of its own ("Does not validate against any of the Union subtypes
… Subtypes: … Given value: Namespace(…)"), with the class's sentence somewhere in the middle.

``argument_sentence_first(message)`` does the same for jsonargparse's own refusal of an argument while it parses
(a wrong type: ``every_n_steps: abc``): the class, the argument and jsonargparse's sentence about it first,
``trainer.callbacks: SharpnessMonitor.every_n_steps: Expected a <class 'int'>. Got value: abc; see its
arguments: …``, in place of the Union text (``ScaleVecArgumentParser.error``).

``own_sentence_first()`` goes around that build (``scalevec_lit/cli.py``, ``ScaleVecCLI.instantiate_classes``):
when jsonargparse's error was caused by a ``UserError`` or ``ValueError`` raised outside jsonargparse (the
class's own check, e.g. ``SharpnessMonitor.tol: 0.0: must be > 0; …``), that error is raised instead, so the
command prints it as its one line (exit 2). jsonargparse's own errors (a wrong type, an unknown class path)
and any other exception pass unchanged.

Plain Python: imports nothing of Lightning or torch.
"""
from __future__ import annotations

import contextlib
import difflib
import re
import traceback
from typing import Iterator, Optional

__all__: list[str] = []  # nothing here is a callback


def _raised_in_jsonargparse(err: BaseException) -> bool:
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and "jsonargparse" in frames[-1].filename.replace("\\", "/").split("/")


def own_error(err: BaseException) -> Optional[BaseException]:
    """The class's own error that ``err`` (raised by jsonargparse) wraps, or None: the innermost exception of
    its chain of causes, when it is a ``UserError`` or ``ValueError`` raised outside jsonargparse."""
    from scalevec_lit.errors import UserError

    if not _raised_in_jsonargparse(err):
        return None
    chain: list[BaseException] = [err]
    while chain[-1].__cause__ is not None and len(chain) < 32 and chain[-1].__cause__ not in chain:
        chain.append(chain[-1].__cause__)
    inner = chain[-1]
    if inner is err or _raised_in_jsonargparse(inner) or not isinstance(inner, (UserError, ValueError)):
        return None
    return inner


@contextlib.contextmanager
def own_sentence_first() -> Iterator[None]:
    """Re-raise the class's own error (``own_error``) in place of jsonargparse's text around it."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - re-raised unchanged unless it wraps a class's own sentence
        inner = own_error(err)
        if inner is None:
            raise
        raise inner from None


_UNION = re.compile(r'Parser key "([\w.]+)": Does not validate against any of the Union subtypes')
_PROBLEM = re.compile(r"Problem with given class_path '([\w.]+)': (.*?)(?: - Not a valid subclass of | - Expected a "
                      r"<class 'NoneType'>|$)")
_ARG = re.compile(r'Parser key "([\w.]+)": (.*)')
_UNKNOWN = re.compile(r"Option '([\w.]+)' is not accepted")


def _arguments(class_path: str) -> list[str]:
    """The ``__init__`` arguments of ``class_path`` (none when it cannot be imported)."""
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        return [p for p in inspect.signature(getattr(importlib.import_module(module), name)).parameters
                if p not in ("self", "args", "kwargs")]
    except Exception:  # noqa: BLE001 - suggestions are a courtesy
        return []


def argument_sentence_first(message: str) -> str:
    """jsonargparse's refusal of one class's argument inside a Union (``trainer.callbacks``, ``model.optimizer`` …)
    as ``<key>: <Class>.<argument>: <its sentence>; see its arguments: <the help command>``; any other message
    unchanged."""
    text = " ".join(str(message).split())
    outer, problem = _UNION.search(text), _PROBLEM.search(text)
    if outer is None or problem is None:
        return message
    class_path, inner = problem.group(1), problem.group(2).strip()
    name = class_path.rpartition(".")[2]
    unknown = _UNKNOWN.match(inner)
    if unknown:
        close = difflib.get_close_matches(unknown.group(1), _arguments(class_path), n=2, cutoff=0.6)
        fix = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close else
               f"see its arguments: python -m scalevec_lit fit --{outer.group(1)}.help {class_path}")
        return f"{outer.group(1)}: {name}.{unknown.group(1)}: not an argument of {name}; {fix}"
    arg = _ARG.match(inner)
    where = f"{name}.{arg.group(1)}" if arg else name
    said = (arg.group(2) if arg else inner).rstrip(" .")
    return (f"{outer.group(1)}: {where}: {said}; see its arguments: python -m scalevec_lit fit "
            f"--{outer.group(1)}.help {class_path}")
