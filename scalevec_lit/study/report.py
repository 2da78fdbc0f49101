"""``report.md`` of a study: provenance, the pre-registration, endpoints per variant and LR, paired
comparisons (primary), the unpaired view (secondary), the smallest detectable effects, and figures.

Definitions used throughout:

- *endpoint* of a run: the mean of its last ``endpoint_evals`` validation losses (``done.json``);
- *paired difference*: endpoint(variant) − endpoint(reference) under the same seed (same initialization
  stream and data order), at the same LR (*same-LR gap*), each at its own best LR (*own-best gap*), or over
  every (LR, seed) cell that both have (*pooled*);
- *best LR* of a variant: the grid LR with the lowest mean endpoint over seeds, no seed diverged; chosen on
  the same runs it is then compared on, so own-best gaps are optimistic for both sides;
- *primary* rule: ``primary: pooled`` decides by the exact sign test over the pooled cells, ``best_lr``
  (default) by the paired t-test on the own-best gap (the single LR when there is one); level ``alpha``;
- *secondary*: |difference of means| > 2 × pooled seed std (the unpaired rule of earlier reports).

One file per section: ``provenance`` (the regime, how it was run, the pre-registration), ``grid`` (the
endpoints table, and the comparisons), ``claims`` (verdicts and claims), ``secondary`` and ``downstream``
(their sections); the figures are drawn here, by ``figures``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..errors import UserError
from .claims import _ci_name, claims_section
from .downstream import report_section as downstream_section
from .events import endpoint, read_scalars, run_endpoint, scheduled, validation_schedule
from .figures import plot_dynamics, plot_lr_sweep, plot_paired, plot_sharpness, plot_val
from .grid import Grid, _lr, endpoints_section
from .provenance import provenance_section
from .secondary import report_section as secondary_section
from .spec import DONE, ENDPOINTS, VAL_TAG, Run, Study, load_study


def load_runs(runs_dir: Path, endpoint_evals: Optional[int] = None) -> dict[Run, dict]:
    """``{Run: done.json + {"root": folder}}`` of the complete runs under ``runs_dir``. With ``endpoint_evals``,
    a run recorded before endpoints were taken at the scheduled validations only gets its endpoint again from
    them (``events.scheduled``) when its curve holds a validation made at a stop by signal."""
    found = {}
    for done_file in sorted(Path(runs_dir).rglob(DONE)):
        done = json.loads(done_file.read_text())
        lr = done.get("lr")
        done["root"] = done_file.parent
        if "val" not in done:  # runs made before done.json held the curve
            done["val"] = read_scalars(done_file.parent, (VAL_TAG,)).get(VAL_TAG, [])
        if endpoint_evals and "unscheduled_val_steps" not in done and not done.get("diverged") and done["val"]:
            kept, off = scheduled([tuple(x) for x in done["val"]], validation_schedule(done_file.parent))
            if off and kept:
                end = endpoint(kept, endpoint_evals)
                done.update(endpoint=end["value"], endpoint_steps=end["steps"], unscheduled_val_steps=off,
                            endpoint_recomputed=True)
        found[Run(done["variant"], None if lr is None else float(lr), int(done["seed"]))] = done
    return found


def write_report(out: Path, study: Optional[Study] = None, command: Optional[str] = None) -> Path:
    """Write ``<out>/report.md`` and its figures; ``out`` holds the runs or a ``runs/`` folder that does (the
    report goes beside ``runs/``). A hand-written ``notes.md`` there is included as the discussion."""
    out = Path(out)
    runs_dir = out / "runs" if (out / "runs").is_dir() else out
    if study is None and (runs_dir / "study.yaml").exists():
        study = load_study(runs_dir / "study.yaml")
    runs = load_runs(runs_dir, study.endpoint_evals if study is not None else 2)
    if not runs:
        raise UserError(f"study report: {runs_dir}", "", f"no complete runs ({DONE}) there",
                        "give the study's output folder (holding runs/), or run the study first")
    if study is None:
        names = sorted({r.variant for r in runs})
        study = Study(name=out.name, base=[], args=[], seeds=sorted({r.seed for r in runs}),
                      variants=[], baseline="baseline" if "baseline" in names else names[0])
        order = names
    else:
        order = [v.name for v in study.variants]
    meta = json.loads((runs_dir / "study_meta.json").read_text()) if (runs_dir / "study_meta.json").exists() else {}
    grid = Grid(runs, order)
    alpha, base = study.alpha, study.baseline
    title = study.name

    L = provenance_section(out, study, runs, meta, order)
    L += endpoints_section(grid, runs)
    claims, figs_paired = claims_section(study, grid)
    L += claims
    L += secondary_section(study, runs, grid.best_key)
    L += downstream_section(runs, grid.order, grid.best_key)

    # -- figures -----------------------------------------------------------------------------------------
    curves, labels, dyn_roots = {}, {}, {}
    for v in grid.order:
        lr = grid.best_key(v)
        curves[v] = [d["val"] for r, d in runs.items() if r.variant == v and r.lr == lr]
        labels[v] = f"{v} @ LR {_lr(lr)}"
        dyn_roots[v] = [d["root"] for r, d in runs.items() if r.variant == v and r.lr == lr and not d.get("diverged")]
    plot_val(curves, labels, out / "val_loss.png", title)
    L += ["## Figures", "", "Validation loss, each variant at its best LR:", "", "![validation loss](val_loss.png)", ""]
    if any(len([x for x in grid.lrs(v) if x is not None]) > 1 for v in grid.order):
        plot_lr_sweep({v: grid.E[v] for v in grid.order}, grid.best, out / "lr_sweep.png", title)
        L += ["![LR sweep](lr_sweep.png)", ""]
    if figs_paired:
        plot_paired(figs_paired, out / "paired.png", title, _ci_name(alpha))
        L += ["Paired differences of the primary comparisons:", "", "![paired differences](paired.png)", ""]
    dyn_names = study.dynamics or [base] + [v for v in grid.order if v != base][-1:]  # default: reference and the last variant
    dyn = plot_dynamics({n: dyn_roots[n] for n in dyn_names if dyn_roots.get(n)}, out / "scale_dynamics.png")
    if dyn:
        L += [f"Scale-vector dynamics (`ScaleVectorMonitor`, mean effective γ per layer and site, mean over seeds) "
              f"of {', '.join(n for n in dyn_names if dyn_roots.get(n))} at their best LR:", "",
              f"![scale dynamics]({dyn})", ""]
    L += plot_sharpness({n: dyn_roots[n] for n in grid.order}, out)
    if command:
        L += [command, ""]
    notes = out / "notes.md"
    if notes.exists():
        L += ["## Discussion", "", notes.read_text().strip(), ""]
    path = out / "report.md"
    path.write_text("\n".join(L) + "\n")
    write_endpoints(out, study, runs, meta)
    print(f"[study] wrote {path} and {ENDPOINTS}")
    return path


def write_endpoints(out: Path, study: Study, runs: dict[Run, dict], meta: dict) -> Path:
    """``<out>/endpoints.json``: every complete run's endpoint, small enough to commit beside the report, so
    that the record (and ``lr_from``, which reads it when the study's runs folder is gone) outlives the runs."""
    def finite(x):
        return None if x is None or x != x or x in (float("inf"), float("-inf")) else float(x)

    rows = [{"variant": r.variant, "lr": r.lr, "seed": r.seed,
             "endpoint": None if d.get("diverged") else finite(run_endpoint(d)),
             "endpoint_steps": d.get("endpoint_steps"), "final_val_loss": finite(d.get("final_val_loss")),
             "diverged": d.get("diverged"), "commit": (d.get("code") or {}).get("commit")}
            for r, d in sorted(runs.items(), key=lambda kv: (kv[0].variant, kv[0].lr or 0.0, kv[0].seed))]
    record = {"study": study.name, "endpoint_evals": study.endpoint_evals,
              "commit": (meta.get("code") or {}).get("commit"), "data": meta.get("data"), "runs": rows}
    path = out / ENDPOINTS
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path
