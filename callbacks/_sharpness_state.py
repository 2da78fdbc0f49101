"""SharpnessMonitor's arguments and what a resumed run keeps of its saved state (issue 32, item 6).

- ``check_arguments``: every argument checked when the callback is built, the first bad one a ``ValueError``
  ``SharpnessMonitor.<key>: <value>: <problem>; <fix>`` (the command line prints that sentence as its one line:
  ``_cli_errors.py``).
- ``monitor_key``: the key of the monitor's state in a checkpoint is its position among the trainer's
  ``SharpnessMonitor`` callbacks (``SharpnessMonitor``, ``SharpnessMonitor[1]`` …), not its arguments, so a run
  resumed with other arguments finds its state; ``legacy_state`` finds a state saved under the former key (the
  arguments ``every_n_steps`` and ``params``).
- ``resumed_state``: the saved held-out batch is kept unless ``batch_size`` changed (then a new batch is drawn
  at the next measurement); the last measured step is kept (no measurement repeated at the resumed step); every
  other argument applies from the next measurement. When the arguments changed, one line says so.

Plain Python and torch; no Lightning.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from scalevec_lit.notices import notice
from scalevec_lit.scale.sites import INPUT, OUTPUT

NAME = "SharpnessMonitor"
SUBSETS = ("all", "matrices", "scales", f"scales:{INPUT}", f"scales:{OUTPUT}")
#: the arguments saved with the state and compared on resume
CONFIG_KEYS = ("every_n_steps", "top_k", "iterations", "tol", "seed", "batch_size", "params", "precondition")


def _whole(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_arguments(every_n_steps, top_k, iterations, tol, seed, batch_size, params) -> list[str]:
    """``params`` as a list; a ``ValueError`` ``SharpnessMonitor.<key>: <value>: <problem>; <fix>`` for the first
    bad argument."""
    checks = [
        ("every_n_steps", every_n_steps, _whole(every_n_steps, 1), "must be a whole number >= 1",
         "set e.g. every_n_steps: 100"),
        ("top_k", top_k, _whole(top_k, 1), "must be a whole number >= 1", "set e.g. top_k: 1"),
        ("iterations", iterations, _whole(iterations, 1) and (not _whole(top_k, 1) or iterations >= top_k),
         f"must be a whole number >= top_k ({top_k})", f"set e.g. iterations: {max(20, top_k if _whole(top_k, 1) else 1)}"),
        ("tol", tol, isinstance(tol, (int, float)) and not isinstance(tol, bool) and tol > 0, "must be a number > 0",
         "set e.g. tol: 1.0e-3"),
        ("seed", seed, _whole(seed, 0), "must be a whole number >= 0", "set e.g. seed: 0"),
        ("batch_size", batch_size, batch_size is None or _whole(batch_size, 1), "must be a whole number >= 1 or null",
         "set e.g. batch_size: 4, or null for every row of the validation loader's first batch"),
    ]
    for key, value, ok, problem, fix in checks:
        if not ok:
            raise ValueError(f"SharpnessMonitor.{key}: {value!r}: {problem}; {fix}")
    params = [params] if isinstance(params, str) else list(params)
    for subset in params:
        if subset not in SUBSETS:
            raise ValueError(f"SharpnessMonitor.params: {subset!r}: is not a parameter subset; use some of "
                             f"{', '.join(SUBSETS)}")
    if not params or len(set(params)) != len(params):
        raise ValueError(f"SharpnessMonitor.params: {params}: names no subset or one twice; list each subset once, "
                         "at least one (e.g. params: [all])")
    return params


def monitor_key(index: Optional[int], legacy: str) -> str:
    """The checkpoint key of the ``index``-th monitor of a trainer (``legacy``: before ``setup`` tells it)."""
    if index is None:
        return legacy
    return NAME if index == 0 else f"{NAME}[{index}]"


def legacy_state(callbacks: dict, index: int) -> tuple[Optional[str], Optional[dict]]:
    """A state saved by an earlier version under ``SharpnessMonitor{'every_n_steps': …, 'params': …}``: the only
    such one, for the first monitor; else none."""
    keys = [k for k in callbacks if isinstance(k, str) and k.startswith(NAME + "{")]
    if index == 0 and len(keys) == 1:
        return keys[0], callbacks[keys[0]]
    return None, None


def _show(value: Any) -> str:
    return "null" if value is None else str(value)


def resumed_state(state: dict, now: dict) -> tuple[Optional[torch.Tensor], Optional[int], Optional[str]]:
    """The held-out batch and last measured step to keep of ``state`` under the arguments ``now``, and the one
    line to say (None when nothing changed)."""
    batch, last = state.get("batch"), state.get("last_step")
    saved = state.get("config")
    changed = {} if saved is None else {k: (saved[k], now[k]) for k in CONFIG_KEYS if k in saved and saved[k] != now[k]}
    rows = None if batch is None else int(batch.shape[0])
    if saved is None and batch is not None and now["batch_size"] is not None and rows != now["batch_size"]:
        changed["batch_size"] = (f"{rows} rows", now["batch_size"])  # a state saved without its arguments
    if not changed:
        return batch, last, None
    what = ", ".join(f"{k} {_show(a)} → {_show(b)}" for k, (a, b) in changed.items())
    step = "none yet" if last is None else f"step {last}"
    head = f"{NAME}: resumed with other arguments ({what}): keeps its last measured step ({step})"
    if batch is None:
        return None, last, head + "; it had no held-out batch yet (drawn at its next measurement)"
    if "batch_size" in changed:
        new = "all rows of the validation loader's first batch" if now["batch_size"] is None else \
            f"{now['batch_size']} rows"
        return None, last, (head + f"; drops the saved held-out batch ({rows} rows) and draws a new one ({new}) at its "
                            "next measurement, so values before and after the resume are on different batches")
    return batch, last, (head + f" and the saved held-out batch ({rows} rows); the new arguments apply from its next "
                         "measurement")


def say(line: Optional[str]) -> None:
    if line:
        notice(line, "warning")
