"""A dependency that fails to import is a broken install, not a bug of this library: one line names the package,
who imports it and the fix.

The case that made it: a ``torchvision`` built for another ``torch`` (``RuntimeError: operator torchvision::nms
does not exist``) fails while Lightning imports ``torchmetrics``, which imports ``torchvision``: every command
stopped with ``internal: ... this looks like a bug in scalevec_lit``. ``broken_import(err)`` reads the traceback
of an unexpected error: when it was raised while a module of another package than this library (and than the
standard library) was being imported (the innermost ``<module>`` frame), that package is named, with the
packages whose code imported it (innermost first) and the fix. A package that is not installed at all
(``ModuleNotFoundError`` from inside another package) is missing: exit 2; one that is there but fails: exit 1.

Plain Python: must not import torch or Lightning (it explains why they could not be imported).
"""
from __future__ import annotations

import sys
from typing import Optional

_OURS = ("scalevec_lit", "callbacks", "__main__", "runpy", "importlib", "_frozen_importlib",
         "_frozen_importlib_external")


def _package(frame) -> Optional[str]:
    """The top-level package of the module a frame runs in, ``None`` for this library and the standard library."""
    top = str(frame.f_globals.get("__name__") or "").split(".")[0]
    if not top or top in _OURS or top in sys.stdlib_module_names:
        return None
    return top


def _version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - not installed as a distribution (a folder on PYTHONPATH): no version
        return ""


def _fix(name: str) -> str:
    if name == "torchvision":
        torch = _version("torch")
        return ("pip uninstall -y torchvision (nothing here needs it: litdata uses it only for images), or install the torchvision build that "
                f"matches torch{' ' + torch if torch else ''} (the pair pytorch.org lists)")
    return (f"reinstall it in a version that matches the packages that import it (pip install --force-reinstall "
            f"{name}), or pip uninstall -y {name} if nothing you run needs it")


def broken_import(err: BaseException) -> Optional[tuple[bool, tuple[str, str, str, str]]]:
    """For ``err`` raised by importing a package other than this library: whether that package is missing (a
    ``UserError``, exit 2) or broken (a ``RunError``, exit 1), and the error's key, value, what is wrong and the fix
    (``errors.py`` makes the error: this module is below it); ``None`` for any other error (the module docstring)."""
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    loading = [f for f in frames if f.f_code.co_name == "<module>"]
    failing = _package(loading[-1]) if loading else None
    missing = isinstance(err, ModuleNotFoundError) and err.name
    if missing:  # not installed: blame the missing package, imported from inside another one
        failing = str(err.name).split(".")[0]
        if not any(_package(f) for f in frames):
            return None  # imported by this library itself: its own import checks say what to do
    if failing is None:
        return None
    ours = [i for i, f in enumerate(frames) if str(f.f_globals.get("__name__") or "").split(".")[0] in _OURS[:2]]
    importers: list[str] = []
    for frame in frames[ours[-1] if ours else 0:]:  # from this library's last call (not its in-process callers)
        name = _package(frame)  # outermost first, up to the failing package's own code (what it calls: not blamed)
        if name == failing:
            break
        if name and name not in importers:
            importers.append(name)
    importers.reverse()  # innermost first: who imports it, then through which packages
    by = (f"imported by {importers[0]}" + (f", via {', '.join(importers[1:])}" if importers[1:] else "")
          if importers else "imported by scalevec_lit")
    version = _version(failing)
    what = f"{failing}{' ' + version if version else ''}"
    cause = f"{type(err).__name__}: {' '.join(str(err).split())}"
    if missing:
        return True, (failing, cause, f"{failing} is not installed ({by}): the installed packages are "
                      "incomplete, not a bug in scalevec_lit", f"pip install {failing}")
    return False, (failing, cause, f"importing the installed package {what} fails ({by}): a broken or "
                   "mismatched install of that package, not a bug in scalevec_lit", _fix(failing))
