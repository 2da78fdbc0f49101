"""Where a study run's loggers write: inside the run's folder, whichever Lightning logger the recipes name.

``logger_args`` gives the ``fit`` arguments that place them: TensorBoard and CSV under ``<run>/tb/version_0``
(``save_dir``, ``name=tb``, ``version=0``), W&B under ``<run>/tb/wandb`` (run name: the run's path in the
study), MLflow in a file store ``<run>/tb/mlruns`` (the runner lets MLflow use a file store); a list of loggers
is given again whole, each placed so. A fresh start of a run removes ``<run>/tb``, so an earlier attempt's
files cannot mix into its results; ``events.read_scalars`` reads them all.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import yaml

__all__ = ["logger_args", "logger_spec"]

LOGS = "tb"  # the run's log folder (TensorBoard's and CSV's logger name; W&B and MLflow write inside it)


def logger_spec(configs: list[str], args: list[str]) -> Any:
    """``trainer.logger`` as the run's configs and command-line arguments give it (the last one that sets it):
    a class path, a ``{class_path, init_args}`` dict, a list of them, or ``None``."""
    from ..recipe_lookup import recipe_path

    spec: Any = None
    for config in configs:
        try:
            trainer = (yaml.safe_load(recipe_path(config).read_text()) or {}).get("trainer") or {}
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(trainer, dict) and "logger" in trainer:
            spec = trainer["logger"]
    for arg in args:
        if arg.startswith("--trainer.logger="):
            spec = yaml.safe_load(arg.split("=", 1)[1])
        elif arg.startswith("--trainer.logger.class_path="):
            spec = {"class_path": arg.split("=", 1)[1]}
    return spec


def _class(spec: Any) -> str:
    return spec if isinstance(spec, str) else str((spec or {}).get("class_path", "")) if isinstance(spec, dict) else ""


def _placed(kind: str, root: Path, name: str) -> dict:
    """The init arguments that put one logger's files in ``root``."""
    logs = root / LOGS
    if kind.endswith("MLFlowLogger"):
        return {"tracking_uri": (logs / "mlruns").resolve().as_uri(), "run_name": name}
    if kind.endswith("WandbLogger"):
        return {"save_dir": str(logs), "name": name}
    return {"save_dir": str(root), "name": LOGS, "version": 0}


def logger_args(configs: list[str], args: list[str], root: Path, name: Optional[str] = None) -> list[str]:
    """The ``fit`` arguments that place the run's logger(s) in ``root`` (see the module docstring)."""
    spec = logger_spec(configs, args)
    name = name or root.name
    if isinstance(spec, list):
        placed = []
        for item in spec:
            item = {"class_path": item} if isinstance(item, str) else dict(item)
            item["init_args"] = {**(item.get("init_args") or {}), **_placed(_class(item), root, name)}
            placed.append(item)
        return [f"--trainer.logger={json.dumps(placed)}"]
    return [f"--trainer.logger.init_args.{k}={v}" for k, v in _placed(_class(spec), root, name).items()]
