"""The monitors' drawing (matplotlib, Agg): one heatmap figure per role, built once per layout and redrawn;
histogram pictures for the loggers that take images only."""
from __future__ import annotations

import numpy as np

DRIFT_COLOUR_UNIT = 0.01  # the heatmap's drift colours are linear below this, logarithmic above


class HeatmapFigure:
    """One matplotlib (Agg) figure per role: a panel per statistic, rows = layers, columns = site/branch.

    Built and fully drawn once per layout; each log then only restores the static background and draws
    the cell images and the panel titles (which carry the colour range) on it, a few milliseconds instead
    of a full redraw. Colours are normalized per panel to its own [min, max]; the drift panel uses
    ``asinh(drift / DRIFT_COLOUR_UNIT)`` scaled to ±max, so that one large drift does not hide the rest.
    """

    def __init__(self, key: tuple, role: str, rows: list[str], cols: list[str], names: list[str]) -> None:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.key, self.role, self.names = key, role, names
        width = 1.2 + len(names) * (0.9 + 0.3 * len(cols))
        height = 1.9 + 0.26 * len(rows) + 0.065 * max(len(c) for c in cols)
        self.fig = Figure(figsize=(width, height), dpi=90)
        self.canvas = FigureCanvasAgg(self.fig)
        axes = self.fig.subplots(1, len(names), squeeze=False)[0]
        self.panels = []
        for i, (ax, name) in enumerate(zip(axes, names)):
            diverging = name.startswith("drift")
            cmap = matplotlib.colormaps["coolwarm" if diverging else "viridis"].with_extremes(bad="0.85")
            lo = -1.0 if diverging else 0.0
            im = ax.imshow(np.zeros((len(rows), len(cols))), aspect="auto", cmap=cmap, vmin=lo, vmax=1.0,
                           interpolation="nearest", animated=True)
            ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
            ax.set_yticks(range(len(rows)), rows if i == 0 else [""] * len(rows), fontsize=7)
            cbar = self.fig.colorbar(im, ax=ax, fraction=0.09, pad=0.03, ticks=[lo, 1.0])
            cbar.ax.set_yticklabels(["−max" if diverging else "min", "+max" if diverging else "max"], fontsize=6)
            title = ax.set_title(name + "\n", fontsize=8)
            title.set_animated(True)
            self.panels.append((ax, im, title, name, diverging))
        self.suptitle = self.fig.suptitle(f"{role}-role scale vectors γ", fontsize=10)
        self.suptitle.set_animated(True)
        self.fig.tight_layout(rect=(0, 0, 1, 0.93))
        self.canvas.draw()  # everything but the animated artists
        self.background = self.canvas.copy_from_bbox(self.fig.bbox)

    def render(self, panels: dict[str, np.ndarray], step: int) -> np.ndarray:
        self.canvas.restore_region(self.background)
        for ax, im, title, name, diverging in self.panels:
            a = panels[name]
            finite = a[np.isfinite(a)]
            if diverging:  # asinh colour scale: small drifts stay visible next to a large one
                hi = float(np.abs(finite).max()) if finite.size else 0.0
                shown = np.arcsinh(a / DRIFT_COLOUR_UNIT)
                top = float(np.arcsinh(hi / DRIFT_COLOUR_UNIT))
                im.set_data(np.ma.masked_invalid(shown / top if top > 0 else a * 0.0))
                title.set_text(f"{name}\n±{hi:.3g} (asinh colours)")
            else:
                lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
                span = hi - lo
                im.set_data(np.ma.masked_invalid((a - lo) / span if span > 0 else a * 0.0 + 0.5))
                title.set_text(f"{name}\n{lo:.4g} … {hi:.4g}")
            ax.draw_artist(im)
            ax.draw_artist(title)
        self.suptitle.set_text(f"{self.role}-role scale vectors γ — step {step}")
        self.fig.draw_artist(self.suptitle)
        return np.asarray(self.canvas.buffer_rgba())[..., :3].copy()



_HISTOGRAM: list = []  # one figure, built at the first histogram and redrawn for every other


def histogram_image(tag: str, counts: np.ndarray, edges: np.ndarray, step: int) -> np.ndarray:
    """A histogram (counts over bin edges) drawn as an RGB uint8 image ``[H, W, 3]``, for loggers that take
    pictures only (MLflow, CSV); TensorBoard and W&B draw their own from the values. One figure is built once
    and only its bars, axes limits and title change (a full layout per histogram costs ten times more)."""
    if not _HISTOGRAM:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(4.8, 2.8), dpi=80)
        canvas = FigureCanvasAgg(fig)
        ax = fig.subplots()
        bars = ax.stairs([0.0], [0.0, 1.0], fill=True, color="tab:blue")
        ax.set_xlabel("value", fontsize=7)
        ax.set_ylabel("count", fontsize=7)
        ax.tick_params(labelsize=7)
        title = ax.set_title("", fontsize=8)
        fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.88)
        _HISTOGRAM.extend([canvas, ax, bars, title])
    canvas, ax, bars, title = _HISTOGRAM
    counts, edges = np.asarray(counts, dtype=np.float64), np.asarray(edges, dtype=np.float64)
    bars.set_data(counts, edges)
    lo, hi = float(edges[0]), float(edges[-1])
    pad = (hi - lo) * 0.02 or 0.5
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(0, max(float(counts.max(initial=0.0)), 1.0) * 1.05)
    title.set_text(f"{tag} — step {step}")
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
