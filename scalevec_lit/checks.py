"""Checks of a command line and its recipe before anything is built, each failing as one ``UserError``.

- ``check_command``: the subcommand exists (with the closest one suggested).
- ``check_config_files``: every ``--config`` file exists, has no tab in its indentation and parses as YAML
  (the file, line and column are named).
- ``check_config``: values the model, the data and Lightning would otherwise reject with a traceback or
  accept silently: ``trainer.max_steps`` (also not set at all: a recipe overlay given without its base
  recipe; a run without a checkpoint callback gets a one-line warning), a GPU accelerator on a machine without one, the learning rate
  (negative refused, 0 warned), ``model.config.seq_len``, ``data.batch_size``, ``data.data_dir``; a
  callback given twice (the recipe's and ``--trainer.callbacks+=...``) keeps the later one, with a note.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable

from .errors import UserError, notice

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
CPU_FLAGS = "--trainer.accelerator=cpu --trainer.devices=1 --trainer.num_nodes=1 --trainer.strategy=auto " \
            "--model.compile=false"


def check_command(argv: list[str], extra: Iterable[str]) -> None:
    known = [*LIGHTNING_COMMANDS, *extra]
    if not argv:
        raise UserError("command", "(none)", "no command given", f"use one of {', '.join(known)} (e.g. "
                        "`python -m scalevec_lit fit --config recipes/smoke.yaml`)")
    first = argv[0]
    if first.startswith("-") or first in known:
        return
    close = difflib.get_close_matches(first, known, n=1, cutoff=0.5)
    raise UserError("command", first, "unknown command",
                    (f"did you mean '{close[0]}'? " if close else "") + f"the commands are {', '.join(known)}")


def _config_paths(argv: list[str]) -> list[str]:
    paths = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


def check_config_files(argv: list[str]) -> None:
    """Every ``--config`` file exists and is valid YAML without tabs in its indentation."""
    import yaml

    for name in _config_paths(argv):
        path = Path(name)
        if name.lstrip().startswith("{") or "\n" in name:  # an inline YAML/JSON string
            continue
        if not path.is_file():
            recipes = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
            close = difflib.get_close_matches(path.name, recipes, n=2, cutoff=0.6)
            what = "is a folder" if path.is_dir() else "no such file"
            raise UserError("--config", name, what, "give the path of a YAML recipe" + (
                f" (did you mean recipes/{' or recipes/'.join(close)}?)" if close else
                " (the shipped ones are in recipes/, e.g. recipes/smoke.yaml)"))
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            indent = line[: len(line) - len(line.lstrip(" \t"))]
            if "\t" in indent:
                raise UserError(f"{name}:{lineno}", repr(line.strip()[:40]), "indented with a tab (YAML allows "
                                "only spaces)", "replace the tabs by spaces")
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise UserError(where, "(YAML)", f"not valid YAML ({problem})", "fix the file at that line") from None


def config_value(ns: Any, dotted: str, default: Any = None) -> Any:
    """``ns["a"]["b"]`` for ``"a.b"`` in a parsed config (jsonargparse Namespace or dicts), ``default`` if absent."""
    for part in dotted.split("."):
        if ns is None:
            return default
        ns = ns.get(part) if hasattr(ns, "get") else getattr(ns, part, None)
    return default if ns is None else ns


_get = config_value


def _number(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def check_config(cfg: Any, subcommand: str) -> None:
    """Checks on the parsed config of ``subcommand`` (a jsonargparse Namespace), before instantiation."""
    steps = _number(_get(cfg, "trainer.max_steps"))
    if subcommand == "fit" and steps is not None and (steps == 0 or steps < -1):
        raise UserError("trainer.max_steps", steps, "a run needs at least one optimizer step" if steps == 0 else
                        "must be a positive number of optimizer steps", "set it to 1 or more, e.g. "
                        "--trainer.max_steps=100")
    _check_accelerator(cfg)
    seq_len = _number(_get(cfg, "model.config.seq_len"))
    if seq_len is not None and seq_len < 1:
        raise UserError("model.config.seq_len", seq_len, "must be at least 1 token per training example",
                        "set a positive length, e.g. --model.config.seq_len=128")
    for key in ("data.batch_size", "data.num_workers"):
        value = _number(_get(cfg, key))
        low = 1 if key == "data.batch_size" else 0
        if value is not None and value < low:
            raise UserError(key, value, f"must be at least {low}", f"set e.g. --{key}={max(low, 1)}")
    if subcommand == "fit":
        _check_run_length(cfg)
        _check_learning_rate(cfg)
    _dedupe_callbacks(cfg)
    _check_local_folders(cfg)
    _check_log_folders(cfg)
    if subcommand == "fit":
        _check_checkpointing(cfg)


def _recipes(cfg: Any) -> list[str]:
    return [str(getattr(c, "relative", c)) for c in (_get(cfg, "config") or []) if c is not None]


def _check_run_length(cfg: Any) -> None:
    """A fit without ``trainer.max_steps`` (nor ``max_epochs``) would run Lightning's 1000 passes over the data:
    most often a strategy or optimizer recipe given without the base recipe it overlays."""
    steps, epochs = _get(cfg, "trainer.max_steps"), _get(cfg, "trainer.max_epochs")
    if steps not in (None, -1) or epochs not in (None, -1):
        return
    given = _recipes(cfg)
    names = ", ".join(given) if given else "none"
    raise UserError("trainer.max_steps", "(not set)", f"no run length: the recipes given ({names}) set neither "
                    "trainer.max_steps nor trainer.max_epochs, so Lightning would run 1000 passes over the data "
                    "(strategy and optimizer recipes are overlays, without a trainer section)",
                    "start from a base recipe and put the overlay after it, e.g. --config recipes/smoke.yaml "
                    f"--config {given[-1] if given else 'recipes/strategy/unified.yaml'}, or set --trainer.max_steps=N")


def _check_checkpointing(cfg: Any) -> None:
    """One line when a run will write no checkpoint before it ends (no checkpoint callback in the recipe)."""
    if _get(cfg, "trainer.enable_checkpointing") is False:
        return
    callbacks = _get(cfg, "trainer.callbacks") or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    if any("Checkpoint" in str(_get(cb, "class_path", "")) for cb in callbacks):
        return
    notice("trainer.callbacks: no checkpoint callback: this run saves only Lightning's default checkpoint at the end "
           "of each pass over the data, and a stop signal saves nothing; add "
           "--trainer.callbacks+=scalevec_lit.callbacks.SafeModelCheckpoint "
           "--trainer.callbacks.every_n_train_steps=1000 (or start from a base recipe, which has one)", kind="warning")


def _check_local_folders(cfg: Any) -> None:
    """Checkpoints, the run's lock and its logs go to a file system: a URL there (``s3://...``) would be taken for
    the local folder ``s3:/...`` by the lock and ``--ckpt_path last``, and stop at the first save with an
    ImportError (Lightning's fsspec has no s3fs here); data may stay in a bucket (``data.data_dir``)."""
    fix = ("give a folder on a file system every node can write (a shared disk on a cluster), and copy the "
           "checkpoints to the bucket from there; the data can stay in the bucket (--data.data_dir s3://...)")
    why = "a URL: checkpoints, the run's lock and its logs are written to a file system folder, not to a bucket"
    folders = [("trainer.default_root_dir", _get(cfg, "trainer.default_root_dir"))]
    for section, label in (("trainer.callbacks", "dirpath"), ("trainer.logger", "save_dir")):
        items = _get(cfg, section) or []
        for item in items if isinstance(items, list) else [items]:
            name = str(_get(item, "class_path", "")).rsplit(".", 1)[-1]
            folders.append((f"{section}: {name}.{label}", _get(item, f"init_args.{label}")))
    for key, value in folders:
        if value is not None and "://" in str(value) and not (key.endswith("save_dir") and _opens(str(value))):
            raise UserError(key, value, why, fix)


def _unwritable(value: Any) -> Any:
    """Why this process cannot create or write the local folder ``value`` (``None``: it can, or a URL); nothing
    is created: the nearest existing folder on its path must be a writable folder."""
    import os

    if value is None or "://" in str(value):
        return None
    path = Path(os.path.abspath(str(value)))
    there = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
    if not there.is_dir():
        return f"Not a directory: {there}"
    if not os.access(there, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(there).f_flag & os.ST_RDONLY)
        return f"{'Read-only file system' if read_only else 'Permission denied'}: {there}"
    return None


def _check_log_folders(cfg: Any) -> None:
    """A logger's local ``save_dir`` that this process cannot create or write is refused at the start, in the line
    ``trainer.default_root_dir`` gets (``runlock.acquire_folder``), not as a bare ``[Errno 30]`` at the first log.
    The same fault on the run's folder is left to that line (one line per fault)."""
    items = _get(cfg, "trainer.logger")
    many = isinstance(items, list)
    run_fault = _unwritable(_get(cfg, "trainer.default_root_dir"))
    for item in items if many else [items]:
        value = _get(item, "init_args.save_dir") if item not in (None, True, False) else None
        why = _unwritable(value)
        if why is None or why == run_fault:
            continue
        name = str(_get(item, "class_path", "")).rsplit(".", 1)[-1]
        key = f"trainer.logger: {name}.save_dir" if many else "trainer.logger.init_args.save_dir"
        raise UserError(key, value, f"cannot create the log folder ({why})",
                        f"set {key} to a folder this process can create and write")


def _opens(url: str) -> bool:
    """Whether fsspec (through which Lightning's loggers write) has a file system for ``url``'s scheme here."""
    try:
        import fsspec

        fsspec.get_filesystem_class(url.split("://", 1)[0])
        return True
    except (ImportError, ValueError):
        return False


def _check_accelerator(cfg: Any) -> None:
    accelerator = str(_get(cfg, "trainer.accelerator", "auto")).lower()
    if accelerator not in ("gpu", "cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise UserError("trainer.accelerator", accelerator, "this recipe needs a CUDA GPU and this machine has "
                        f"none (torch {torch.__version__})", "to run on the CPU, add " + CPU_FLAGS + " (a large "
                        "model is very slow there: try `python -m scalevec_lit fit --config recipes/smoke.yaml` "
                        "first)")


def _check_learning_rate(cfg: Any) -> None:
    init = _get(cfg, "model.optimizer.init_args")
    if init is None:
        return
    for name in ("lr", "muon_lr"):
        lr = _number(_get(init, name))
        key = f"model.optimizer.init_args.{name}"
        if lr is None:
            continue
        if lr < 0:
            raise UserError(key, lr, "a negative learning rate climbs the loss", f"set a positive value, e.g. "
                            f"--{key}=0.0003")
        if lr == 0:
            notice(f"{key}: 0: the weights will not change during this run (the schedule multiplies the base "
                   "learning rate); set a positive value to train", kind="warning")


def _dedupe_callbacks(cfg: Any) -> None:
    """Keep one callback per class (the later one's options win), except checkpoint callbacks and downstream
    evaluators that differ (several of each, configured differently, are a legitimate set: e.g. one
    ``DownstreamEval`` every 100 steps with a small limit, one every 1000 with the whole tasks)."""
    trainer = _get(cfg, "trainer")
    callbacks = _get(trainer, "callbacks")
    if not isinstance(callbacks, list) or len(callbacks) < 2:
        return
    kept: list[Any] = []
    for cb in callbacks:
        path = _get(cb, "class_path")
        same = [k for k in kept if path is not None and _get(k, "class_path") == path]
        if same and any(k in str(path) for k in ("Checkpoint", "DownstreamEval")) \
                and _get(same[0], "init_args") != _get(cb, "init_args"):
            same = []  # two differently configured checkpoint callbacks or evaluators are a legitimate pair
        for old in same:
            kept.remove(old)
            notice(f"trainer.callbacks: {path} is given twice (the recipe's and the command line's); using "
                   "one, with the options of the later one")
        kept.append(cb)
    if len(kept) != len(callbacks):
        setattr(trainer, "callbacks", kept)
