"""The grid of a study's endpoints (variant × LR × seed), each variant's best LR, the paired comparisons of a
variant with its reference (same LR, own best LR, pooled; and the unpaired view), and the report's
"Endpoints" table. The number formats shared by the report's tables are here too.

Definitions: see ``report.py``. Plain Python, like the rest of ``study/``.
"""
from __future__ import annotations

import math
from typing import Optional

from . import stats
from .events import run_endpoint
from .spec import Run, Study, fmt_lr

SEPARATION = 2.0


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


def endpoints_section(grid: Grid, runs: dict[Run, dict]) -> list[str]:
    """``## Endpoints``: mean ± std over seeds per variant and LR, the best LR marked."""
    L: list[str] = []
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
    return L
