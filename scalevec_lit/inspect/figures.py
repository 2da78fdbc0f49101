"""The PNG figures of ``inspect --out DIR`` (matplotlib, Agg backend, no display needed):

- ``profile_<role>.png``: mean and RMS of γ per layer (x: layer00 … final), one line per site/branch; with
  ``--compare`` A is drawn solid and B dashed in the same colour;
- ``heatmap_<role>.png``: γ itself, one panel per site/branch, rows = layers (per-expert γ: one row per
  layer and expert), columns = channels; with ``--compare``, ``heatmap_<role>_delta.png`` draws γ_B − γ_A
  of every aligned pair of equal width on a diverging scale centred at 0.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np

from scalevec_lit.scale.sites import INPUT, layer_label

from .stats import Row

_EXPERT = re.compile(r"expert(\d+)$")
MAX_ROWS_DRAWN = 48  # rows of a heatmap panel that get their own height (a 64-expert MoE has thousands)


def _figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=90)
    FigureCanvasAgg(fig)
    return fig


def _x(layer: int, n_layer: int) -> int:
    return n_layer if layer < 0 else layer


def _panel_key(row: Row) -> str:
    branch = "expert*" if _EXPERT.match(row.view.branch) else row.view.branch
    return f"{row.view.site}/{branch}"


def _roles(rows: list[Row]) -> list[str]:
    return sorted({r.view.role for r in rows}, key=lambda r: r != INPUT)


def profile_figure(path: Path, role: str, n_layer: int, sides: list[tuple[str, list[Row]]]) -> None:
    """Mean and RMS of γ per layer, one line per site/branch (and per side when comparing)."""
    fig = _figure(11, 4.2)
    axes = fig.subplots(1, 2)
    colours: dict[str, str] = {}
    palette = [f"C{i}" for i in range(10)]
    styles = ["-", "--"]
    for (label, rows), style in zip(sides, styles):
        lines: dict[str, dict[int, list[Row]]] = {}
        for r in rows:
            if r.view.role == role:  # per-expert γ: one line, the mean over the experts of each layer
                lines.setdefault(_panel_key(r), {}).setdefault(_x(r.view.layer, n_layer), []).append(r)
        for name, by_x in lines.items():
            colour = colours.setdefault(name, palette[len(colours) % len(palette)])
            xs = sorted(by_x)
            for ax, stat in zip(axes, ("mean", "rms")):
                ys = [float(np.mean([r.stats[stat] for r in by_x[x]])) for x in xs]
                ax.plot(xs, ys, style, marker="o", ms=3, color=colour,
                        label=name.replace("expert*", "expert* (mean)") + (f" ({label})" if len(sides) > 1 else ""))
    ticks = list(range(n_layer + 1))
    for ax, stat in zip(axes, ("mean of γ", "RMS of γ")):
        ax.set_title(stat, fontsize=10)
        ax.set_xticks(ticks, [layer_label(t if t < n_layer else -1) for t in ticks], rotation=90, fontsize=7)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
    title = f"{role}-role scale vectors per layer"
    if len(sides) > 1:
        title += f" — {sides[0][0]} solid, {sides[1][0]} dashed"
    fig.suptitle(title, fontsize=11)
    fig.subplots_adjust(left=0.06, right=0.78 if handles else 0.98, top=0.86, bottom=0.2, wspace=0.25)
    fig.savefig(path)


def _expert_number(row: Row) -> int:
    expert = _EXPERT.match(row.view.branch)
    return int(expert.group(1)) if expert else -1


def _grid(rows: list[Row], n_layer: int, values) -> tuple[list[str], np.ndarray]:
    """Row labels and a [rows, channels] array (NaN where a layer has no such vector)."""
    items = sorted(rows, key=lambda r: (_x(r.view.layer, n_layer), _expert_number(r), r.view.branch))
    width = max(values(r).numel() for r in items)
    grid = np.full((len(items), width), np.nan)
    labels = []
    for i, r in enumerate(items):
        v = values(r).numpy()
        grid[i, : v.size] = v
        expert = _EXPERT.match(r.view.branch)
        labels.append(r.view.layer_name + (f" e{expert.group(1)}" if expert else ""))
    return labels, grid


def heatmap_figure(path: Path, role: str, n_layer: int, rows: list[Row], title: str, values=None,
                   diverging: bool = False) -> bool:
    """γ (or ``values(row)``) per layer × channel, one panel per site/branch; False when nothing to draw."""
    import matplotlib

    values = values or (lambda r: r.gamma)
    panels: dict[str, list[Row]] = {}
    for r in rows:
        if r.view.role == role and values(r) is not None:
            panels.setdefault(_panel_key(r), []).append(r)
    if not panels:
        return False
    # panels of many rows (per-expert γ) last, so that the small ones share a row of the figure
    order = sorted(panels, key=lambda k: len(panels[k]) > 2 * n_layer + 1)
    panels = {k: panels[k] for k in order}
    n = len(panels)
    cols = min(n, 3)
    nrows = -(-n // cols)
    heights = [1.3 + 0.22 * min(max(len(panels[k]) for k in order[r * cols:(r + 1) * cols]), MAX_ROWS_DRAWN)
               for r in range(nrows)]  # inches per row of panels; more rows than MAX_ROWS_DRAWN share the height
    height = sum(heights) + 0.7
    fig = _figure(5.2 * cols, height)
    axes = fig.subplots(nrows, cols, squeeze=False, gridspec_kw={"height_ratios": heights}).ravel()
    for ax, (name, members) in zip(axes, panels.items()):
        labels, grid = _grid(members, n_layer, values)
        finite = grid[np.isfinite(grid)]
        if diverging:
            top = float(np.abs(finite).max()) if finite.size else 1.0
            kw = dict(cmap="RdBu_r", vmin=-(top or 1.0), vmax=top or 1.0)
        else:
            kw = dict(cmap="viridis")
        cmap = matplotlib.colormaps[kw.pop("cmap")].with_extremes(bad="0.85")
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap, **kw)
        step = max(1, -(-len(labels) // MAX_ROWS_DRAWN))  # label every step-th row when there are many
        ax.set_yticks(range(0, len(labels), step), labels[::step], fontsize=6)
        ax.set_xlabel("channel", fontsize=7)
        ax.tick_params(axis="x", labelsize=6)
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        ax.set_title(f"{name}  [{lo:.3g}, {hi:.3g}]", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02).ax.tick_params(labelsize=6)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11, y=1 - 0.12 / height, va="top")
    fig.subplots_adjust(left=0.07, right=0.98, top=1 - 0.6 / height, bottom=0.45 / height, wspace=0.3,
                        hspace=0.9 / (sum(heights) / nrows))
    fig.savefig(path)
    return True


def write_figures(out: Path, n_layer: int, sides: list[tuple[str, list[Row]]], pairs: Optional[list] = None) -> list[str]:
    """Every figure for the rows of one model (or two, with their aligned ``pairs``); the file names."""
    written = []
    all_rows = [r for _, rows in sides for r in rows]
    for role in _roles(all_rows):
        name = f"profile_{role}.png"
        profile_figure(out / name, role, n_layer, sides)
        written.append(name)
        for i, (label, rows) in enumerate(sides):
            name = f"heatmap_{role}.png" if len(sides) == 1 else f"heatmap_{role}_{'AB'[i]}.png"
            if heatmap_figure(out / name, role, n_layer, rows, f"{role}-role γ per layer × channel ({label})"):
                written.append(name)
        if pairs is not None:
            deltas = [_DeltaRow(p) for p in pairs if p.gamma_delta is not None and p.any.view.role == role]
            name = f"heatmap_{role}_delta.png"
            if heatmap_figure(out / name, role, n_layer, deltas, f"{role}-role γ_B − γ_A per layer × channel",
                              values=lambda r: r.gamma, diverging=True):
                written.append(name)
    return written


class _DeltaRow:
    """A pair drawn as a row whose γ is γ_B − γ_A (for ``heatmap_figure``)."""

    def __init__(self, pair) -> None:
        self.view = pair.b.view if pair.match.startswith("shared") else pair.a.view
        self.gamma = pair.gamma_delta
