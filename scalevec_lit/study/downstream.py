"""Downstream accuracies beside the losses in a study's report.

Runs whose recipe has the ``DownstreamEval`` callback (``scalevec_lit.callbacks.DownstreamEval``) log
``downstream/<task>/<metric>`` at its steps. The report's section ``Downstream tasks`` gives, for each
variant at its best LR, the validation-loss endpoint and each downstream metric at the last step it was
logged: the mean and standard deviation over the seeds (runs that logged it), and the step. A study whose
runs logged no downstream metric has no such section.

Plain Python (no torch), like the rest of ``study/``.
"""
from __future__ import annotations

from typing import Callable, Optional

from . import stats
from .events import read_scalars, run_endpoint

PREFIX = "downstream/"


def last_values(root) -> dict[str, tuple[int, float]]:
    """``{"<task>/<metric>": (step, value)}``: the last logged value of every downstream tag of a run."""
    return {tag[len(PREFIX):]: series[-1] for tag, series in read_scalars(root, (PREFIX,)).items() if series}


def report_section(runs: dict, order: list[str], best_key: Callable[[str], Optional[float]]) -> list[str]:
    """Markdown lines of the section (none when no run logged a downstream metric)."""
    per_run = {run: last_values(done["root"]) for run, done in runs.items()
               if not done.get("diverged") and done.get("root") is not None}
    tags = sorted({tag for values in per_run.values() for tag in values})
    if not tags:
        return []
    L = ["## Downstream tasks", "",
         "Each variant at its best LR: the validation-loss endpoint and the downstream metrics (`DownstreamEval`, "
         "lm-eval) at the last step they were logged, mean ± std over seeds (n seeds).", "",
         "| variant | LR | val loss | " + " | ".join(tags) + " |", "|---" * (3 + len(tags)) + "|"]
    for variant in order:
        lr = best_key(variant)
        chosen = [(run, runs[run]) for run in per_run if run.variant == variant and run.lr == lr]
        if not chosen:
            continue
        loss = _cell([run_endpoint(done) for _, done in chosen])
        cells = []
        for tag in tags:
            got = [per_run[run][tag] for run, _ in chosen if tag in per_run[run]]
            steps = sorted({step for step, _ in got})
            cells.append(_cell([v for _, v in got]) + (f" @ {'/'.join(map(str, steps))}" if got else ""))
        L.append(f"| {variant} | {'n/a' if lr is None else f'{lr:g}'} | {loss} | " + " | ".join(cells) + " |")
    return L + [""]


def _cell(values: list[float]) -> str:
    if not values:
        return "n/a"
    mean, std = stats.mean_std(values)
    return f"{mean:.4f}" + (f" ± {std:.4f}" if len(values) > 1 else "") + f" ({len(values)})"
