"""Reading a run's TensorBoard events, and a run's endpoint (the mean of its last validation losses)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional


def read_scalars(folder: Path, prefixes: tuple[str, ...] = ("",)) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``folder`` whose tag starts with one of ``prefixes``: tag -> sorted (step, value),
    one value per step (the one written last, so that a resumed run's repeated steps count once)."""
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
    return {tag: sorted(s.items()) for tag, s in out.items()}


def endpoint(val: list[tuple[int, float]], n: int = 2) -> Optional[dict]:
    """The mean of the last ``n`` validation losses (fewer when fewer were logged), with their steps."""
    if not val:
        return None
    last = val[-n:]
    return {"value": sum(v for _, v in last) / len(last), "steps": [s for s, _ in last], "n": len(last)}


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


def run_endpoint(done: dict) -> float:
    """A complete run's endpoint (older runs without one: their final validation loss)."""
    return float(done["endpoint"] if "endpoint" in done else done["final_val_loss"])
