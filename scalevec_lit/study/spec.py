"""The study file and its grid: variants x learning rates x seeds, and the ``fit`` command of one run.

A study YAML (see ``recipes/ablation/*.yaml``) names:

- ``base``: recipe file(s) given to every run as ``--config`` (e.g. ``recipes/smoke.yaml``);
- ``args``: shared command-line overrides (steps, validation interval, batch size, ...);
- ``seeds``: one run per seed, with ``--seed_everything=<k>`` and ``--data.seed=<k>``: under one seed every
  variant gets the same initialization stream and the same data order, so variants are compared *paired*;
- ``lrs``: the learning-rate grid (each value given as ``lr_arg``, default
  ``--model.optimizer.init_args.lr``); a variant may name its own ``lrs``. Empty: the recipe's LR;
- ``lr_from``: ``{study: <name>, variant: <name>}``: take the single LR of this study from another study's
  results (the LR with the lowest mean endpoint of that variant), read from ``<out>/../../<name>/runs``;
- ``callbacks``: ``{class_path: {init_arg: value}}`` applied to the base recipe's callback list (init args
  updated where the class is listed, else the callback is appended);
- ``decay``: the default ``RoleWeightDecay`` preset (``iwd``) and ``baseline``: the reference variant;
- ``variants``: each with ``name``, ``configs`` (extra ``--config`` files), ``args``, optionally ``decay``
  and ``lrs``;
- ``endpoint_evals``: the endpoint of a run is the mean of its last ``endpoint_evals`` validation losses (2);
- ``primary``: which paired comparison decides a verdict: ``best_lr`` (each variant at its own best LR,
  the default; with one LR it is that LR) or ``pooled`` (every (LR, seed) cell of the grid);
- ``alpha``: the two-sided level of the tests (0.05);
- ``claims``: each a ``title``, optional ``reference`` (default ``baseline``), ``paper`` and ``note`` text and
  ``expect``: ``{variant: lower|higher}`` (the variant's endpoint vs the reference's);
- ``preregistration``: free text, the hypothesis and decision rule written before the runs (quoted in the
  report);
- ``secondary`` and ``power``: endpoints on other logged scalars and the pre-registered minimum detectable
  effect (``secondary.py``).

A run's folder is ``<out>/<variant>/seed<k>`` without an LR grid and ``<out>/<variant>/lr<lr>/seed<k>``
with one. Plain Python + yaml: no torch, no Lightning.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from .checks import LR_ARG, bad, validate

DONE = "done.json"
ENDPOINTS = "endpoints.json"  # beside report.md: every complete run's endpoint, kept where the runs folder is not
RWD = "scalevec_lit.callbacks.RoleWeightDecay"
CKPT_DIR = "checkpoints"
VAL_TAG = "val/loss"


@dataclass
class Variant:
    name: str
    configs: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    decay: Optional[str] = None
    lrs: Optional[list[float]] = None


@dataclass
class Study:
    name: str
    base: list[str]
    args: list[str]
    seeds: list[int]
    variants: list[Variant]
    callbacks: dict = field(default_factory=dict)
    decay: str = "iwd"
    baseline: str = "baseline"
    out: str = ""
    claims: list[dict] = field(default_factory=list)
    dynamics: list[str] = field(default_factory=list)
    keep_checkpoints: bool = False
    path: Optional[Path] = None
    lrs: list[float] = field(default_factory=list)
    lr_arg: str = LR_ARG
    lr_from: Optional[dict] = None
    endpoint_evals: int = 2
    primary: str = "best_lr"
    alpha: float = 0.05
    preregistration: str = ""
    description: str = ""
    secondary: list[dict] = field(default_factory=list)  # secondary.py: other endpoints (e.g. sharpness)
    power: Optional[dict] = None  # secondary.py: the pre-registered minimum detectable effect

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def lrs_of(self, variant: Variant) -> list[Optional[float]]:
        lrs = variant.lrs if variant.lrs is not None else self.lrs
        return list(lrs) if lrs else [None]

    def runs(self) -> list["Run"]:
        """Every run of the grid, seed-major (all variants and LRs of seed 1 first), so that a study cut
        short still holds complete paired sets for its first seeds."""
        return [Run(v.name, lr, s) for s in self.seeds for v in self.variants for lr in self.lrs_of(v)]


@dataclass(frozen=True)
class Run:
    variant: str
    lr: Optional[float]
    seed: int

    def rel(self) -> Path:
        return Path(self.variant) / (f"lr{fmt_lr(self.lr)}" if self.lr is not None else "") / f"seed{self.seed}"

    def label(self) -> str:
        return f"{self.variant}" + (f"@lr={fmt_lr(self.lr)}" if self.lr is not None else "") + f"/seed{self.seed}"


def fmt_lr(lr: float) -> str:
    return f"{lr:g}"


def load_study(path: str | Path) -> Study:
    """Read a study YAML and check all of it (``checks.py``) before anything runs; paths in it are relative to
    the current folder (the repository). A mistake is one ``UserError`` naming the file, the key and the fix.
    A shipped study runs by name (``ablation/claims_cpu``), and ``recipes/...`` in it names a shipped recipe
    where the folder has no such file (``scalevec_lit/recipe_lookup.py``)."""
    from ..recipe_lookup import recipe_path

    path = recipe_path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise bad(path, "(the file)", path, f"cannot be read ({err.strerror or err})",
                  "give the path of a study file, e.g. recipes/ablation/claim1_lr_cpu.yaml") from None
    except yaml.YAMLError as err:
        raise bad(path, "(the file)", "YAML", " ".join(str(err).split()), "correct the YAML syntax there") from None
    values = validate(raw, path)
    variants = [Variant(**v) for v in values.pop("variants")]
    return Study(**values, variants=variants, path=path)


def _base_callbacks(study: Study) -> list:
    """The callback list of the last base recipe that has one."""
    callbacks: list = []
    from ..recipe_lookup import recipe_path

    for recipe in study.base:
        trainer = (yaml.safe_load(recipe_path(recipe).read_text()) or {}).get("trainer") or {}
        if "callbacks" in trainer:
            callbacks = list(trainer["callbacks"] or [])
    return callbacks


def run_callbacks(study: Study, variant: Variant) -> list:
    """The base recipe's callbacks with the study's updates and the variant's decay preset applied."""
    callbacks = [dict(c) if isinstance(c, dict) else {"class_path": c} for c in _base_callbacks(study)]
    updates = {k: dict(v or {}) for k, v in study.callbacks.items()}
    updates.setdefault(RWD, {})["preset"] = variant.decay or study.decay
    for class_path, init_args in updates.items():
        found = [c for c in callbacks if c.get("class_path") == class_path]
        if not found:
            callbacks.append({"class_path": class_path, "init_args": dict(init_args)})
        for c in found:
            c["init_args"] = {**(c.get("init_args") or {}), **init_args}
    return callbacks


