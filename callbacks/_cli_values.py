"""A wrong value of a class-typed or choice-typed key, in one line (``ScaleVecArgumentParser.error`` through
``_cli_errors.parser_sentence``): jsonargparse's text (``Parser key "model.optimizer": - Expected a path but foo
either not accessible or invalid - Expected a dot import path string: foo``) becomes
``<key>: <value>: <what is wrong>; <what is accepted and one example of the fix>``:

- a name the parser does not know (``--model.optimizer=foo``): the class names it resolves for that key, the
  library's own first (the optimizers, schedules, blocks and callbacks it ships), the closest one when there is
  one, and that a dotted import path of a subclass of the key's base class is accepted too;
- a dotted path whose module does not import (``nosuchpkg.Opt``, or a module whose own import fails): which
  module, jsonargparse's reason (``ModuleNotFoundError: No module named 'nosuchpkg'``) and the fix;
- a dotted path to a module that lacks the name (``torch.optim.Adamm``): the closest names the module has;
- a dotted path to an importable object of the wrong type (``torch.nn.Linear`` as an optimizer): what it is
  and the base class the key needs;
- a value outside a key's choices (``model.nonfinite``, ``trainer.precision``, a placement): the choices;
- a plain value where a group of keys is expected (``--model.strategy=dnp``, ``--data=foo``): how to set its
  keys, and for a strategy the shipped presets (``--config strategy/dnp``);
- a key of plain types (``model.config.n_layer: four``): the type and an example; an empty value: that it is;
- a mapping (``--model.strategy={placement: {q: dnpp}}``): the line of the key inside it that was refused.

Any other message (and any case it cannot place: the class is importable and of the right type) is left as it
is. Plain Python at import: jsonargparse, Lightning and the classes are imported only when an error is placed.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
import sys
import typing
from typing import Any, Optional

from ._cli_import import describe, import_dotted

__all__: list[str] = []  # nothing here is a callback

_KEY = re.compile(r'^Parser key "([\w.]+)": (.*)$')
_VALUE = (re.compile(r"Expected a path but (\S+) either not accessible or invalid"),
          re.compile(r"Unable to load config '([^']*)'"),
          re.compile(r"Given value: \{'class_path': '([^']+)'"),
          re.compile(r"Problem with given class_path '([^']+)'"),
          re.compile(r"Import path (\S+) does not correspond to a subclass"),
          re.compile(r"Got value: Namespace\(class_path='([^']+)'"),
          re.compile(r"Expected a dot import path string:(?: (\S+))?(?= - |$)"),
          re.compile(r"Got value:(?: (\S+))?$"),
          re.compile(r"Given value:(?: (\S+))?$"))
#: the example of the fix for the keys of the shipped recipes (otherwise: the closest or first accepted name)
EXAMPLES = {"model.optimizer": "torch.optim.AdamW", "model.schedule": "WarmupCosine", "model.block": "Block",
            "trainer.callbacks": "scalevec_lit.callbacks.ScaleVectorMonitor", "trainer.logger": "TensorBoardLogger",
            "trainer.precision": "bf16-mixed", "model.strategy.vector": "PlainScale",
            "model.param_groups": "'{scale: {weight_decay: 0.0}}'"}
#: how to set one key of a group of keys (a dataclass or the data module) that was given a plain value
GROUP_EXAMPLES = {"model.strategy": "--model.strategy.placement.q=dual_norm", "data": "--data.batch_size=16",
                  "model.config": "--model.config.n_layer=4", "model.parallel":
                  "--model.parallel.activation_checkpointing=true", "model.config.moe": "--model.config.moe.num_experts=8"}
_MORE = 12  # other packages' names shown at most (the library's own are all shown)


def _given(text: str) -> Optional[str]:
    for pattern in _VALUE:
        found = pattern.search(text)
        if found:
            return found.group(1) or ""
    return None


def parser_action(parser: Any, key: str) -> Any:
    """The parser's action for ``key`` (None when there is none, or with another jsonargparse)."""
    try:
        from jsonargparse._subcommands import find_action
    except ImportError:
        return None
    return find_action(parser, key)


