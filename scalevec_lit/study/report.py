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
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Optional

import yaml

from ..errors import UserError
from . import stats
from .events import read_scalars, run_endpoint
from .figures import plot_dynamics, plot_lr_sweep, plot_paired, plot_sharpness, plot_val
from .runner import now
from .downstream import report_section as downstream_section
from .regime import regime_detail, study_regime
from .secondary import report_section as secondary_section
from .spec import DONE, VAL_TAG, Run, Study, fmt_lr, load_study

SEPARATION = 2.0


def load_runs(runs_dir: Path) -> dict[Run, dict]:
    """``{Run: done.json + {"root": folder}}`` of the complete runs under ``runs_dir``."""
    found = {}
    for done_file in sorted(Path(runs_dir).rglob(DONE)):
        done = json.loads(done_file.read_text())
        lr = done.get("lr")
        done["root"] = done_file.parent
        if "val" not in done:  # runs made before done.json held the curve
            done["val"] = read_scalars(done_file.parent, (VAL_TAG,)).get(VAL_TAG, [])
        found[Run(done["variant"], None if lr is None else float(lr), int(done["seed"]))] = done
    return found


def _f(x: float, signed: bool = False, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def _p(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


def _lr(lr: Optional[float]) -> str:
    return "recipe" if lr is None else fmt_lr(lr)


class Grid:
    """Endpoints ``E[variant][lr][seed]`` and each variant's best LR."""

    def __init__(self, runs: dict[Run, dict], order: list[str]):
        self.E: dict[str, dict[Optional[float], dict[int, float]]] = {}
        for run, done in runs.items():
            self.E.setdefault(run.variant, {}).setdefault(run.lr, {})[run.seed] = run_endpoint(done)
        self.order = [v for v in order if v in self.E]
        self.best: dict[str, Optional[float]] = {}
        for v in self.order:
            per_lr = {lr: list(s.values()) for lr, s in self.E[v].items()}
            self.best[v] = None if None in per_lr else stats.best_lr(per_lr)

    def lrs(self, v: str) -> list[Optional[float]]:
        return sorted(self.E[v], key=lambda x: -1.0 if x is None else x)

    def at_edge(self, v: str) -> bool:
        lrs = [x for x in self.lrs(v) if x is not None]
        return len(lrs) > 1 and self.best[v] in (lrs[0], lrs[-1])

    def best_key(self, v: str) -> Optional[float]:
        """The LR a variant is compared at for the own-best gap (its only LR when it has one)."""
        lrs = self.lrs(v)
        return lrs[0] if len(lrs) == 1 else self.best[v]


def comparisons(grid: Grid, var: str, ref: str, alpha: float) -> dict:
    """Every paired view of ``var`` vs ``ref``: same-LR (per common LR), own-best, pooled; and unpaired."""
    common = [lr for lr in grid.lrs(var) if lr in grid.E[ref]]
    same = {lr: stats.paired(grid.E[var][lr], grid.E[ref][lr], alpha) for lr in common}
    bv, br = grid.best_key(var), grid.best_key(ref)
    own = None
    if (bv in grid.E[var]) and (br in grid.E[ref]) and not (bv is None and len(grid.lrs(var)) > 1):
        own = stats.paired(grid.E[var][bv], grid.E[ref][br], alpha)
    pooled_v = {(lr, s): x for lr in common for s, x in grid.E[var][lr].items()}
    pooled_r = {(lr, s): x for lr in common for s, x in grid.E[ref][lr].items()}
    pooled = stats.paired(pooled_v, pooled_r, alpha) if len(common) > 1 else None
    unp = stats.unpaired(list(grid.E[var].get(bv, {}).values()), list(grid.E[ref].get(br, {}).values()), SEPARATION)
    return {"same": same, "own": own, "own_lrs": (bv, br), "pooled": pooled, "unpaired": unp, "common": common}


def primary_of(study: Study, c: dict) -> tuple[Optional[dict], str, str]:
    """The comparison that decides, its description, and the test (``sign`` or ``t``)."""
    if study.primary == "pooled" and c["pooled"] is not None:
        return c["pooled"], f"pooled over {len(c['common'])} LRs × seeds", "sign"
    if len(c["common"]) == 1 and c["own"] is None:
        lr = c["common"][0]
        return c["same"][lr], f"same LR ({_lr(lr)})", "t"
    bv, br = c["own_lrs"]
    if bv == br:
        return c["own"], f"own best LR (both {_lr(bv)})", "t"
    return c["own"], f"own best LR ({_lr(bv)} vs {_lr(br)})", "t"


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


def _data_dir(study: Study, meta: dict) -> Optional[str]:
    """The prepared data folder of the runs: ``study run --data``, the study's args, or the base recipe's."""
    data_dir = meta.get("data_dir")
    for a in study.args if data_dir is None else []:
        if a.startswith("--data.data_dir="):
            data_dir = a.split("=", 1)[1]
    if data_dir is None:
        for recipe in study.base:
            try:
                data_dir = ((yaml.safe_load(Path(recipe).read_text()) or {}).get("data") or {}).get("data_dir", data_dir)
            except OSError:
                pass
    return data_dir


def _data_line(study: Study, meta: dict) -> str:
    data_dir = _data_dir(study, meta)
    if not data_dir:
        return "Data: n/a."
    meta_path = Path(data_dir) / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        tok = meta.get("tokens", {})
        return (f"Data: `{data_dir}` ({tok.get('train', 0):,} training / {tok.get('val', 0):,} validation tokens, "
                f"vocabulary {meta.get('vocab_size')}, tokenizer sha256 {meta.get('tokenizer_sha256')}).")
    return f"Data: `{data_dir}` (its meta.json was not found where the report was written)."


def write_report(out: Path, study: Optional[Study] = None, command: Optional[str] = None) -> Path:
    """Write ``<out>/report.md`` and its figures; ``out`` holds the runs or a ``runs/`` folder that does (the
    report goes beside ``runs/``). A hand-written ``notes.md`` there is included as the discussion."""
    out = Path(out)
    runs_dir = out / "runs" if (out / "runs").is_dir() else out
    if study is None and (runs_dir / "study.yaml").exists():
        study = load_study(runs_dir / "study.yaml")
    runs = load_runs(runs_dir)
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

    # -- provenance --------------------------------------------------------------------------------------
    commits = sorted({(d.get("code") or {}).get("commit", "unknown") for d in runs.values()})
    dirty = any((d.get("code") or {}).get("dirty") for d in runs.values())
    walls = [d.get("wall_s_last_attempt", 0.0) for d in runs.values()]
    finished = sorted(d.get("finished", "") for d in runs.values())
    tokens = sorted({d.get("train_tokens") for d in runs.values() if d.get("train_tokens")})
    at_final = all(d.get("final_step") == d.get("last_train_step") for d in runs.values()
                   if d.get("last_train_step") is not None and not d.get("diverged"))
    n_div = sum(1 for d in runs.values() if d.get("diverged"))
    expected = len(study.runs()) if study.variants else len(runs)
    regime = study_regime(runs, base, _data_dir(study, meta))
    L = [f"# Study `{title}`: report", "",
         f"Generated {now()} by `python -m scalevec_lit study report {out}` (the tables and figures are "
         "computed from the runs; the discussion at the end is hand-written).", "",
         regime["line"] + ".", ""]
    if study.description:
        L += [study.description.strip(), ""]
    L += ["## How it was run", ""]
    run_cmd = meta.get("command") or (f"python -m scalevec_lit study run {study.path}" if study.path else "n/a")
    at_once = re.search(r"--parallel (\d+)", run_cmd)
    at_once = int(at_once.group(1)) if at_once else 1
    L += [f"- Command: `OMP_NUM_THREADS=1 {run_cmd}` (every run single-threaded, "
          f"{'one run at a time' if at_once == 1 else f'{at_once} runs at a time'}), "
          f"at commit **`{', '.join(commits)}`**"
          f"{' (with uncommitted changes!)' if dirty else ' (clean)'}; runs started {meta.get('started', 'n/a')}, "
          f"finished between {finished[0]} and {finished[-1]}; sum of run wall times {sum(walls) / 60:.1f} min.",
          f"- Base recipe(s): {', '.join(f'`{b}`' for b in study.base) or 'n/a'}; shared args: `{' '.join(study.args)}`.",
          f"- {_data_line(study, meta)}",
          f"- {regime_detail(regime, base)}",
          f"- Training tokens per run (last logged `train/tokens`): {', '.join(f'{t:,}' for t in tokens) or 'n/a'}.",
          f"- Endpoint: mean of the last {study.endpoint_evals} scheduled validation losses, logged at 0-based "
          f"steps {_endpoint_steps(runs)}; last evaluation at the final step in every "
          f"non-diverged run: **{'yes' if at_final else 'NO'}**.",
          f"- Grid: {len(order)} variants × LRs × seeds {study.seeds}: {len(runs)} of {expected} runs complete"
          f"{f', {n_div} diverged (non-finite loss; counted as the worse side in sign tests)' if n_div else ''}."]
    reused = sorted(f"`{r.label()}` from `{d['reused_from']}`" for r, d in runs.items() if d.get("reused_from"))
    if reused:
        L += [f"- Re-used runs (copied in before the study ran them; their finish times are the original ones): "
              f"{'; '.join(reused)}."]
    if meta.get("lr_from"):
        lf = meta["lr_from"]
        L += [f"- Learning rate from study `{lf['study']}`: {fmt_lr(lf['resolved_lr'])}, the best of "
              f"`{lf.get('variant', 'baseline')}` there (mean endpoints per LR: "
              + ", ".join(f"{k}: {sum(v) / len(v):.4f}" for k, v in lf.get("endpoints", {}).items()) + ")."]
    L += [""]
    if study.preregistration:
        L += ["## Pre-registration (from the study file, committed before the runs)", ""]
        L += ["> " + line if line.strip() else ">" for line in study.preregistration.strip().splitlines()]
        L += [""]

    # -- endpoints ---------------------------------------------------------------------------------------
    L += ["## Endpoints", "",
          "Mean ± std over seeds of the endpoint"
          + ("; ★ = the variant's best LR (lowest mean, no diverged seed)" if any(
              len(grid.lrs(v)) > 1 for v in grid.order) else "")
          + (", ⚠ = best LR at the edge of the grid (the optimum may lie outside it)" if any(
              grid.at_edge(v) for v in grid.order) else "") + ".", "",
          "| variant | LR | seeds | endpoint mean ± std | per seed | final val/loss mean |", "|---|---|---|---|---|---|"]
    for v in grid.order:
        for lr in grid.lrs(v):
            cells = grid.E[v][lr]
            vals = [cells[s] for s in sorted(cells)]
            fin = [x for x in vals if math.isfinite(x)]
            m, sd = stats.mean_std(fin) if fin else (float("nan"), float("nan"))
            finals = [d["final_val_loss"] for r, d in runs.items() if r.variant == v and r.lr == lr
                      and math.isfinite(d["final_val_loss"])]
            mark = " ★" if (lr is not None and grid.best[v] == lr and len(grid.lrs(v)) > 1) else ""
            mark += " ⚠" if mark and grid.at_edge(v) else ""
            per_seed = ", ".join(f"{s}: {_f(cells[s])}" if math.isfinite(cells[s]) else f"{s}: diverged"
                                 for s in sorted(cells))
            L.append(f"| {v} | {_lr(lr)}{mark} | {len(cells)} | {_f(m)} ± {_f(sd)} | {per_seed} | "
                     f"{_f(sum(finals) / len(finals)) if finals else 'n/a'} |")
    L += [""]

    # -- claims ------------------------------------------------------------------------------------------
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
    print(f"[study] wrote {path}")
    return path


def _endpoint_steps(runs: dict) -> str:
    """The steps of every run's endpoint (the most common set, then the runs with another), and the validations
    left out of an endpoint because they were made at a stop by signal, off the schedule."""
    groups: dict[tuple, list[str]] = {}
    for r, d in sorted(runs.items(), key=lambda item: item[0].label()):
        if d.get("endpoint_steps"):
            groups.setdefault(tuple(d["endpoint_steps"]), []).append(r.label())
    if not groups:
        return "n/a"
    order = sorted(groups, key=lambda k: -len(groups[k]))
    text = f"{list(order[0])} in {'every run' if len(order) == 1 else f'{len(groups[order[0]])} runs'}"
    for k in order[1:]:
        text += f", {list(k)} in {', '.join(f'`{x}`' for x in groups[k])}"
    off = [f"`{r.label()}` at {d['unscheduled_val_steps']}" for r, d in sorted(runs.items(), key=lambda i: i[0].label())
           if d.get("unscheduled_val_steps")]
    if off:
        text += (f" (validations made where a run stopped on a signal are off the schedule and left out: "
                 f"{'; '.join(off)})")
    return text


def _power_text(study: Study, summary: list) -> str:
    ns = sorted({p["n_pairs"] for *_, p, _ in summary if p})
    sds = [p["std"] for *_, p, _ in summary if p and math.isfinite(p["std"])]
    sign_min = ", ".join(f"{stats.min_sign_p(n):.4f} with {n} pairs" for n in ns)
    text = (f"**Power.** *Significant if |mean| >* is the smallest paired mean difference this design would call "
            f"significant given the observed paired std (t_{{1−α/2, n−1}} · sd/√n); *MDE 80%* the difference it "
            f"would detect with 80% probability ((t_{{1−α/2}} + t_{{0.8}}) · sd/√n). The smallest possible "
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
