"""The report's verdicts and claims: per claim, the primary paired comparison of each variant with its
reference and its verdict (``claims_section``), the table of every verdict, and the note on power.

Plain Python, like the rest of ``study/``.
"""
from __future__ import annotations

import math
from typing import Optional

from . import stats
from .grid import SEPARATION, Grid, _f, _lr, _p, comparisons, primary_of
from .spec import Study


def _stats_cells(p: Optional[dict]) -> str:
    if p is None:
        return "| n/a | | | | | |"
    sign = f"{p['n_pos']}+/{p['n_neg']}− (p={_p(p['p_sign'])})"
    div = f", {p['diverged']} pair(s) with a diverged run" if p["diverged"] else ""
    t = f"{_f(p.get('t', float('nan')), True, 2)} (p={_p(p.get('p_t', float('nan')))})"
    ci = f"[{_f(p['ci'][0], True)}, {_f(p['ci'][1], True)}]"
    return (f"| {p['n']}{div} | {_f(p['mean'], True)} ± {_f(p['std'])} | {t} | {sign} | {ci} | "
            f"{_f(p['significant'])} / {_f(p['mde'])} |")


def _ci_name(alpha: float) -> str:
    """The interval's method and level, as the tables name it (``Student-t 95% CI``)."""
    return f"{stats.CI_METHOD} {100 * (1 - alpha):g}% CI"


def stats_head(alpha: float) -> str:
    return (f"| comparison | pairs | paired mean ± std | t (p) | sign test | {_ci_name(alpha)} of the mean | "
            "significant if \\|mean\\| > / MDE 80% |")
STATS_RULE = "|---|---|---|---|---|---|---|"


def claims_section(study: Study, grid: Grid) -> tuple[list[str], list[dict]]:
    """``## Verdicts`` and ``## Claims``, and the paired differences of the primary comparisons (for the figure)."""
    alpha, base = study.alpha, study.baseline
    L: list[str] = []
    figs_paired = []
    summary = []
    claim_sections = []
    for claim in study.claims:
        ref = claim.get("reference", base)
        sec = [f"### {claim['title']}", ""]
        if claim.get("paper"):
            sec += [f"Paper: {claim['paper']}", ""]
        verdicts = []
        for var, expect in (claim.get("expect") or {}).items():
            if var not in grid.E or ref not in grid.E:
                sec.append(f"- `{var}` vs `{ref}`: runs missing")
                verdicts.append("missing")
                continue
            c = comparisons(grid, var, ref, alpha)
            prim, how, test = primary_of(study, c)
            vd = stats.verdict(prim, expect, alpha, test) if prim else "missing"
            verdicts.append(vd)
            summary.append((f"`{var}` − `{ref}`", how, expect, test, prim, vd))
            sec += [f"**`{var}` vs `{ref}`** (expected: {expect} loss). Primary ({how}, "
                    f"{'exact sign test' if test == 'sign' else 'paired t-test'} at {alpha:g}): **{vd}**.", "",
                    stats_head(alpha), STATS_RULE]
            for lr, p in c["same"].items():
                sec.append(f"| same LR {_lr(lr)} " + _stats_cells(p))
            if c["own"] is not None and len(c["common"]) > 1:
                bv, br = c["own_lrs"]
                sec.append(f"| own best LR ({_lr(bv)} vs {_lr(br)}) " + _stats_cells(c["own"]))
            if c["pooled"] is not None:
                sec.append(f"| pooled, {len(c['common'])} LRs × seeds " + _stats_cells(c["pooled"]))
            u = c["unpaired"]
            sec += ["", f"Unpaired (secondary, at the primary LRs): difference of means {_f(u['diff'], True)}, "
                    f"{SEPARATION:g} × pooled seed std {_f(SEPARATION * u['pooled'])} → "
                    f"{'separable' if u['separable'] else 'not separable'}.", ""]
            if len(c["common"]) > 1 and c["own"] is not None:
                bref = grid.best_key(ref)
                same_at_ref_best = c["same"].get(bref)
                if same_at_ref_best is not None:
                    sec += [f"Gap at the same LR (the reference's best, {_lr(bref)}): "
                            f"{_f(same_at_ref_best['mean'], True)}; gap with each at its own best LR: "
                            f"{_f(c['own']['mean'], True)}.", ""]
            if prim is not None:
                figs_paired.append({"label": f"{var} − {ref} ({how})", "diffs": prim["diffs"], "mean": prim["mean"],
                                    "ci": prim["ci"]})
        sec += [f"**Verdict: {_overall(verdicts)}.**", ""]
        if claim.get("note"):
            sec += [claim["note"].strip(), ""]
        claim_sections += sec

    if summary:
        L += ["## Verdicts (primary rule, paired)", "",
              f"| comparison | primary set | expected | test | pairs | paired mean ({_ci_name(alpha)}) | p | "
              "smallest significant \\|mean\\| / MDE at 80% power | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for label, how, expect, test, p, vd in summary:
            if p is None:
                L.append(f"| {label} | {how} | {expect} | {test} | n/a | n/a | n/a | n/a | {vd} |")
                continue
            pval = p["p_sign"] if test == "sign" else p.get("p_t", float("nan"))
            ptxt = (f"{_p(pval)} ({p['n_pos']}+/{p['n_neg']}−)" if test == "sign" else
                    f"{_p(pval)} (t={_f(p.get('t', float('nan')), True, 2)})")
            L.append(f"| {label} | {how} | {expect} | {'sign' if test == 'sign' else 't'} | {p['n_pairs']} | "
                     f"{_f(p['mean'], True)} ([{_f(p['ci'][0], True)}, {_f(p['ci'][1], True)}]) | {ptxt} | "
                     f"{_f(p['significant'])} / {_f(p['mde'])} | **{vd}** |")
        L += ["", _power_text(study, summary), ""]
    L += ["## Claims", "", *claim_sections]
    return L, figs_paired


def _power_text(study: Study, summary: list) -> str:
    ns = sorted({p["n_pairs"] for *_, p, _ in summary if p})
    sds = [p["std"] for *_, p, _ in summary if p and math.isfinite(p["std"])]
    sign_min = ", ".join(f"{stats.min_sign_p(n):.4f} with {n} pairs" for n in ns)
    text = (f"**Power.** *Significant if |mean| >* is the smallest paired mean difference this design would call "
            f"significant given the observed paired std (t_{{1−α/2, n−1}} · sd/√n); *MDE 80%* the difference it "
            f"would detect with 80% probability (exactly: λ · sd/√n, λ the noncentrality at which the two-sided "
            f"paired t-test has 80% power, from the noncentral t with n − 1 degrees of freedom; the usual "
            f"(t_{{1−α/2}} + t_{{0.8}}) · sd/√n has only 73–79% power at 2–6 pairs). The smallest possible "
            f"two-sided sign-test p is {sign_min}")
    if sds:
        text += (f"; observed paired stds range {min(sds):.4f}–{max(sds):.4f}")
    return text + "."


def _overall(verdicts: list[str]) -> str:
    if not verdicts or "missing" in verdicts:
        return "incomplete (runs missing)"
    kinds = set(verdicts)
    if len(kinds) == 1:
        return verdicts[0]
    return "mixed: " + "; ".join(f"{verdicts.count(k)} of {len(verdicts)} {k}" for k in sorted(kinds))
