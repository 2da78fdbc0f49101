"""The lm-eval side shared by ``evaluate`` and the ``DownstreamEval`` callback: the optional import, the task
index (names checked, close names suggested), one evaluation run, its results JSON and its flat metrics.

lm-eval is the ``eval`` extra (``pip install -e '.[eval]'``); without it ``require_lm_eval`` names that
command. Nothing here imports lm-eval at module level: a process that never evaluates never loads it.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import json
import random
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import UserError

INSTALL = "pip install -e '.[eval]' (or pip install lm-eval)"
#: the metrics a downstream table reports (lm-eval's names); others (perplexities) are logged too
ACCURACY_METRICS = ("acc", "acc_norm", "exact_match")


def require_lm_eval(key: str = "evaluate") -> None:
    """``UserError`` naming the install command when lm-eval is not installed."""
    import importlib.util

    if importlib.util.find_spec("lm_eval") is None:
        raise UserError(key, "lm-eval", "is not installed (the evaluation harness is an optional extra)",
                        f"install it: {INSTALL}")


def split_tasks(value: str | Sequence[str], key: str = "--tasks") -> list[str]:
    """``"a,b"`` or ``["a", "b"]`` → ``["a", "b"]`` (no empty names)."""
    names = [t.strip() for t in (value.split(",") if isinstance(value, str) else value) for t in str(t).split(",")]
    names = [n for n in names if n]
    if not names:
        raise UserError(key, repr(value), "names no task", "give lm-eval task names, e.g. --tasks hellaswag,arc_easy")
    return names


def task_manager(tasks: Sequence[str], include_path: Optional[str | Sequence[str]] = None,
                 key: str = "--tasks", include_key: str = "--include_path"):
    """A ``TaskManager`` that knows every name of ``tasks`` (a task, group, tag, glob or task YAML file);
    an unknown name is a ``UserError`` listing the close names. Only the ``include_path`` folders are
    indexed when they hold every task (lm-eval's own index of thousands of tasks takes seconds)."""
    from lm_eval.tasks import TaskManager

    paths = [include_path] if isinstance(include_path, (str, Path)) else list(include_path or [])
    for p in paths:
        if not Path(p).is_dir():
            raise UserError(include_key, str(p), "is not a folder", "give a folder of lm-eval task YAML files")
    wanted = [t for t in tasks if not t.endswith((".yaml", ".yml"))]
    for t in tasks:
        if t not in wanted and not Path(t).is_file():
            raise UserError(key, t, "no such task YAML file", "give a task name or the path of a task YAML file")
    manager = None
    if paths:
        manager = TaskManager(include_path=[str(p) for p in paths], include_defaults=False)
        if _unknown(manager, wanted):
            manager = None
    if manager is None:
        manager = _full_index(tuple(str(Path(p).resolve()) for p in paths))
    unknown = _unknown(manager, wanted)
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.6)
        where = f" (lm-eval's tasks{' and ' + ', '.join(map(str, paths)) if paths else ''})"
        raise UserError(key, name, f"is not a task lm-eval knows{where}" +
                        (f"; close names: {', '.join(close)}" if close else ""),
                        "check the spelling (`lm-eval ls tasks` lists them all), or pass the folder of your own "
                        f"task YAML files with {include_key}")
    return manager


@functools.lru_cache(maxsize=4)
def _full_index(paths: tuple[str, ...]):
    """lm-eval's index of its own tasks (and ``paths``), built once per process (it reads thousands of files)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths) or None)


def _unknown(manager, names: Sequence[str]) -> list[str]:
    from lm_eval import utils

    return [n for n in names if not utils.pattern_match([n], manager.all_tasks)]


@contextlib.contextmanager
def kept_random_state():
    """lm-eval seeds Python's, NumPy's and torch's generators: a run inside training leaves them as they were."""
    import numpy as np
    import torch

    state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
        try:
            yield
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])


def run_tasks(lm, tasks: Sequence[str], manager, *, limit: Optional[float] = None, num_fewshot: Optional[int] = None,
              seed: int = 1234, log_samples: bool = False, batch_size: Optional[int] = None,
              device: Optional[str] = None, bootstrap_iters: int = 100000) -> Optional[dict[str, Any]]:
    """lm-eval's ``simple_evaluate`` on ``lm``: its results dict on rank 0 (``None`` on the other ranks).

    With several processes every rank calls it (the same arguments): lm-eval runs as one process on each, and
    ``ScaleVecLM`` shares the forwards out among the ranks (``lm.py``)."""
    import logging

    from lm_eval import simple_evaluate

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    results = simple_evaluate(
        model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit, task_manager=manager,
        log_samples=log_samples, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
        fewshot_random_seed=seed, batch_size=batch_size, device=device, bootstrap_iters=bootstrap_iters,
    )
    return results if getattr(lm, "process_rank", 0) == 0 else None


def metrics(results: dict[str, Any]) -> dict[str, float]:
    """``{"<task>/<metric>": value}`` of every numeric metric (stderr left out), for TensorBoard and reports."""
    out: dict[str, float] = {}
    for task, values in (results.get("results") or {}).items():
        for name, value in values.items():
            metric, _, filt = name.partition(",")
            if metric.endswith("_stderr") or metric in ("alias", "sample_len", "sample_count") or isinstance(value, bool) \
                    or not isinstance(value, (int, float)):
                continue
            label = metric if filt in ("", "none") else f"{metric}_{filt}"
            out[f"{task}/{label}"] = float(value)
    return out


def write_results(results: dict[str, Any], out: str | Path) -> list[Path]:
    """lm-eval's results JSON (its layout, without the samples) at ``out``; with samples, one JSON Lines file
    per task beside it (``<stem>_samples_<task>.jsonl``, lm-eval's sample records). Returns the files."""
    from lm_eval.utils import handle_non_serializable

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {k: v for k, v in results.items() if k != "samples"}
    out.write_text(json.dumps(data, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n")
    files = [out]
    for task, samples in (results.get("samples") or {}).items():
        path = out.with_name(f"{out.stem}_samples_{task}.jsonl")
        path.write_text("".join(json.dumps(s, default=handle_non_serializable, ensure_ascii=False) + "\n"
                                for s in samples))
        files.append(path)
    return files


def table(results: dict[str, Any]) -> str:
    """lm-eval's Markdown table (and the groups' table when there are groups)."""
    from lm_eval.utils import make_table

    text = make_table(results)
    if results.get("groups"):
        text += "\n" + make_table(results, "groups")
    return text
