"""The library's own sentence first (issue 32, item 6): when the command line builds a recipe's classes
(``trainer.callbacks``, the model, the optimizer …) and a class's ``__init__`` refuses an argument, jsonargparse
wraps that sentence in about 1,000 characters of its own ("Does not validate against any of the Union subtypes
… Subtypes: … Given value: Namespace(…)"), with the class's sentence somewhere in the middle.

``argument_sentence_first(message)`` does the same for jsonargparse's own refusal of an argument while it parses
(a wrong type: ``every_n_steps: abc``): the class, the argument and jsonargparse's sentence about it first,
``trainer.callbacks: SharpnessMonitor.every_n_steps: Expected a <class 'int'>. Got value: abc; see its
arguments: …``, in place of the Union text (``ScaleVecArgumentParser.error``).

``parser_sentence(message, parser)`` is what ``ScaleVecArgumentParser.error`` prints: an argument's line as above
(also inside a ``Callable``, ``model.optimizer.init_args.*``), else the line of a wrong class, choice, plain or
group value (``_cli_values.py``), else jsonargparse's message.

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
from typing import Any, Iterator, Optional

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
_PROBLEM = re.compile(r"Problem with given class_path '([\w.]+)': (.*?)(?: - Not a valid subclass of | - Problem with given "
                      r"class_path | - Expected a <class 'NoneType'>(?! Given value type: <class '(?:str|int|float)'>)|$)")
_ARG = re.compile(r'Parser key "([\w.]+)": (.*)')
_UNKNOWN = re.compile(r"Option '([\w.]+)' is not accepted")
_CALLABLE = re.compile(r'Parser key "([\w.]+)": Type typing\.Callable\[.*?\] expects a function or a callable class: '
                       r"(.*?)\. Got value: Namespace\(class_path='([\w.]+)'")
_PATH_FIRST = re.compile(r'(Parser key "[\w.]+": )- Expected a path but .*? either not accessible or invalid - ')
_LITERAL = re.compile(r"Expected a typing\.Literal\[(.*)\]\. Got value: (\S+)")
_UNION_OF = re.compile(r"Does not validate against any of the Union subtypes Subtypes: \[(.*?)\] Errors: .* Given value "
                       r"type: <class '[^']*'> Given value: (\S+)$")


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


def _argument_line(key: str, class_path: str, inner: str) -> str:
    """``<key>: <Class>.<argument>: <jsonargparse's sentence>; <the fix>`` for the refusal ``inner`` of one argument."""
    name = class_path.rpartition(".")[2]
    unknown = _UNKNOWN.match(inner)
    if unknown:
        close = difflib.get_close_matches(unknown.group(1), _arguments(class_path), n=2, cutoff=0.6)
        fix = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close else
               f"see its arguments: python -m scalevec_lit fit --{key}.help {class_path}")
        return f"{key}: {name}.{unknown.group(1)}: not an argument of {name}; {fix}"
    inner = inner.split(" - Problem with given class_path ")[0]  # the Union's other members (lightning.Callback)
    arg = _ARG.match(inner)
    where = f"{name}.{arg.group(1)}" if arg else name
    said = _plain(arg.group(2) if arg else inner).rstrip(" .")
    return f"{key}: {where}: {said}; see its arguments: python -m scalevec_lit fit --{key}.help {class_path}"


def _plain(said: str) -> str:
    """jsonargparse's Union text about one value (``- Expected a path but abc ... Does not validate against any of
    the Union subtypes Subtypes: [<class 'float'>, <class 'torch.Tensor'>] Errors: ... Given value: abc``) as
    ``abc: expected a number or torch.Tensor``, a ``Literal``'s as ``fp8: not one of fp32, bf16``; any other sentence
    unchanged."""
    literal = _LITERAL.fullmatch(said)
    if literal is not None:
        return f"{literal.group(2)}: not one of {', '.join(v.strip().strip(chr(39)) for v in literal.group(1).split(','))}"
    union = _UNION_OF.search(said)
    if union is None:
        return said
    types = [t.strip() for t in union.group(1).split(",")]
    names = [re.sub(r"^<class '(.*)'>$", r"\1", t) for t in types]
    names = [_WORDS.get(n, n) for n in names if n != "NoneType"]
    return f"{union.group(2)}: expected {' or '.join(names)}{' (or null)' if 'NoneType' in union.group(1) else ''}"


_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def argument_sentence_first(message: str) -> str:
    """jsonargparse's refusal of one class's argument inside a Union (``trainer.callbacks``, ``model.schedule`` …) or a
    Callable (``model.optimizer``) as ``<key>: <Class>.<argument>: <its sentence>; see its arguments: <the help
    command>``; any other message unchanged."""
    text = _PATH_FIRST.sub(r"\1", " ".join(str(message).split()))  # a string value was tried as a file first
    called = _CALLABLE.search(text)
    if called is not None and called.group(2).startswith(("Option '", 'Parser key "')):  # else: the class itself
        return _argument_line(called.group(1), called.group(3), called.group(2).strip())
    outer, problem = _UNION.search(text), _PROBLEM.search(text)
    if outer is None or problem is None:
        return message
    return _argument_line(outer.group(1), problem.group(1), problem.group(2).strip())


def parser_sentence(message: str, parser: Any) -> str:
    """The one line for a message of jsonargparse (``ScaleVecArgumentParser.error``): a class's argument first
    (``argument_sentence_first``), else a wrong class, choice or group value (``_cli_values.value_sentence``),
    else the message unchanged."""
    placed = argument_sentence_first(message)
    if placed != message and _argument_level(" ".join(str(message).split())):
        return placed
    from ._cli_values import value_sentence

    return value_sentence(message, parser) or placed


def _argument_level(text: str) -> bool:
    """Whether jsonargparse refused one argument of a class (else the class itself: not importable, wrong type)."""
    called, problem = _CALLABLE.search(text), _PROBLEM.search(text)
    inner = called.group(2) if called else problem.group(2) if problem else ""
    return inner.strip().startswith(("Option '", 'Parser key "'))