def run_dir(out: Path, variant: str, seed: int, lr: Optional[float] = None) -> Path:
    return out / Run(variant, lr, seed).rel()


def fit_command(study: Study, variant: Variant, seed: int, root: Path, lr: Optional[float] = None) -> list[str]:
    """The ``python -m scalevec_lit fit`` command of one run (its callbacks YAML is ``root/callbacks.yaml``;
    its loggers write in ``root``: ``loggers.logger_args``)."""
    from .loggers import logger_args

    cmd = [sys.executable, "-m", "scalevec_lit", "fit"]
    for c in [*study.base, *variant.configs]:
        cmd += ["--config", str(c)]
    cmd += ["--config", str(root / "callbacks.yaml"), *study.args, *variant.args]
    if lr is not None:
        cmd += [f"{study.lr_arg}={lr!r}"]
    cmd += [
        f"--seed_everything={seed}", f"--data.seed={seed}", f"--trainer.default_root_dir={root}",
        *logger_args([*study.base, *variant.configs], [*study.args, *variant.args], root,
                     Run(variant.name, lr, seed).rel().as_posix()),
    ]
    if any(p.suffix == ".ckpt" for p in (root / CKPT_DIR).glob("*.ckpt")):
        cmd += ["--ckpt_path=last"]
    return cmd