def _typehint(parser: Any, key: str) -> tuple[bool, Any]:
    """``(whether the key is a group of keys loaded from a file, its type hint or None)``."""
    action = parser_action(parser, key)
    if action is None:
        return False, None
    return type(action).__name__ == "_ActionConfigLoad", getattr(action, "_typehint", None)


def _flat(typehint: Any) -> list[Any]:
    """The members of a Union (Optional) and the element type of a list, recursively; None left out."""
    origin = typing.get_origin(typehint)
    if origin is typing.Union:
        return [t for arg in typing.get_args(typehint) for t in _flat(arg)]
    if origin in (list, tuple, set) or getattr(origin, "__name__", "") in ("Iterable", "Sequence", "Callable"):
        args = typing.get_args(typehint)
        return _flat(args[-1]) if args else []
    return [] if typehint is type(None) else [typehint]


def _choices(typehint: Any) -> Optional[list[Any]]:
    """The values of a key whose every type is a ``Literal`` (``None`` aside), each once, or None."""
    members = _flat(typehint)
    if not members or any(typing.get_origin(m) is not typing.Literal for m in members):
        return None
    values: list[Any] = []
    for m in members:
        values += [v for v in typing.get_args(m) if str(v) not in map(str, values)]
    return values


def _bases(typehint: Any) -> tuple[type, ...]:
    return tuple(dict.fromkeys(m for m in _flat(typehint) if isinstance(m, type) and typing.get_origin(m) is None
                               and m not in (str, int, float, bool, dict)))


def _path(cls: type) -> str:
    try:
        from jsonargparse._typehints import get_import_path

        return get_import_path(cls)
    except Exception:  # noqa: BLE001 - its name is enough
        return f"{cls.__module__}.{cls.__qualname__}"


def _importable(path: str) -> bool:
    """Whether ``path`` names an attribute of its loaded module: not a class made at run time (Lightning's
    ``LightningOptimizer`` makes ``LightningAdamW`` and the like once a fit has run in the process), which
    no name or path resolves to, and which would make the list depend on what the process ran before."""
    module, _, name = path.rpartition(".")
    return getattr(sys.modules.get(module), name, None) is not None


def _known(bases: tuple[type, ...]) -> tuple[list[str], list[str]]:
    """``(the library's names for the key, other packages' names)``: what the parser resolves by class name, the
    library's base class included (a ``Block`` is a block); the library's callbacks, loaded lazily, by their
    dotted path ``scalevec_lit.callbacks.X`` (a short name resolves only once their module is imported)."""
    from jsonargparse._typehints import get_all_subclass_paths

    paths: list[str] = []
    for base in bases:
        paths += [p for p in get_all_subclass_paths(base) if p not in paths and _importable(p)]
    bare = {_path(b) for b in bases if not _path(b).startswith("scalevec_lit.")}  # torch's Optimizer, Logger ...
    ours = [p.rpartition(".")[2] for p in paths if p.startswith("scalevec_lit.")]
    if any(b.__name__ == "Callback" for b in bases):
        import scalevec_lit.callbacks as shipped

        ours = [f"scalevec_lit.callbacks.{n}" for n in shipped.__dir__()
                if isinstance(getattr(shipped, n), type) and issubclass(getattr(shipped, n), bases)]
    others = sorted({p.rpartition(".")[2] for p in paths if not p.startswith("scalevec_lit.") and p not in bare},
                    key=str.lower)
    return list(dict.fromkeys(ours)), others


def _closest(value: str, names: list[str]) -> list[str]:
    short = {n.rpartition(".")[2].lower(): n for n in names}
    return [short[c] for c in difflib.get_close_matches(value.rpartition(".")[2].lower(), list(short), n=2,
                                                        cutoff=0.6)]


def _flag(key: str, typehint: Any, value: Any) -> str:
    many = any(typing.get_origin(t) is list for t in typing.get_args(typehint) or (typehint,))
    return f"--{key}{'+=' if many else '='}{value}"


