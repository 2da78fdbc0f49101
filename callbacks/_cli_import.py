"""A dotted import path given as a value (``callbacks/_cli_values.py``): the object, or why it cannot be imported
(no such package; its module's own import failed, and with what; the module or class lacks the name), and what an
object is when it is not of the key's type. Plain Python."""
from __future__ import annotations

import importlib
from typing import Any, Optional

__all__: list[str] = []  # nothing here is a callback


def _path(cls: type) -> str:
    """The shortest import path jsonargparse knows for ``cls`` (``torch.nn.Module``), else its module's."""
    try:
        from jsonargparse._typehints import get_import_path

        return get_import_path(cls)
    except Exception:  # noqa: BLE001 - its name is enough
        return f"{cls.__module__}.{cls.__qualname__}"


def import_dotted(path: str) -> tuple[Any, Optional[str]]:
    """``(the object, None)``, or ``(None, why it cannot be imported)``: the modules of the path are imported
    shortest first, the rest are attributes."""
    parts = path.split(".")
    obj: Any = None
    cut = 0
    for cut in range(1, len(parts) + 1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:  # the module exists; one of its own imports is missing
                return None, (f"importing its module {module_name} failed ({type(err).__name__}: {err}); install "
                              "what that module imports, or fix the module")
            cut -= 1
            break
        except Exception as err:  # noqa: BLE001 - the module's own error, named
            return None, f"importing its module {module_name} failed ({type(err).__name__}: {err}); fix the module"
    if cut == 0:
        return None, (f"cannot be imported (ModuleNotFoundError: No module named {parts[0]!r}); check the spelling, "
                      f"or make its package importable (install it, or add the folder that holds {parts[0]!r} to "
                      "PYTHONPATH)")
    for i, name in enumerate(parts[cut:]):
        if not hasattr(obj, name):
            return None, f"{'module' if i == 0 else 'class'} {'.'.join(parts[:cut + i])} has no attribute {name!r}"
        obj = getattr(obj, name)
    return obj, None


def describe(obj: Any) -> str:
    import inspect

    if inspect.ismodule(obj):
        return "a module, not a class"
    if isinstance(obj, type):
        return f"a class derived from {', '.join(_path(b) for b in obj.__mro__[1:-1][:1]) or 'object'}"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "a function, not a class"
    return f"a {type(obj).__name__}, not a class"
