"""What ``inspect`` prints and writes as text: one table per role on the terminal, and every row (every
number, γ itself and the conserved quantity per channel) as CSV and JSON.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Optional

from scalevec_lit.scale.sites import INPUT

from .stats import STAT_NAMES, Row

HEADERS = {"mean": "mean", "rms": "RMS", "std": "std", "min": "min", "max": "max", "anisotropy": "aniso",
           "near_zero": "~0 %"}
SHOWN_STATS = ("mean", "rms", "min", "max", "anisotropy", "near_zero")
NO_SCALES = "no learnable scale vectors: every norm of this model has γ ≡ 1 (NoScale), nothing to fold"


def num(x: Optional[float]) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.4g}"


def short_target(name: str) -> str:
    """``blocks.0.attn.input.proj.q.weight`` → ``q``; ``blocks.1.mlp.expert_down`` → ``expert_down``."""
    parts = [p for p in name.split(".") if p not in ("weight", "proj", "input")]
    return parts[-1] if parts else name


def fold_short(row: Row) -> str:
    v = row.view
    if not v.folds:
        if v.site.endswith("_output"):
            return "stays (output norm)"
        return "stays (QK-norm)" if v.branch in ("q", "k") else ("stays" if v.role != INPUT else "no target named")
    axis = v.targets[0].axis if v.targets else "columns"
    names = ",".join(short_target(t.weight) + (f"[{t.expert}]" if t.expert is not None else "") for t in v.targets)
    return f"→ {'cols' if axis == 'columns' else 'rows'} {names}"


def text_table(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(header)]
    right = [i >= 4 and i < len(header) - 1 for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, lines)])


def role_tables(rows: list[Row]) -> str:
    """One table per role (input first): layer, site, branch, parameterization, statistics of γ, the conserved
    quantity ‖w_j‖² − γ_j² (input role: mean [min, max] over channels) and the fold verdict."""
    if not rows:
        return NO_SCALES
    out = []
    for role in sorted({r.view.role for r in rows}, key=lambda r: r != INPUT):
        mine = [r for r in rows if r.view.role == role]
        header = ["layer", "site", "branch", "γ"] + [HEADERS[s] for s in SHOWN_STATS]
        if role == INPUT:
            header.append("‖w‖²−γ² mean [min, max]")
        header.append("fold")
        lines = []
        for r in mine:
            cells = [r.view.layer_name, r.view.site, r.view.branch, r.view.parameterization.replace("Scale", "")]
            cells += [num(100 * r.stats[s]) if s == "near_zero" else num(r.stats[s]) for s in SHOWN_STATS]
            if role == INPUT:
                c = r.conserved_summary
                cells.append("—" if c["c_mean"] is None else
                             num(c["c_mean"]) if r.conserved.numel() == 1 else
                             f"{num(c['c_mean'])} [{num(c['c_min'])}, {num(c['c_max'])}]")
            cells.append(fold_short(r))
            lines.append(cells)
        out.append(f"{role}-role scale vectors ({len(mine)})\n{text_table(header, lines)}")
    return "\n\n".join(out)


def row_record(row: Row, full: bool = True) -> dict[str, Any]:
    """Every field of a row (``full``: with γ and the conserved quantity per channel)."""
    v = row.view
    rec: dict[str, Any] = {"layer": v.layer, "layer_name": v.layer_name, "site": v.site, "branch": v.branch,
                           "role": v.role, "parameterization": v.parameterization, "dim": row.gamma.numel(),
                           "parameters": ";".join(v.names)}
    rec.update({s: row.stats[s] for s in STAT_NAMES})
    rec.update(row.conserved_summary)
    rec["conserved_law"] = row.conserved_note
    rec["folds"] = v.folds
    rec["fold_targets"] = ";".join(t.describe() for t in v.targets)
    rec["fold"] = v.reason
    if full:
        rec["gamma"] = row.gamma.tolist()
        rec["conserved"] = None if row.conserved is None else row.conserved.tolist()
    return rec


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    """One line per record; list-valued fields (γ per channel) are left to the JSON."""
    lists = {k for rec in records for k, val in rec.items() if isinstance(val, list)}
    fields = list(dict.fromkeys(k for rec in records for k in rec if k not in lists))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for rec in records:
            w.writerow({k: ("" if rec.get(k) is None else rec.get(k)) for k in fields})


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