def _accepted(ours: list[str], others: list[str]) -> str:
    shown = others[:_MORE] + (["…"] if len(others) > _MORE else [])
    listed = "; ".join(([f"this library's {', '.join(ours)}"] if ours else []) +
                       ([f"{'also ' if ours else ''}{', '.join(shown)}"] if shown else []))
    return f"a class name ({listed})"


def _class_line(key: str, value: str, typehint: Any, bases: tuple[type, ...]) -> Optional[str]:
    ours, others = _known(bases)
    base = " or ".join(_path(b) for b in bases)
    accepted = _accepted(ours, others)
    close = _closest(value, ours + others)
    example = close[0] if close else EXAMPLES.get(key) or (ours + others + [base])[0]
    fix = f"e.g. {_flag(key, typehint, example)}"
    if "." not in value and value in {n.rpartition(".")[2] for n in ours + others}:
        return None  # a class the key takes: jsonargparse refused something else (an argument), keep its words
    if "." not in value:
        said = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        return (f"{key}: {value}: not a class name the parser knows for this key; {said}give {accepted} or "
                f"the dotted import path of a subclass of {base}, {fix}")
    obj, why = import_dotted(value)
    if why is not None:
        if "has no attribute" in why:
            owner = why.split(" ")[1]
            names = [n for n in dir(importlib.import_module(owner)) if not n.startswith("_")] if why.startswith(
                "module") else []
            near = [f"{owner}.{n}" for n in difflib.get_close_matches(value.rpartition(".")[2], names, n=2)]
            if near:
                return f"{key}: {value}: {why}; did you mean {' or '.join(near)}? e.g. {_flag(key, typehint, near[0])}"
            return f"{key}: {value}: {why}; give {accepted} or the dotted import path of a subclass of {base}"
        return f"{key}: {value}: {why}; {fix}"
    if isinstance(obj, type) and issubclass(obj, bases):
        return None  # of the right type: jsonargparse's reason is another one; keep its text
    return (f"{key}: {value}: is {describe(obj)}: the key needs a subclass of {base}; give {accepted} or the "
            f"dotted import path of another subclass, {fix}")


_SIMPLE = {int: ("an integer", 1), float: ("a number", 1.0), bool: ("true or false", "true"),
           dict: ("a mapping ({key: value})", "'{KEY: VALUE}'")}


def _simple_line(key: str, value: str, typehint: Any, action: Any) -> Optional[str]:
    """``<key>: <value>: expected an integer (or null); e.g. --<key>=<its default>`` for a key of plain types."""
    members = [dict if typing.get_origin(m) is dict else m for m in _flat(typehint)]
    if not members or any(m not in _SIMPLE for m in members):
        return None
    default = getattr(action, "default", None)
    if isinstance(default, bool):
        default = str(default).lower()
    if int in members and float in members:  # a number
        members = [m for m in members if m is not int]
    example = EXAMPLES.get(key) or (default if isinstance(default, (int, float, str)) else _SIMPLE[members[0]][1])
    words = " or ".join(_SIMPLE[m][0] for m in dict.fromkeys(members))
    optional = " (or null)" if type(None) in typing.get_args(typehint) else ""
    return f"{key}: {value}: expected {words}{optional}; e.g. --{key}={example}"


def _child(parser: Any, key: str) -> str:
    """One key of the group ``key`` with its default, as a command-line option (``--key.child=value``)."""
    for action in getattr(parser, "_actions", []):
        dest = getattr(action, "dest", "")
        if dest.startswith(key + ".") and action.option_strings and not dest.endswith((".help", "__path__")):
            default = action.default
            shown = str(default).lower() if isinstance(default, bool) else default
            return f"--{dest}={shown if isinstance(shown, (int, float, str)) else 'VALUE'}"
    return f"--{key}.KEY=VALUE"


