"""Ablation studies: run a grid of (variant x seed) ``fit`` runs resumably, then report on them.

``python -m scalevec_lit study run <study.yaml> [--parallel N] [--out DIR] [--dry-run]``
``python -m scalevec_lit study report <out dir> [--study <study.yaml>]``

A study YAML (see ``recipes/ablation/claims_cpu.yaml``) names:

- ``base``: recipe file(s) given to every run as ``--config`` (e.g. ``recipes/smoke.yaml``);
- ``args``: shared command-line overrides (steps, validation interval, batch size, ...);
- ``seeds``: one run per seed and variant, with ``--seed_everything=<k>`` and ``--data.seed=<k>``;
- ``callbacks``: ``{class_path: {init_arg: value}}`` applied to the base recipe's callback list (the
  init args are updated where the class is already listed, else the callback is appended);
- ``decay``: the default ``RoleWeightDecay`` preset (``iwd``) and ``baseline``: the reference variant;
- ``variants``: each with ``name``, ``configs`` (extra ``--config`` files, e.g. a strategy preset),
  ``args`` (extra overrides) and optionally ``decay`` (a ``RoleWeightDecay`` preset);
- ``claims``: for the report, each a ``title``, optional ``reference`` (default ``baseline``) and
  ``expect``: ``{variant: lower|higher}`` (the variant's terminal validation loss vs the reference's).

Each run is ``python -m scalevec_lit fit ...`` in a subprocess, with its own root folder
``<out>/<variant>/seed<k>/`` (TensorBoard events, checkpoints, ``config.yaml`` for the callbacks,
``cmd.txt``, ``log.txt``). A run is complete when ``done.json`` exists (it holds the final validation
loss); ``run`` skips complete runs and resumes incomplete ones from their newest checkpoint
(``--ckpt_path last``) or starts them again when they have none. ``--parallel N`` runs N at once.

``report`` reads the runs' TensorBoard events and writes ``report.md`` and PNG plots into the output
folder: validation loss per variant (mean and min-max band over seeds), the terminal loss table (mean ±
std, difference to the reference, and whether the difference exceeds twice the pooled seed std) and a
plot of it, scale vector dynamics of the baseline vs the unified variant, and a verdict per claim. A
hand-written ``notes.md`` beside ``report.md`` is included as its discussion section (kept when the
report is written again).

May import yaml, numpy, tensorboard's event reader and (lazily, Agg backend) matplotlib. Must not import
torch, Lightning or the rest of ``scalevec_lit``: runs happen in subprocesses, so that a study process stays
small and a crashed run cannot take the study down.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

DONE = "done.json"
RWD = "scalevec_lit.callbacks.RoleWeightDecay"
CKPT_DIR = "checkpoints"
VAL_TAG = "val/loss"
#: the separation rule: |mean difference| must exceed this many pooled seed standard deviations
SEPARATION = 2.0


# -- the study file -------------------------------------------------------------------------------------
@dataclass
class Variant:
    name: str
    configs: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    decay: Optional[str] = None


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


def load_study(path: str | Path) -> Study:
    """Read and check a study YAML; paths in it are relative to the current folder (the repository)."""
    path = Path(path)
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise SystemExit(f"study: {path} is not a mapping")
    unknown = set(raw) - {"name", "base", "args", "seeds", "variants", "callbacks", "decay", "baseline", "out",
                          "claims", "dynamics", "keep_checkpoints", "description"}
    if unknown:
        raise SystemExit(f"study: {path}: unknown keys {sorted(unknown)}")
    variants = []
    for v in raw.get("variants") or []:
        extra = set(v) - {"name", "configs", "args", "decay"}
        if "name" not in v or extra:
            raise SystemExit(f"study: {path}: a variant needs a name and only configs/args/decay ({v})")
        variants.append(Variant(v["name"], list(v.get("configs") or []), [str(a) for a in v.get("args") or []],
                                v.get("decay")))
    names = [v.name for v in variants]
    if not variants or len(set(names)) != len(names):
        raise SystemExit(f"study: {path}: variants must be given, with distinct names ({names})")
    base = raw.get("base") or []
    base = [base] if isinstance(base, str) else list(base)
    study = Study(
        name=raw.get("name", path.stem), base=base, args=[str(a) for a in raw.get("args") or []],
        seeds=[int(s) for s in raw.get("seeds") or [1]], variants=variants, callbacks=dict(raw.get("callbacks") or {}),
        decay=raw.get("decay", "iwd"), baseline=raw.get("baseline", "baseline"),
        out=raw.get("out") or f"results/{raw.get('name', path.stem)}/runs", claims=list(raw.get("claims") or []),
        dynamics=list(raw.get("dynamics") or []), keep_checkpoints=bool(raw.get("keep_checkpoints", False)), path=path,
    )
    for c in study.claims:
        for name in list((c.get("expect") or {})) + [c.get("reference", study.baseline)]:
            if name not in names:
                raise SystemExit(f"study: {path}: claim {c.get('title')!r} names unknown variant {name!r}")
    return study


def _base_callbacks(study: Study) -> list:
    """The callback list of the last base recipe that has one."""
    callbacks: list = []
    for recipe in study.base:
        trainer = (yaml.safe_load(Path(recipe).read_text()) or {}).get("trainer") or {}
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


def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / variant / f"seed{seed}"


def fit_command(study: Study, variant: Variant, seed: int, root: Path) -> list[str]:
    """The ``python -m scalevec_lit fit`` command of one run (its callbacks YAML is ``root/callbacks.yaml``)."""
    cmd = [sys.executable, "-m", "scalevec_lit", "fit"]
    for c in [*study.base, *variant.configs]:
        cmd += ["--config", str(c)]
    cmd += ["--config", str(root / "callbacks.yaml"), *study.args, *variant.args]
    cmd += [
        f"--seed_everything={seed}", f"--data.seed={seed}", f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root}", "--trainer.logger.init_args.name=tb",
        "--trainer.logger.init_args.version=0",
    ]
    if any(p.suffix == ".ckpt" for p in (root / CKPT_DIR).glob("*.ckpt")):
        cmd += ["--ckpt_path=last"]
    return cmd


# -- TensorBoard --------------------------------------------------------------------------------------------
def read_scalars(folder: Path, prefixes: tuple[str, ...] = ("",)) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``folder`` whose tag starts with one of ``prefixes``: tag -> sorted (step, value),
    one value per step (the one written last, so that a resumed run's repeated steps count once)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    files = sorted(folder.rglob("events.out.tfevents.*"), key=lambda p: (p.stat().st_mtime, p.name))
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


# -- run ------------------------------------------------------------------------------------------------
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _start(study: Study, variant: Variant, seed: int, out: Path, env: dict) -> tuple[subprocess.Popen, Path, float]:
    root = run_dir(out, variant.name, seed)
    root.mkdir(parents=True, exist_ok=True)
    resuming = any((root / CKPT_DIR).glob("*.ckpt"))
    if not resuming:  # a fresh start: drop the events of an earlier, unfinished attempt
        shutil.rmtree(root / "tb", ignore_errors=True)
    (root / "callbacks.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": run_callbacks(study, variant)}},
                                                        sort_keys=False))
    cmd = fit_command(study, variant, seed, root)
    (root / "cmd.txt").write_text(" ".join(cmd) + "\n")
    log = open(root / "log.txt", "a")
    log.write(f"\n=== {_now()} {'resume' if resuming else 'start'}: {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    print(f"[study] {_now()} {'resume' if resuming else 'start '} {variant.name}/seed{seed}", flush=True)
    return proc, root, time.time()


def _finish(study: Study, variant: Variant, seed: int, root: Path, rc: int, t0: float) -> bool:
    if rc != 0:
        print(f"[study] FAILED {variant.name}/seed{seed} (exit {rc}); see {root / 'log.txt'}", flush=True)
        return False
    val = read_scalars(root, (VAL_TAG,)).get(VAL_TAG, [])
    if not val:
        print(f"[study] FAILED {variant.name}/seed{seed}: no {VAL_TAG} logged; see {root / 'log.txt'}", flush=True)
        return False
    step, loss = val[-1]
    done = {"variant": variant.name, "seed": seed, "final_val_loss": loss, "final_step": step,
            "wall_s_last_attempt": round(time.time() - t0, 1), "finished": _now(),
            "command": (root / "cmd.txt").read_text().strip()}
    if not study.keep_checkpoints:
        shutil.rmtree(root / CKPT_DIR, ignore_errors=True)
    (root / (DONE + ".tmp")).write_text(json.dumps(done, indent=1))
    os.replace(root / (DONE + ".tmp"), root / DONE)
    print(f"[study] {_now()} done   {variant.name}/seed{seed}: val/loss {loss:.4f} at step {step}", flush=True)
    return True


def run_study(study: Study, out: Path, parallel: int = 1, dry_run: bool = False) -> int:
    """Run every incomplete (variant, seed) of the study; returns the number of failed runs."""
    todo = [(v, s) for s in study.seeds for v in study.variants if not (run_dir(out, v.name, s) / DONE).exists()]
    total = len(study.variants) * len(study.seeds)
    print(f"[study] {study.name}: {total} runs, {total - len(todo)} complete, {len(todo)} to run "
          f"({parallel} at a time) into {out}", flush=True)
    if dry_run:
        for v, s in todo:
            print(" ".join(fit_command(study, v, s, run_dir(out, v.name, s))))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if study.path is not None:
        shutil.copyfile(study.path, out / "study.yaml")
        meta = {"study": str(study.path), "command": f"python -m scalevec_lit study run {study.path} --parallel {parallel}",
                "started": _now()}
        (out / "study_meta.json").write_text(json.dumps(meta, indent=1))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1" if parallel > 1 else env.get("OMP_NUM_THREADS", ""))
    if not env["OMP_NUM_THREADS"]:
        env.pop("OMP_NUM_THREADS")
    running: list[tuple[subprocess.Popen, Variant, int, Path, float]] = []
    failed = 0

    def _terminated(signum, frame):  # SIGTERM stops the runs too (SIGKILL: kill the process group)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminated) if threading.current_thread() is threading.main_thread() else None
    try:
        while todo or running:
            while todo and len(running) < max(1, parallel):
                v, s = todo.pop(0)
                proc, root, t0 = _start(study, v, s, out, env)
                running.append((proc, v, s, root, t0))
            time.sleep(0.5)
            for item in list(running):
                proc, v, s, root, t0 = item
                if proc.poll() is not None:
                    running.remove(item)
                    failed += not _finish(study, v, s, root, proc.returncode, t0)
    except KeyboardInterrupt:
        for proc, *_ in running:
            proc.terminate()
        for proc, *_ in running:
            proc.wait()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(f"[study] {_now()} finished: {failed} failed", flush=True)
    return failed


# -- report ---------------------------------------------------------------------------------------------
def _mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd


@dataclass
class Row:
    variant: str
    losses: dict[int, float]  # seed -> terminal val loss
    mean: float
    std: float


def compare(var: Row, ref: Row) -> dict:
    """Difference of terminal losses (variant − reference), pooled std, and the per-seed paired difference."""
    diff = var.mean - ref.mean
    pooled = math.sqrt((var.std ** 2 + ref.std ** 2) / 2) if not math.isnan(var.std + ref.std) else float("nan")
    common = sorted(set(var.losses) & set(ref.losses))
    paired = [var.losses[s] - ref.losses[s] for s in common]
    pm, psd = _mean_std(paired) if paired else (float("nan"), float("nan"))
    separable = (not math.isnan(pooled)) and abs(diff) > SEPARATION * pooled
    return {"diff": diff, "pooled_std": pooled, "separable": separable, "paired_mean": pm, "paired_std": psd,
            "paired_n": len(paired)}


def verdict(c: dict, expect: str) -> str:
    if not c["separable"]:
        return "not separable from seed noise at this scale"
    better = c["diff"] < 0 if expect == "lower" else c["diff"] > 0
    return "holds" if better else "does not hold"


def collect(out: Path, study: Optional[Study]) -> tuple[list[str], dict[str, dict[int, dict]]]:
    """variant order and ``{variant: {seed: {"done": done.json, "val": [(step, loss)], "root": Path}}}``."""
    runs: dict[str, dict[int, dict]] = {}
    for done_file in sorted(out.glob(f"*/seed*/{DONE}")):
        root = done_file.parent
        done = json.loads(done_file.read_text())
        logged = read_scalars(root, (VAL_TAG, "train/tokens"))
        tokens = [v for t, v in logged.get("train/tokens", []) if t <= done["final_step"]]
        runs.setdefault(done["variant"], {})[int(done["seed"])] = {
            "done": done, "root": root, "val": logged.get(VAL_TAG, []), "tokens": int(tokens[-1]) if tokens else None}
    order = [v.name for v in study.variants] if study else sorted(runs)
    return [v for v in order if v in runs], runs


def _plot_val(order, runs, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    cmap = plt.get_cmap("tab10")
    for i, name in enumerate(order):
        style = "-" if i < 10 else "--"
        curves = [dict(r["val"]) for r in runs[name].values()]
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        if not steps:
            continue
        vals = np.array([[c[s] for s in steps] for c in curves])
        for ax, tail in zip(axes, (False, True)):
            sel = slice(len(steps) // 2, None) if tail else slice(None)
            x = np.array(steps)[sel]
            ax.plot(x, vals.mean(0)[sel], style, color=cmap(i % 10), marker="o", markersize=3,
                    label=f"{name} (n={len(curves)})")
            ax.fill_between(x, vals.min(0)[sel], vals.max(0)[sel], color=cmap(i % 10), alpha=0.15)
    axes[0].set_title(f"{title}: validation loss (mean, min-max band over seeds)")
    axes[1].set_title("second half of training, zoomed")
    for ax in axes:
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("val/loss")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_terminal(order, rows: dict, baseline: str, path: Path) -> None:
    """Terminal validation loss per variant: every seed as a dot, mean ± std as a bar."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.5, 1.0 + 0.75 * len(order)), 4.2))
    for i, v in enumerate(order):
        r = rows[v]
        xs = [i + 0.08 * (k - (len(r.losses) - 1) / 2) for k in range(len(r.losses))]
        ax.scatter(xs, list(r.losses.values()), s=14, color="tab:blue", alpha=0.7, zorder=3)
        ax.errorbar([i + 0.3], [r.mean], yerr=[0 if math.isnan(r.std) else r.std], fmt="s", color="black",
                    markersize=4, capsize=3, zorder=4)
    if baseline in rows:
        b = rows[baseline]
        ax.axhline(b.mean, color="gray", linestyle="--", linewidth=1, label=f"{baseline} mean")
        if not math.isnan(b.std):
            ax.axhspan(b.mean - SEPARATION * b.std, b.mean + SEPARATION * b.std, color="gray", alpha=0.12,
                       label=f"{baseline} mean ± {SEPARATION:g} std")
        ax.legend(fontsize=7)
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("terminal val/loss")
    ax.set_title("terminal val loss: seeds (dots), mean ± std", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _dynamics(order, runs, names: list[str], path: Path) -> Optional[str]:
    """Plot mean γ per layer (input-role attention/MLP scales and the final norm) for the given variants."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    names = [n for n in names if n in runs]
    if not names:
        return None
    data = {}
    for n in names:
        per_seed = [read_scalars(r["root"], ("scale/",)) for r in runs[n].values()]
        tags = sorted(set.intersection(*(set(t) for t in per_seed)))
        # effective γ where it exists (magnitude-direction), else the scale part itself
        wanted = [t for t in tags if t.endswith("/gamma/mean")]
        wanted_roots = {t[: -len("/gamma/mean")] for t in wanted}
        wanted += [t for t in tags if t.endswith("/mean") and "/precond/" not in t and "/gamma/" not in t
                   and t.rsplit("/", 2)[0] not in wanted_roots and t.split("/")[-2] == "scale"]
        series = {}
        for t in wanted:
            steps = sorted(set.intersection(*(set(dict(s[t])) for s in per_seed)))
            series[t] = (steps, np.mean([[dict(s[t])[k] for k in steps] for s in per_seed], axis=0))
        data[n] = series
    groups = sorted({_site_key(t) for s in data.values() for t in s})
    if not groups:
        return None
    ncol = min(4, len(groups))
    nrow = math.ceil(len(groups) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for gi, g in enumerate(groups):
        ax = axes[gi // ncol][gi % ncol]
        for ni, n in enumerate(names):
            for t, (steps, ys) in sorted(data[n].items()):
                if _site_key(t) != g:
                    continue
                layer = t.split("/")[4]
                ax.plot(steps, ys, styles[ni % len(styles)], label=f"{n} {layer}", linewidth=1.2)
        ax.set_title(g, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for gi in range(len(groups), nrow * ncol):
        axes[gi // ncol][gi % ncol].axis("off")
    fig.suptitle("mean effective γ per layer (mean over seeds): " + " vs ".join(names), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path.name


def _site_key(tag: str) -> str:
    """``scale/<role>/<site>/<branch>/<layer>/...`` -> ``<role>/<site>/<branch>`` (layers share a panel)."""
    parts = tag.split("/")
    return "/".join(parts[1:4])


def _fmt(x: float, signed: bool = False) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def write_report(out: Path, study: Optional[Study] = None, command: Optional[str] = None) -> Path:
    """Write ``<out>/report.md`` and its plots; returns the report's path. ``out`` holds the runs (or a
    ``runs/`` folder that does); the report goes beside ``runs/`` when there is one."""
    out = Path(out)
    runs_dir = out / "runs" if (out / "runs").is_dir() else out
    dest = out
    if study is None and (runs_dir / "study.yaml").exists():
        study = load_study(runs_dir / "study.yaml")
    meta = json.loads((runs_dir / "study_meta.json").read_text()) if (runs_dir / "study_meta.json").exists() else {}
    order, runs = collect(runs_dir, study)
    if not runs:
        raise SystemExit(f"study report: no complete runs ({DONE}) under {runs_dir}")
    name = study.name if study else out.name
    baseline = study.baseline if study else "baseline"
    rows = {}
    for v in order:
        losses = {s: r["done"]["final_val_loss"] for s, r in sorted(runs[v].items())}
        m, sd = _mean_std(list(losses.values()))
        rows[v] = Row(v, losses, m, sd)
    _plot_val(order, runs, dest / "val_loss.png", name)
    _plot_terminal(order, rows, baseline, dest / "terminal_loss.png")
    dyn_names = (study.dynamics if study and study.dynamics else [baseline, "unified"])
    dyn = _dynamics(order, runs, dyn_names, dest / "scale_dynamics.png")

    steps = sorted({r["done"]["final_step"] for v in runs.values() for r in v.values()})
    walls = [r["done"].get("wall_s_last_attempt", 0.0) for v in runs.values() for r in v.values()]
    lines = [f"# Study `{name}`: report", ""]
    lines += [f"Generated {_now()} by `python -m scalevec_lit study report {out}`."]
    if study:
        run_cmd = meta.get("command") or f"python -m scalevec_lit study run {study.path}"
        lines += [f"Runs made with `{run_cmd}` (started {meta.get('started', 'n/a')}; "
                  f"base: {', '.join(f'`{b}`' for b in study.base)}; shared args: "
                  f"`{' '.join(study.args)}`; seeds {study.seeds})."]
    if command:
        lines += ["", command]
    finished = sorted(r["done"].get("finished", "") for v in runs.values() for r in v.values())
    tokens = sorted({r["tokens"] for v in runs.values() for r in v.values() if r["tokens"]})
    lines += ["", f"{sum(len(v) for v in runs.values())} complete runs, {len(order)} variants; terminal step(s) "
              f"{steps} (0-based step of the last validation); training tokens per run (last logged `train/tokens`): "
              f"{', '.join(f'{t:,}' for t in tokens) or 'n/a'}; runs finished between {finished[0]} and {finished[-1]}; "
              f"sum of run wall times {sum(walls) / 60:.1f} min.", ""]
    lines += ["## Terminal validation loss", "",
              f"Final `val/loss` per run; difference = variant − `{baseline}` (for claim 2 see the claims section, "
              f"which compares with its own reference). *Separable* = |difference| > {SEPARATION:g} × pooled seed "
              "std (sqrt of the mean of the two variances). *Paired* = mean ± std over seeds of the per-seed "
              "difference (same seed = same data order, so this removes the data-order part of the noise).", "",
              "| variant | seeds | val loss mean ± std | per seed | diff vs baseline | 2×pooled std | separable | paired diff |",
              "|---|---|---|---|---|---|---|---|"]
    for v in order:
        r = rows[v]
        per_seed = ", ".join(f"{x:.4f}" for x in r.losses.values())
        if v == baseline or baseline not in rows:
            diff = pooled = paired = "—"
            sep = "—"
        else:
            c = compare(r, rows[baseline])
            diff = _fmt(c["diff"], True)
            pooled = _fmt(SEPARATION * c["pooled_std"])
            sep = "yes" if c["separable"] else "no"
            paired = f"{_fmt(c['paired_mean'], True)} ± {_fmt(c['paired_std'])}"
        lines.append(f"| {v} | {len(r.losses)} | {r.mean:.4f} ± {_fmt(r.std)} | {per_seed} | {diff} | {pooled} | "
                     f"{sep} | {paired} |")
    lines += ["", "![terminal loss](terminal_loss.png)", "", "![validation loss](val_loss.png)", ""]
    if study and study.claims:
        lines += ["## Claims", ""]
        for claim in study.claims:
            ref = claim.get("reference", baseline)
            lines += [f"### {claim['title']}", ""]
            if claim.get("paper"):
                lines += [f"Paper: {claim['paper']}", ""]
            verdicts = []
            for var, expect in (claim.get("expect") or {}).items():
                if var not in rows or ref not in rows:
                    lines.append(f"- `{var}` vs `{ref}`: runs missing")
                    verdicts.append("missing")
                    continue
                c = compare(rows[var], rows[ref])
                vd = verdict(c, expect)
                verdicts.append(vd)
                lines.append(
                    f"- `{var}` vs `{ref}` (expected: {expect} loss): difference {_fmt(c['diff'], True)}, "
                    f"{SEPARATION:g}×pooled std {_fmt(SEPARATION * c['pooled_std'])}, paired "
                    f"{_fmt(c['paired_mean'], True)} ± {_fmt(c['paired_std'])} (n={c['paired_n']}) → **{vd}**")
            lines += ["", f"**Verdict: {_overall(verdicts)}.**", ""]
            if claim.get("note"):
                lines += [claim["note"].strip(), ""]
    if dyn:
        lines += ["## Scale-vector dynamics", "",
                  f"Mean effective γ per layer and site (from `ScaleVectorMonitor`'s `scale/<role>/<site>/<branch>/"
                  f"<layer>/<part>/mean` and `.../gamma/mean` tags; mean over seeds) for {', '.join(dyn_names)}.", "",
                  f"![scale dynamics]({dyn})", ""]
    notes = dest / "notes.md"
    if notes.exists():  # hand-written discussion, kept across regenerations
        lines += ["## Discussion", "", notes.read_text().strip(), ""]
    path = dest / "report.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"[study] wrote {path}")
    return path


def _overall(verdicts: list[str]) -> str:
    if not verdicts or "missing" in verdicts:
        return "incomplete (runs missing)"
    kinds = set(verdicts)
    if len(kinds) == 1:
        return verdicts[0]
    return "mixed: " + "; ".join(f"{verdicts.count(k)} of {len(verdicts)} {k}" for k in sorted(kinds))


# -- command line ---------------------------------------------------------------------------------------
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalevec_lit study", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="run the study's incomplete runs (resumable)")
    p_run.add_argument("study")
    p_run.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    p_run.add_argument("--out", default=None, help="runs folder (default: the study's `out`)")
    p_run.add_argument("--dry-run", action="store_true", help="print the commands of the runs to do")
    p_run.add_argument("--report", action="store_true", help="write the report when all runs are done")
    p_rep = sub.add_parser("report", help="write report.md and plots from complete runs")
    p_rep.add_argument("dir", help="the study's output folder (holding runs/) or the runs folder")
    p_rep.add_argument("--study", default=None, help="the study YAML (default: the copy saved in the runs folder)")
    args = parser.parse_args(argv)
    if args.cmd == "run":
        study = load_study(args.study)
        out = Path(args.out or study.out)
        failed = run_study(study, out, args.parallel, args.dry_run)
        if args.report and not failed and not args.dry_run:
            write_report(out.parent if out.name == "runs" else out, study)
        return 1 if failed else 0
    study = load_study(args.study) if args.study else None
    write_report(Path(args.dir), study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
