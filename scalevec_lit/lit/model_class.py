"""``model.class_path``: a recipe or command line chooses a ``CausalLM`` subclass (e.g. one overriding
``build_model``), found before the command line is parsed.

LightningCLI's subclass mode would nest every model key under ``model.init_args`` (recipes, ``--model.config.*``
and the saved ``config.yaml`` would all change), so ``fit``/``validate``/``test`` keep the plain mode: the class
named by the last ``model.class_path`` among the ``--config`` files and the command line (later wins, as
jsonargparse does) is imported here and given to LightningCLI as the model class, whose parser then also
accepts (and saves in ``config.yaml``) ``model.class_path``. Its own constructor arguments sit beside
``class_path`` (``model: {class_path: mypkg.MyLM, config: ...}``), as for the stock class.

``model.block`` is looked at here too: a class that is not a ``Block`` subclass is refused by name
(``check_block``) before the parser's longer message about the ``Callable`` type.

Must not import Lightning at module level (``cli.py`` imports it first anyway).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Optional

from ..errors import UserError

KEY = "model.class_path"


def _from_yaml(text: str, where: str) -> Optional[str]:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None  # the parser reports a broken file itself
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        return None
    if "init_args" in model:
        raise UserError("model.init_args", where, "the model's arguments are written beside model.class_path, not "
                        "under init_args", "move the keys under model.init_args up one level (model: {class_path: "
                        "mypkg.MyLM, config: ...})")
    path = model.get("class_path")
    return None if path is None else str(path)


def chosen_class_path(argv: list[str]) -> Optional[str]:
    """The last ``model.class_path`` in ``--config`` files (or inline YAML) and ``--model.class_path`` options."""
    found: Optional[str] = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--config", f"--{KEY}") and not eq and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        if name == f"--{KEY}":
            found = value
        elif name == "--config":
            p = Path(value)
            text = p.read_text() if p.is_file() else value
            found = _from_yaml(text, value) or found
        i += 1
    return found


BLOCK_KEYS = ("--model.block", "--model.block.class_path")


def _block_of(value: object) -> Optional[str]:
    """The class path of a ``model.block`` value: ``pkg.Cls`` or ``{class_path: pkg.Cls, init_args: ...}``."""
    if isinstance(value, dict):
        value = value.get("class_path")
    return value if isinstance(value, str) and value else None


def chosen_block(argv: list[str]) -> Optional[str]:
    """The last ``model.block`` class path in ``--config`` files (or inline YAML) and ``--model.block[.class_path]``."""
    import yaml

    found: Optional[str] = None
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in ("--config", *BLOCK_KEYS) and not eq and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        if name in BLOCK_KEYS:
            try:
                found = _block_of(yaml.safe_load(value)) or found
            except yaml.YAMLError:
                pass
        elif name == "--config":
            p = Path(value)
            try:
                data = yaml.safe_load(p.read_text() if p.is_file() else value)
            except yaml.YAMLError:
                data = None  # the parser reports a broken file itself
            model = data.get("model") if isinstance(data, dict) else None
            found = (_block_of(model.get("block")) if isinstance(model, dict) else None) or found
        i += 1
    return found


def check_block(argv: list[str]) -> None:
    """Refuse a recipe's ``model.block`` that names a class that is not a ``Block`` subclass, before anything is
    parsed or built (a class that cannot be imported is left to the parser, which names it)."""
    from ..model.block import Block
    from ..model.spec import UnimportableClassError, class_path, import_class

    path = chosen_block(argv)
    if path is None:
        return
    try:
        cls = import_class(path)
    except UnimportableClassError:
        return
    if isinstance(cls, type) and not issubclass(cls, Block):
        raise UserError("model.block", path, f"is not a subclass of {class_path(Block)}: a recipe's block must be one "
                        "(from Python, Transformer(config, block=...) takes any callable (config, layer, strategy))",
                        "subclass scalevec_lit.model.Block (override forward, build_attention or build_mlp)")


def model_class(argv: list[str]) -> tuple[type, Optional[str]]:
    """``(the LightningModule class to parse and build, its class_path or None for CausalLM)``."""
    from ..model.spec import UnimportableClassError, class_path, import_class
    from .module import CausalLM

    check_block(argv)
    path = chosen_class_path(argv)
    if path is None:
        return CausalLM, None
    try:
        cls = import_class(path)
    except UnimportableClassError as err:
        problem, _, fix = str(err).partition("; ")
        raise UserError(KEY, path, problem.replace(f"the class {path} ", "", 1), fix) from None
    if not (isinstance(cls, type) and issubclass(cls, CausalLM)):
        raise UserError(KEY, path, f"is not a subclass of {class_path(CausalLM)}", "subclass CausalLM (override "
                        "build_model to build another model class), or choose a block with model.block.class_path")
    return cls, path


def add_class_path_argument(parser: Any, path: Optional[str]) -> None:
    """Accept ``model.class_path`` (and write it in the saved ``config.yaml``) when a subclass was chosen."""
    if path is not None:
        parser.add_argument(f"--{KEY}", type=str, default=path,
                            help="the CausalLM subclass to train (found before parsing: scalevec_lit/lit/model_class.py)")


@contextlib.contextmanager
def without_class_path(config: Any, subcommand: Optional[str]) -> Iterator[None]:
    """``model.class_path`` left out of the parsed config while the classes are instantiated (it chose the
    class; it is not a constructor argument), then put back for the saved ``config.yaml``."""
    section = config[subcommand] if subcommand is not None else config
    path = section.get(KEY)
    if path is None:
        yield
        return
    del section[KEY]
    try:
        yield
    finally:
        section[KEY] = path
