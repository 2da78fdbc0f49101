"""The library's own sentence first (issue 32, item 6): when the command line builds a recipe's classes
(``trainer.callbacks``, the model, the optimizer …) and a class's ``__init__`` refuses an argument, jsonargparse
wraps that sentence in about 1,000 characters of its own ("Does not validate against any of the Union subtypes
… Subtypes: … Given value: Namespace(…)"), with the class's sentence somewhere in the middle.

``own_sentence_first()`` goes around that build (``scalevec_lit/cli.py``, ``ScaleVecCLI.instantiate_classes``):
when jsonargparse's error was caused by a ``UserError`` or ``ValueError`` raised outside jsonargparse (the
class's own check, e.g. ``SharpnessMonitor.tol: 0.0: must be > 0; …``), that error is raised instead, so the
command prints it as its one line (exit 2). jsonargparse's own errors (a wrong type, an unknown class path)
and any other exception pass unchanged.

Plain Python: imports nothing of Lightning or torch.
"""
from __future__ import annotations

import contextlib
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
