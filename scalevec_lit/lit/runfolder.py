"""One folder per run: where ``fit``/``validate``/``test`` write when the recipe names no folder.

A run whose ``trainer.default_root_dir`` is not set (the shipped recipes set none) writes everything into
one folder of its own, ``<save_dir>/<recipe>[/<config>...]/version_N``:

- ``<save_dir>`` is the TensorBoard (or CSV) logger's ``save_dir`` (``runs`` in the recipes, and without a
  logger); ``<recipe>`` the logger's ``name`` (the recipes name it after themselves), else the first
  ``--config`` file's name without ``.yaml``; each further ``--config`` file adds its name as a subfolder
  (``runs/smoke``, ``runs/smoke/unified``);
- ``version_N`` is the next free number (claimed with ``mkdir``, so that two runs started together get two
  folders), and holds the logger's files (TensorBoard events, or ``metrics.csv``), ``config.yaml`` and
  ``checkpoints/`` of that run (the run's first line names them: ``run folder: ... (metrics.csv, config.yaml
  and checkpoints/; ...)``);
- ``--ckpt_path last`` picks the newest ``version_N`` of that recipe holding a checkpoint and writes on
  there (the same command plus ``--ckpt_path last`` resumes the run it started); with nothing to resume it
  starts a new version, as Lightning does;
- ranks started together by torchrun or srun (``WORLD_SIZE`` or ``SLURM_NTASKS`` above 1) cannot agree on
  a new number before they can talk, so they share the stable folder ``<save_dir>/<recipe>[/<config>...]``
  (checkpoints in its ``checkpoints/``, one run at a time, ``--ckpt_path last`` resumes it); the processes
  Lightning itself starts for ``trainer.devices > 1`` reuse the folder of the process that started them
  (``SCALEVEC_RUN_DIR``).

A recipe or command line that sets ``trainer.default_root_dir`` keeps full control: the checkpoints go to
``<default_root_dir>/checkpoints`` and the logger writes where it is told, as Lightning does.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

from ..errors import is_rank_zero
from ..runlock import checkpoints_in

RUNS = "runs"
ENV = "SCALEVEC_RUN_DIR"  # "<pid of the process that chose it>:<folder>", read by the processes it starts
FILE_LOGGERS = {"TensorBoardLogger": "TensorBoard events", "CSVLogger": "metrics.csv"}  # whose folder follows the run's
LIGHTNING_NAME = "lightning_logs"  # the loggers' default name: not a name the recipe chose
_VERSION = re.compile(r"^version_(\d+)$")


def _get(ns: Any, key: str, default: Any = None) -> Any:
    try:
        value = ns.get(key, default) if hasattr(ns, "get") else getattr(ns, key, default)
    except (AttributeError, KeyError):
        return default
    return default if value is None else value


def _file_logger(trainer: Any) -> Optional[Any]:
    """The logger entry (``class_path`` + ``init_args``) whose folder follows the run's, if there is one."""
    logger = _get(trainer, "logger")
    for entry in logger if isinstance(logger, list) else [logger]:
        class_path = str(_get(entry, "class_path", ""))
        if class_path.rsplit(".", 1)[-1] in FILE_LOGGERS and _get(entry, "init_args") is not None:
            return entry
    return None


def _logged_here(trainer: Any) -> Optional[str]:
    """What the run's loggers write into its folder: the file logger's files, those of Lightning's default
    logger (``trainer.logger`` unset or true: in ``lightning_logs/``), or nothing (no logger, or loggers that
    write elsewhere: W&B, MLflow)."""
    entry = _file_logger(trainer)
    if entry is not None:
        return FILE_LOGGERS[str(_get(entry, "class_path")).rsplit(".", 1)[-1]]
    logger = _get(trainer, "logger", True)
    if logger is not True:
        return None
    from importlib.util import find_spec

    default = "TensorBoard events" if find_spec("tensorboard") or find_spec("tensorboardX") else "metrics.csv"
    return f"{default} in {LIGHTNING_NAME}/"


def family(config: Any) -> Path:
    """``<save_dir>/<recipe>[/<config>...]``: the folder holding the versions of this recipe's runs."""
    logger = _file_logger(config["trainer"])
    args = _get(logger, "init_args") if logger is not None else None
    save_dir = Path(str(_get(args, "save_dir", RUNS))) if args is not None else Path(RUNS)
    name = _get(args, "name") if args is not None else None
    stems = [Path(str(p)).name.rsplit(".", 1)[0] for p in (_get(config, "config") or [])] or ["run"]
    if name and name != LIGHTNING_NAME:
        stems[0] = str(name)  # the recipe's logger name stands for the recipe
    return save_dir.joinpath(*stems)