def _group_line(key: str, value: str, parser: Any = None) -> str:
    example = GROUP_EXAMPLES.get(key) or _child(parser, key)
    fix = f"set its keys one by one ({example}) or give a YAML file of them (--{key}=FILE.yaml)"
    if key == "model.strategy":
        from scalevec_lit.recipe_lookup import recipe_names

        presets = [n.partition("/")[2] for n in recipe_names() if n.startswith("strategy/")]
        named = value.rpartition("/")[2].removesuffix(".yaml")
        if named in presets:
            return (f"{key}: {value}: a strategy preset is a recipe of its own: add it with --config strategy/{named} "
                    f"(after the base recipe), or {fix}")
        fix += f", or add a preset with --config strategy/NAME ({', '.join(presets)})"
    return f"{key}: {value}: not a file; {fix}"


def _example(parser: Any, key: str) -> Optional[str]:
    """``e.g. --<key>=<value>``: the key's example above, else its default; None without either."""
    default = EXAMPLES.get(key, getattr(parser_action(parser, key), "default", None))
    if isinstance(default, bool):
        default = str(default).lower()
    return f"e.g. --{key}={default}" if isinstance(default, (int, float, str)) and default != "" else None


def value_sentence(message: str, parser: Any) -> Optional[str]:
    """One line for jsonargparse's refusal of a class-typed, choice-typed or group key's value, or None."""
    text = " ".join(str(message).split())
    found = _KEY.match(text)
    if found is None:
        return None
    key, said = found.groups()
    value = _given(said)
    inner = said.rfind('Parser key "')
    if value is not None and value.startswith("{") and inner > 0:  # a mapping: the line of the key inside it
        return value_sentence(said[inner:], parser)
    if value is None or value.startswith("{"):
        return None
    value = value.strip("[],") if value.startswith("[") else value  # a list: its first element
    if not value:
        return f"{key}: (empty): no value given; " + (_example(parser, key) or f"give --{key}=VALUE")
    try:
        group, typehint = _typehint(parser, key)
        if group or "Unable to load config" in said:
            return _group_line(key, value, parser)
        if typehint is None:
            return None
        choices = _choices(typehint)
        if choices is not None:
            names = [str(c) for c in choices]
            close = _closest(value, names)
            said_close = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            default = getattr(parser_action(parser, key), "default", None)
            example = close[0] if close else EXAMPLES.get(key, str(default) if str(default) in names else names[0])
            return f"{key}: {value}: not one of {', '.join(names)}; {said_close}e.g. {_flag(key, typehint, example)}"
        simple = _simple_line(key, value, typehint, parser_action(parser, key))
        if simple is not None:
            return simple
        bases = _bases(typehint)
        if not bases:
            return None
        if all(dataclasses.is_dataclass(b) for b in bases):
            obj, _ = import_dotted(value) if "." in value else (None, None)
            return None if isinstance(obj, type) and issubclass(obj, bases) else _group_line(key, value, parser)
        return _class_line(key, value, typehint, bases)
    except Exception:  # noqa: BLE001 - placing the error is a courtesy; never hide jsonargparse's text
        return None


def import_failure_line(err: BaseException) -> Optional[str]:
    """One line for an exception that a module named by a value raised while jsonargparse imported it (it lets any
    error but an ``ImportError`` through, e.g. ``RuntimeError`` at the module's top level), or None for any other
    exception: the key, the value, the module and its error."""
    tb, path, key = err.__traceback__, None, None
    while tb is not None:
        frame = tb.tb_frame
        if "jsonargparse" in frame.f_code.co_filename.replace("\\", "/").split("/"):
            if frame.f_code.co_name == "import_object" and isinstance(frame.f_locals.get("name"), str):
                path = frame.f_locals["name"]
            owner = frame.f_locals.get("self")
            if type(owner).__name__ == "ActionTypeHint" and isinstance(getattr(owner, "dest", None), str):
                key = owner.dest
        tb = tb.tb_next
    if path is None or key is None:
        return None
    _, why = import_dotted(path)
    if why is None:
        return None
    example = f"; e.g. --{key}={EXAMPLES[key]}" if key in EXAMPLES else ""
    return f"{key}: {path}: {why}{example}"
