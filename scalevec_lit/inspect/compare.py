"""``inspect A --compare B``: the scale vectors of two models side by side.

Two models compare when they have the same number of layers (otherwise the refusal says what differs).
Rows are aligned by (layer, site, branch, role); a shared γ of one model is aligned with each per-branch γ
of the other at the same layer, site and role (e.g. ``baseline``'s one attention-input γ with ``hg``'s
γ_q, γ_k, γ_v: ``match`` says ``shared↔q``); what has no counterpart is listed as ``only A`` / ``only B``.
Deltas are B − A; ``dgamma_absmax`` = max_j |γ_B,j − γ_A,j| where both γ have the same width.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from scalevec_lit.errors import UserError
from scalevec_lit.scale.sites import INPUT

from .load import Loaded
from .stats import STAT_NAMES, Row
from .tables import NO_SCALES, num, text_table

SHARED = "shared"


@dataclass
class Pair:
    a: Optional[Row]
    b: Optional[Row]
    match: str  # exact, shared↔<branch>, <branch>↔shared, only A, only B

    @property
    def any(self) -> Row:
        return self.a if self.a is not None else self.b  # type: ignore[return-value]

    def delta(self, stat: str) -> Optional[float]:
        if self.a is None or self.b is None:
            return None
        return self.b.stats[stat] - self.a.stats[stat]

    def conserved_delta(self) -> Optional[float]:
        if self.a is None or self.b is None or self.a.conserved is None or self.b.conserved is None:
            return None
        return float(self.b.conserved.mean() - self.a.conserved.mean())

    @property
    def gamma_delta(self) -> Optional[torch.Tensor]:
        if self.a is None or self.b is None or self.a.gamma.shape != self.b.gamma.shape:
            return None
        return self.b.gamma - self.a.gamma


def check_comparable(a: Loaded, b: Loaded) -> None:
    if a.n_layer != b.n_layer:
        raise UserError("--compare", repr(b.path), f"has {b.n_layer} layers and PATH {a.path!r} has {a.n_layer}: "
                        "the two cannot be aligned layer by layer",
                        "compare two checkpoints of the same architecture (e.g. two strategies, or one run before "
                        "and after training)")


def align(rows_a: list[Row], rows_b: list[Row]) -> list[Pair]:
    """Pairs in A's order, then B's unmatched rows (see the module docstring)."""
    by_b = {r.view.key: r for r in rows_b}
    keys_a = {r.view.key for r in rows_a}
    used: set[tuple] = set()
    pairs: list[Pair] = []
    for ra in rows_a:
        key = ra.view.key
        layer, site, branch, role = key
        if key in by_b:
            pairs.append(Pair(ra, by_b[key], "exact"))
            used.add(key)
            continue
        if branch == SHARED:  # A's one γ against each of B's per-branch γ at this site that A does not have
            mates = [rb for rb in rows_b if rb.view.key[:2] == (layer, site) and rb.view.role == role
                     and rb.view.branch != SHARED and rb.view.key not in keys_a]
            pairs += [Pair(ra, rb, f"shared↔{rb.view.branch}") for rb in mates]
            used.update(rb.view.key for rb in mates)
            if mates:
                continue
        shared_key = (layer, site, SHARED, role)
        if shared_key in by_b and shared_key not in keys_a:
            pairs.append(Pair(ra, by_b[shared_key], f"{branch}↔shared"))
            used.add(shared_key)
            continue
        pairs.append(Pair(ra, None, "only A"))
    pairs += [Pair(None, rb, "only B") for rb in rows_b if rb.view.key not in used]
    return pairs


def compare_tables(pairs: list[Pair], a: Loaded, b: Loaded) -> str:
    out = [f"A = {a.path}\nB = {b.path}\nΔ = B − A"]
    if not pairs:
        out.append(NO_SCALES.replace("this model", "either model"))
    for role in sorted({p.any.view.role for p in pairs}, key=lambda r: r != INPUT):
        mine = [p for p in pairs if p.any.view.role == role]
        header = ["layer", "site", "branch", "match", "mean A", "mean B", "Δmean", "RMS A", "RMS B", "ΔRMS", "Δmin",
                  "Δmax", "Δaniso", "max|Δγ|"]
        if role == INPUT:
            header.append("Δ‖w‖²−γ² mean")
        header.append("fold A / B")
        lines = []
        for p in mine:
            v = p.any.view
            branch = v.branch if p.a is None or p.b is None or p.a.view.branch == p.b.view.branch else \
                f"{p.a.view.branch}/{p.b.view.branch}"
            dg = p.gamma_delta
            cells = [v.layer_name, v.site, branch, p.match,
                     num(p.a.stats["mean"] if p.a else None), num(p.b.stats["mean"] if p.b else None), num(p.delta("mean")),
                     num(p.a.stats["rms"] if p.a else None), num(p.b.stats["rms"] if p.b else None), num(p.delta("rms")),
                     num(p.delta("min")), num(p.delta("max")), num(p.delta("anisotropy")),
                     num(None if dg is None else float(dg.abs().max()))]
            if role == INPUT:
                cells.append(num(p.conserved_delta()))
            fa = "—" if p.a is None else ("folds" if p.a.view.folds else "stays")
            fb = "—" if p.b is None else ("folds" if p.b.view.folds else "stays")
            cells.append(fa if fa == fb else f"{fa} / {fb}")
            lines.append(cells)
        out.append(f"{role}-role scale vectors, A vs B ({len(mine)})\n{text_table(header, lines)}")
    return "\n\n".join(out)


def pair_record(p: Pair) -> dict[str, Any]:
    v = p.any.view
    rec: dict[str, Any] = {"layer": v.layer, "layer_name": v.layer_name, "site": v.site, "role": v.role,
                           "branch_a": p.a.view.branch if p.a else None, "branch_b": p.b.view.branch if p.b else None,
                           "match": p.match}
    for s in STAT_NAMES:
        rec[f"a_{s}"] = p.a.stats[s] if p.a else None
        rec[f"b_{s}"] = p.b.stats[s] if p.b else None
        rec[f"d_{s}"] = p.delta(s)
    dg = p.gamma_delta
    rec["dgamma_absmax"] = None if dg is None else float(dg.abs().max())
    rec["d_c_mean"] = p.conserved_delta()
    rec["folds_a"] = p.a.view.folds if p.a else None
    rec["folds_b"] = p.b.view.folds if p.b else None
    return rec
