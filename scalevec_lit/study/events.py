"""Reading a run's logged scalars (TensorBoard events, or the files of its CSV, MLflow or W&B logger), and a
run's endpoint (the mean of its last scheduled validation losses).

A run validates on a schedule (every ``val_check_interval`` steps and at the final step), and Lightning
validates once more at the step where a run stops on a signal; a resumed run keeps that extra point in its
events. The endpoint is taken from the scheduled validations only (``validation_schedule``, ``scheduled``), so
an interrupted and resumed run has the endpoint of the uninterrupted one.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .metrics_readers import read_logged

STOP_RE = re.compile(r"stopped by SIG\w+ at step (\d+)")
ACCUMULATE_RE = re.compile(r"trainer\.accumulate_grad_batches = (\d+)")


def read_scalars(folder: Path, prefixes: tuple[str, ...] = ("",)) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``folder`` whose tag starts with one of ``prefixes``: tag -> sorted (step, value),
    one value per step (the one written last, so that a resumed run's repeated steps count once); from
    TensorBoard events and from the files of the other loggers (``metrics_readers``: CSV, MLflow, W&B)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    files = sorted(Path(folder).rglob("events.out.tfevents.*"), key=lambda p: (p.stat().st_mtime, p.name))
    for events in files:
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "images": 1, "histograms": 1,
                                                           "tensors": 1})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            if any(tag.startswith(p) for p in prefixes):
                series = out.setdefault(tag, {})
                for e in acc.Scalars(tag):
                    series[int(e.step)] = float(e.value)
    for tag, series in read_logged(folder, prefixes).items():  # CSV, MLflow file store, W&B offline runs
        out.setdefault(tag, {}).update(series)
    return {tag: sorted(s.items()) for tag, s in out.items()}


def endpoint(val: list[tuple[int, float]], n: int = 2) -> Optional[dict]:
    """The mean of the last ``n`` validation losses (fewer when fewer were logged), with their steps."""
    if not val:
        return None
    last = val[-n:]
    return {"value": sum(v for _, v in last) / len(last), "steps": [s for s, _ in last], "n": len(last)}


def validation_schedule(root: Path) -> dict:
    """A run's validation schedule in logged (0-based) steps: ``interval`` (validation every that many optimizer
    steps, ``None`` when it is not a fixed number of steps), ``final`` (``trainer.max_steps``) and ``stops``
    (the logged steps of the validations made where an attempt stopped on a signal, from ``log.txt``)."""
    import yaml

    root = Path(root)
    try:
        log = (root / "log.txt").read_text(errors="replace")
    except OSError:
        log = ""
    stops = sorted({int(n) - 1 for n in STOP_RE.findall(log)})
    configs = sorted(root.rglob("config.yaml"), key=lambda p: p.stat().st_mtime)
    trainer: dict = {}
    if configs:
        try:
            trainer = (yaml.safe_load(configs[-1].read_text()) or {}).get("trainer") or {}
        except (OSError, yaml.YAMLError):
            trainer = {}
    every, by_epoch = trainer.get("val_check_interval"), trainer.get("check_val_every_n_epoch")
    accumulate = ACCUMULATE_RE.findall(log)
    accumulate = int(accumulate[-1]) if accumulate else trainer.get("accumulate_grad_batches") or 1
    interval = None
    if isinstance(every, int) and not isinstance(every, bool) and by_epoch is None and every % accumulate == 0:
        interval = every // accumulate  # the interval counts training batches: in optimizer steps
    final = trainer.get("max_steps")
    return {"interval": interval, "final": final if isinstance(final, int) and final > 0 else None, "stops": stops}


def scheduled(val: list[tuple[int, float]], schedule: dict) -> tuple[list[tuple[int, float]], list[int]]:
    """The validations on the schedule, and the logged steps of those left out (made at a stop by signal).
    With a known interval: steps s with s + 1 a multiple of it, or the final step; otherwise every validation
    but those at a stop step (a stop at the final step is the final validation)."""
    final, interval, stops = schedule.get("final"), schedule.get("interval"), set(schedule.get("stops") or [])

    def on_schedule(step: int) -> bool:
        if final is not None and step + 1 == final:
            return True
        if interval:
            return (step + 1) % interval == 0
        return step not in stops

    kept = [(s, v) for s, v in val if on_schedule(s)]
    return kept, [s for s, _ in val if not on_schedule(s)]


def collect_done(runs_dir: Path) -> dict:
    """``{Run: done.json contents}`` of every complete run under ``runs_dir`` (with or without an LR level)."""
    import json

    from .spec import DONE, Run

    found = {}
    for done_file in sorted(Path(runs_dir).rglob(DONE)):
        done = json.loads(done_file.read_text())
        lr = done.get("lr")
        found[Run(done["variant"], None if lr is None else float(lr), int(done["seed"]))] = done
    return found


def recorded_endpoints(path: Path, variant: str) -> dict[float, list[float]]:
    """``{lr: [endpoint per seed]}`` of ``variant`` in a study's ``endpoints.json`` (written by ``study report``
    beside its report); a diverged run counts as non-finite. Empty when the file is absent."""
    import json

    if not Path(path).is_file():
        return {}
    per_lr: dict[float, list[float]] = {}
    for row in json.loads(Path(path).read_text())["runs"]:
        if row["variant"] == variant and row["lr"] is not None:
            value = row["endpoint"]
            per_lr.setdefault(float(row["lr"]), []).append(float("nan") if value is None else float(value))
    return per_lr


def run_endpoint(done: dict) -> float:
    """A complete run's endpoint (older runs without one: their final validation loss)."""
    return float(done["endpoint"] if "endpoint" in done else done["final_val_loss"])
