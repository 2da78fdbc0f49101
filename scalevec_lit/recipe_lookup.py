"""The shipped recipes by name, and the ``recipes`` command.

The recipes (``recipes/*.yaml`` in the repository: sizes, strategies, optimizers, examples, ablation
studies) travel with the package: a wheel holds them as ``scalevec_lit/recipes/`` (``package-dir`` in
pyproject.toml); a clone or an editable install reads the repository's ``recipes/`` folder. A recipe's name
is its path below that folder without ``.yaml``: ``smoke``, ``strategy/unified``, ``ablation/claims_cpu``.

``--config`` takes a file path or a name (``--config smoke``, ``--config strategy/unified``; the spellings
``smoke.yaml`` and ``recipes/smoke.yaml`` name it too, so that the commands of a clone's documentation work
from any folder after ``pip install``). A file that exists wins over a shipped recipe of the same name.

``scalevec-lit recipes`` lists them; ``recipes show NAME`` prints one; ``recipes copy NAME DEST`` writes an
editable copy (an existing file is replaced only with ``--overwrite``).

Plain Python: must not import torch or Lightning.
"""
from __future__ import annotations

import argparse
import difflib
import shutil
import sys
from pathlib import Path
from typing import Iterable, Optional

from .errors import CommandLineParser, UserError

SUFFIX = ".yaml"
PREFIX = "recipes/"  # how a clone's documentation spells a shipped recipe
NOT_RECIPES = ("examples/tasks/",)  # files the recipes read (lm-eval tasks), shipped beside them


def recipe_root() -> Optional[Path]:
    """The folder of the shipped recipes: inside the installed package, else the repository's ``recipes/``."""
    here = Path(__file__).resolve().parent
    for folder in (here / "recipes", here.parent / "recipes"):  # a wheel; a clone or an editable install
        if (folder / "smoke.yaml").is_file():
            return folder
    return None


def recipe_names() -> list[str]:
    """Every shipped recipe's name: the top-level ones first, then each folder's, alphabetically."""
    root = recipe_root()
    if root is None:
        return []
    names = [p.relative_to(root).with_suffix("").as_posix() for p in root.rglob(f"*{SUFFIX}")]
    return sorted((n for n in names if not n.startswith(NOT_RECIPES)), key=lambda n: (n.count("/"), n))


def _normal(name: str) -> str:
    name = name.strip().replace("\\", "/")
    if name.startswith("./"):
        name = name[2:]
    if name.startswith(PREFIX):
        name = name[len(PREFIX):]
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


def find_recipe(name: str) -> Optional[Path]:
    """The shipped recipe ``name`` (``smoke``, ``strategy/unified``, ``smoke.yaml``, ``recipes/smoke.yaml``)."""
    root, normal = recipe_root(), _normal(name)
    if root is None or not normal or normal.startswith("/") or ".." in normal.split("/"):
        return None
    path = root / f"{normal}{SUFFIX}"
    return path if path.is_file() and not normal.startswith(NOT_RECIPES) else None


def shipped_folder(value: str | Path) -> str:
    """A folder a recipe names relative to the working folder (``recipes/examples/tasks``): ``value`` if it is
    a folder there, else the shipped folder of that path below the recipes, else ``value`` unchanged."""
    root, text = recipe_root(), str(value).replace("\\", "/")
    if Path(value).is_dir() or root is None or not text.startswith(PREFIX) or ".." in text.split("/"):
        return str(value)
    folder = root / text[len(PREFIX):]
    return str(folder) if folder.is_dir() else str(value)


def recipe_path(value: str | Path) -> Path:
    """``value`` if that file exists, else the shipped recipe of that name, else ``value`` unchanged."""
    if Path(value).is_file():
        return Path(value)
    return find_recipe(str(value)) or Path(value)


def recipe_file(value: str | Path, key: str) -> Path:
    """The one rule for every option that takes a recipe, a strategy preset or a study file (``--config``,
    ``convert --strategy``, ``import --strategy``, a study and the recipes it names): a file that exists, else
    the shipped recipe of that name in any of its spellings (``strategy/hg``, ``strategy/hg.yaml``,
    ``recipes/strategy/hg.yaml``), installed or in a clone. Neither: a ``UserError`` naming ``key`` and the value,
    with the closest shipped names."""
    if Path(value).is_file():
        return Path(value)
    shipped = find_recipe(str(value))
    if shipped is not None:
        return shipped
    close = close_names(str(value))
    hint = f" (did you mean {' or '.join(f'{c} ({PREFIX}{c}{SUFFIX})' for c in close)}?)" if close else ""
    raise UserError(key, str(value), "no such file, and no shipped recipe of that name",
                    f"give the path of a YAML file or a recipe's name{hint}; "
                    "`scalevec-lit recipes` lists the shipped ones")


