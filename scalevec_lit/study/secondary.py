"""Pre-registered secondary endpoints and power of a study.

A study file may name, beside the validation-loss endpoint:

- ``secondary``: a list of ``{tag, evals, expect, reference, name}``: the endpoint of a run on another
  TensorBoard scalar (e.g. ``sharpness/precond_lambda_max`` from ``SharpnessMonitor``), the mean of its last
  ``evals`` logged values (default 3), recorded in ``done.json`` under ``secondary``; the report compares
  each variant against ``reference`` (default the study's baseline) paired by seed at the same LR (the
  reference's best), with ``expect: {variant: lower|higher}`` deciding a verdict by the paired t-test;
  ``log: true`` takes the natural log of each value first (for a scale-free quantity such as a Hessian
  eigenvalue: a difference of 0.1 is then about 10%, and seeds vary by a factor, not an amount);
- ``power``: ``{mde, pilot_sd, level, endpoint, source}``: the minimum detectable effect the study is
  designed for (on the primary endpoint, or on a secondary tag named by ``endpoint``), the paired std it
  was sized from (``pilot_sd``, from an earlier study named in ``source``), and the power (``level``,
  default 0.8). ``study run`` and the report state the seeds that design needs and whether the study has
  them; after the runs the report gives the MDE at the observed paired std.

Plain Python (no torch), like the rest of ``study/``.
"""
from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Optional

from . import stats


def seeds_needed(sd: float, mde: float, alpha: float = 0.05, level: float = 0.8, most: int = 1000) -> Optional[int]:
    """The fewest pairs n at which the two-sided paired t-test detects ``mde`` with probability ``level``
    (its exact MDE, ``stats.detectable``, is at most ``mde``; ``None`` beyond ``most``). The search starts
    where the usual approximation, (t_{1-α/2,n-1} + t_{level,n-1}) · sd/√n ≤ mde, is met (cheap; within a
    pair or two of the answer: it is smaller than the exact MDE at few pairs, very slightly larger at many)."""
    def enough(n: int) -> bool:
        return stats.detectable(sd, n, alpha, level)["mde"] <= mde

    # a t-test needs at least the pairs of the z-test with known σ, ((z_{1-α/2} + z_level) · sd/mde)²; 0.95 of it
    # leaves room for the z-test's other tail
    z = NormalDist()
    least = max(2, int(0.95 * ((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(level)) * sd / mde) ** 2))
    n = next((k for k in range(least, most + 1)
              if stats.detectable(sd, k, alpha, level, exact=False)["mde"] <= mde), most + 1)
    while n > 2 and enough(n - 1):
        n -= 1
    while n <= most and not enough(n):
        n += 1
    return n if n <= most else None


def power_line(study, seeds: Optional[int] = None, complete: Optional[int] = None) -> Optional[str]:
    """One line: the pre-registered MDE, the seeds it needs at the pilot std, and the seeds the study has.
    ``complete``: the seeds whose compared runs have all finished (a report's count); when fewer than the
    design's, the verdict is on them (a study stopped by a clock cap, or still running)."""
    p = getattr(study, "power", None)
    if not p:
        return None
    on = "the primary endpoint" if p["endpoint"] == "primary" else f"`{p['endpoint']}`"
    n_have = seeds if seeds is not None else len(study.seeds)
    if complete is not None and complete < n_have:
        n_have, has = complete, f"{n_have}, {complete} of them complete"
    else:
        has = f"{n_have}"
    if p["pilot_sd"] is None:
        return (f"Pre-registered minimum detectable effect on {on}: {p['mde']:g} at {p['level']:.0%} power "
                f"(no pilot std given: the seeds are not sized; {n_have} seeds).")
    need = seeds_needed(p["pilot_sd"], p["mde"], study.alpha, p["level"])
    src = f" (source: {p['source']})" if p["source"] else ""
    verdict = ("enough" if need is not None and n_have >= need else "NOT enough: the study is underpowered for it")
    return (f"Pre-registered minimum detectable effect on {on}: {p['mde']:g} at {p['level']:.0%} power, paired "
            f"t-test at {study.alpha:g}, pilot paired std {p['pilot_sd']:g}{src}: needs "
            f"{need if need is not None else '> 1000'} seeds; the study has {has}: {verdict}.")


def endpoints_of(root: Path, study) -> dict:
    """``{tag: endpoint}`` of a finished run's secondary tags (absent tags are left out)."""
    specs = getattr(study, "secondary", None) or []
    if not specs:
        return {}
    from .events import endpoint, read_scalars

    logged = read_scalars(root, tuple(s["tag"] for s in specs))
    out = {}
    for s in specs:
        series = logged.get(s["tag"], [])
        if s["log"]:  # a non-positive value has no log: it is left out (a NaN would void the run)
            series = [(step, math.log(v)) for step, v in series if v > 0]
        if series:
            out[s["tag"]] = endpoint(series, s["evals"])
    return out


def report_section(study, runs: dict, best_lr_of) -> list[str]:
    """The report's section on the secondary endpoints and the power; ``best_lr_of(variant)`` gives the LR
    (or ``None``) each variant is compared at."""
    specs = getattr(study, "secondary", None) or []
    lines: list[str] = []
    if not specs and not getattr(study, "power", None):
        return lines
    lines += ["## Secondary endpoints (pre-registered)", ""]
    compared = {(r.variant, r.seed) for r in runs if r.lr == best_lr_of(r.variant)}
    variants = {v for v, _ in compared}
    complete = sum(bool(variants) and all((v, seed) in compared for v in variants) for seed in study.seeds)
    pl = power_line(study, complete=complete)
    if pl:
        lines += [pl, ""]
    for s in specs:
        tag, ref = s["tag"], s["reference"]
        per: dict[str, dict[int, float]] = {}
        for r, d in runs.items():
            if r.lr != best_lr_of(r.variant):
                continue
            e = (d.get("secondary") or {}).get(tag)
            if e is not None and math.isfinite(float(e["value"])):
                per.setdefault(r.variant, {})[r.seed] = float(e["value"])
        what = f"natural log of the last {s['evals']} values" if s["log"] else f"last {s['evals']} values"
        lines += [f"### `{s['name']}`: mean of the {what} of `{tag}`", ""]
        if not per:
            lines += [f"No run logged `{tag}`.", ""]
            continue
        lines += ["| variant | seeds | mean ± std | vs reference: paired mean (CI) | p (t) | MDE 80% | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for v in sorted(per, key=lambda name: (name != ref, name)):
            vals = [per[v][k] for k in sorted(per[v])]
            m, sd = stats.mean_std(vals)
            if v == ref or ref not in per:
                lines.append(f"| {v}{' (reference)' if v == ref else ''} | {len(vals)} | {m:.4g} ± {sd:.3g} | — | — | — | — |")
                continue
            p = stats.paired(per[v], per[ref], study.alpha)
            expect = s["expect"].get(v)
            vd = stats.verdict(p, expect, study.alpha, "t") if expect else "—"
            lines.append(f"| {v} | {len(vals)} | {m:.4g} ± {sd:.3g} | {p['mean']:+.4g} ([{p['ci'][0]:+.3g}, "
                         f"{p['ci'][1]:+.3g}]) | {p.get('p_t', float('nan')):.3f} | {p['mde']:.3g} | "
                         f"{('**' + vd + '** (expected ' + expect + ')') if expect else vd} |")
        lines += [""]
    return lines