def versions(folder: Path) -> list[tuple[int, Path]]:
    """The ``version_N`` folders of ``folder``, by number."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _VERSION.match(p.name))]
    return sorted(found)


def newest_resumable(folder: Path) -> Optional[tuple[int, Path]]:
    """The newest ``version_N`` of ``folder`` holding a checkpoint to resume from."""
    for number, path in reversed(versions(folder)):
        if checkpoints_in(path / "checkpoints"):
            return number, path
    return None


_claimed: list[Path] = []  # folders this process created for its run, deepest first (see release_unused)


def claim_new_version(folder: Path) -> tuple[int, Path]:
    """Create and return the next free ``version_N`` of ``folder`` (atomic: a run started at the same time
    gets the number after)."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    number = versions(folder)[-1][0] + 1 if versions(folder) else 0
    while True:
        path = folder / f"version_{number}"
        try:
            path.mkdir()
        except FileExistsError:
            number += 1
            continue
        _claimed[:] = [path, *missing]
        return number, path


def release_unused() -> None:
    """Remove the folders ``claim_new_version`` created when the run wrote nothing into them (a command
    refused after the folder was chosen leaves no trace)."""
    for path in _claimed:
        try:
            path.rmdir()  # only when empty
        except OSError:
            break
    _claimed.clear()


def _inherited() -> Optional[Path]:
    """The folder chosen by the process that started this one (Lightning's launcher for devices > 1)."""
    value = os.environ.get(ENV, "")
    pid, _, folder = value.partition(":")
    if folder and "LOCAL_RANK" in os.environ and pid == str(os.getppid()):
        return Path(folder)
    return None


def _launched_together() -> bool:
    """Several ranks started at once by an outside launcher (torchrun, srun)."""
    for key in ("WORLD_SIZE", "SLURM_NTASKS"):
        try:
            if int(os.environ.get(key, "1")) > 1:
                return True
        except ValueError:
            continue
    return False


def resolve_run_folder(config: Any, subcommand: str) -> Optional[Path]:
    """Set ``trainer.default_root_dir`` (and the file logger's ``save_dir``/``name``/``version``) to this run's
    own folder when the recipe sets no ``default_root_dir``; returns the folder (``None``: the recipe's)."""
    trainer = config["trainer"]
    if _get(trainer, "default_root_dir") is not None:
        return None
    logger = _file_logger(trainer)
    args = _get(logger, "init_args") if logger is not None else None
    inherited = _inherited()
    home = family(config)
    if inherited is not None:
        folder, version = inherited, inherited.name
    elif _launched_together():
        folder, version = home, None  # the stable folder; the logger numbers its own versions inside it
    else:
        explicit = _get(args, "version") if args is not None else None
        if explicit is not None:
            version = explicit if isinstance(explicit, str) else f"version_{explicit}"
            folder = home / version
        elif str(_get(config, "ckpt_path", "")) == "last" and newest_resumable(home) is not None:
            folder = newest_resumable(home)[1]
        else:
            folder = claim_new_version(home)[1]
        version = folder.name
        os.environ[ENV] = f"{os.getpid()}:{folder}"
    trainer["default_root_dir"] = str(folder)
    if inherited is None and is_rank_zero():
        resumed = str(_get(config, "ckpt_path", "")) == "last" and checkpoints_in(folder / "checkpoints")
        files = ", ".join(filter(None, [_logged_here(trainer), "config.yaml"])) + " and checkpoints/"
        what = "resuming its newest checkpoint" if resumed else (
            files + ("; resume it with the same command and --ckpt_path last" if subcommand == "fit" else ""))
        print(f"run folder: {folder} ({what})", flush=True)
    csv = args is not None and str(_get(logger, "class_path", "")).endswith("CSVLogger")
    if csv and not (folder / "metrics.csv").exists():  # "previous log files ... will be deleted": none are
        from ..known_warnings import filter_csv_log_dir

        filter_csv_log_dir(str(folder))
    if args is not None:
        args["save_dir"], args["name"] = str(home.parent), home.name
        if version is not None:
            match = _VERSION.match(version)
            args["version"] = int(match.group(1)) if match else version
    return folder