def close_names(name: str, n: int = 2) -> list[str]:
    names = recipe_names()
    normal = _normal(name)
    close = difflib.get_close_matches(normal, names, n=n, cutoff=0.6)
    return close or difflib.get_close_matches(normal.rsplit("/", 1)[-1], names, n=n, cutoff=0.6)


def _is_inline(value: str) -> bool:
    return value.lstrip().startswith("{") or "\n" in value


def resolve_config_args(argv: list[str], sys_argv: Optional[list[str]] = None) -> list[str]:
    """``argv`` with each ``--config``/``-c`` value that names no file but a shipped recipe replaced by that
    recipe's path. A value that is neither is refused here, with the close names (a folder is left to the
    recipe checks, which name it). When ``argv`` is ``sys_argv[1:]`` (the command line, which LightningCLI
    reads itself), ``sys_argv`` is rewritten the same way."""
    out = list(argv)
    if sys_argv is not None and list(sys_argv[1:]) == list(argv):
        resolved = resolve_config_args(argv)
        sys_argv[1:] = resolved
        return resolved
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            at, value, form = i + 1, argv[i + 1], "{}"
        elif arg.startswith("--config="):
            at, value, form = i, arg.split("=", 1)[1], "--config={}"
        else:
            continue
        if _is_inline(value) or Path(value).is_file():
            continue  # a file wins over a shipped recipe of the same name
        if find_recipe(value) is None and Path(value).exists():
            continue  # a folder: the recipe checks name it
        out[at] = form.format(recipe_file(value, "--config"))
    return out


def _description(path: Path) -> str:
    """The recipe's first comment line."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def list_recipes(out=None) -> None:
    out = out or sys.stdout
    root, names = recipe_root(), recipe_names()
    print(f"shipped recipes ({root}); use one by name: fit --config smoke --config strategy/unified", file=out)
    width = max(len(n) for n in names)
    for name in names:
        text = _description(root / f"{name}{SUFFIX}")
        print(f"  {name:<{width}}  {text[:100 - width]}".rstrip(), file=out)
    print("a file path of the same name wins over a shipped recipe; "
          "`scalevec-lit recipes copy NAME DEST` writes an editable copy", file=out)


def _shipped(name: str) -> Path:
    path = find_recipe(name)
    if path is None:
        close = close_names(name)
        raise UserError("recipe", name, "no shipped recipe of that name",
                        (f"did you mean {' or '.join(close)}? " if close else "") +
                        "`scalevec-lit recipes` lists them")
    return path


def copy_recipe(name: str, dest: str | Path, overwrite: bool = False) -> Path:
    """Write an editable copy of the shipped recipe ``name`` to ``dest`` (a file, or a folder to put it in)."""
    source = _shipped(name)
    target = Path(dest)
    if target.is_dir():
        target = target / source.name
    if target.exists() and not overwrite:
        raise UserError("recipes copy", str(target), "exists and would be replaced",
                        "pass --overwrite to replace it, or give another destination")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def _parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="scalevec-lit recipes",
        description="The shipped recipes: list them (no argument), print one (show NAME), or write an editable "
                    "copy (copy NAME DEST). Any of them runs by name: fit --config smoke.")
    p.add_argument("action", nargs="?", choices=("list", "show", "copy"), default="list")
    p.add_argument("name", nargs="?", help="a recipe's name, e.g. smoke or strategy/unified")
    p.add_argument("dest", nargs="?", help="copy: the file to write, or a folder to write it into")
    p.add_argument("--overwrite", action="store_true", help="copy: replace an existing file")
    return p


def main(argv: Optional[Iterable[str]] = None) -> None:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.action == "list":
        if args.name is not None:
            raise UserError("recipes", args.name, "unexpected argument", "use `recipes show NAME` or "
                            "`recipes copy NAME DEST`")
        return list_recipes()
    if args.name is None:
        raise UserError(f"recipes {args.action}", "(none)", "needs a recipe's name", f"e.g. `scalevec-lit recipes "
                        f"{args.action} smoke{' my_smoke.yaml' if args.action == 'copy' else ''}`")
    if args.action == "show":
        if args.dest is not None:
            raise UserError("recipes show", args.dest, "unexpected argument", "give one recipe's name")
        sys.stdout.write(_shipped(args.name).read_text(encoding="utf-8"))
        return None
    if args.dest is None:
        raise UserError("recipes copy", args.name, "needs a destination",
                        f"e.g. `scalevec-lit recipes copy {args.name} my_{Path(args.name).name}.yaml`")
    target = copy_recipe(args.name, args.dest, overwrite=args.overwrite)
    print(f"wrote {target} (a copy of the shipped recipe {_normal(args.name)}); run it with: "
          f"scalevec-lit fit --config {target}")
    return None


if __name__ == "__main__":
    from .errors import run_guarded

    run_guarded(main, sys.argv[1:])
