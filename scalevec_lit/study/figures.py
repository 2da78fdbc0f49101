"""The study's PNG figures (matplotlib, Agg backend, imported lazily)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from ..scale.sites import TAG_PREFIX, parse_scale_tag
from .events import read_scalars
from .spec import fmt_lr


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_val(curves: dict[str, list[list[tuple[int, float]]]], labels: dict[str, str], path: Path, title: str) -> None:
    """Validation loss per variant (mean over seeds, min-max band), full run and second half zoomed.
    ``curves``: variant -> one ``[(step, loss)]`` list per seed."""
    import numpy as np

    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    cmap = plt.get_cmap("tab10")
    for i, (name, per_seed) in enumerate(curves.items()):
        finite = [dict(c) for c in per_seed if c and all(math.isfinite(v) for _, v in c)]
        if not finite:
            continue
        steps = sorted(set.intersection(*(set(c) for c in finite)))
        if not steps:
            continue
        vals = np.array([[c[s] for s in steps] for c in finite])
        for ax, tail in zip(axes, (False, True)):
            sel = slice(len(steps) // 2, None) if tail else slice(None)
            x = np.array(steps)[sel]
            ax.plot(x, vals.mean(0)[sel], "-" if i < 10 else "--", color=cmap(i % 10), marker="o", markersize=3,
                    label=f"{labels.get(name, name)} (n={len(finite)})")
            ax.fill_between(x, vals.min(0)[sel], vals.max(0)[sel], color=cmap(i % 10), alpha=0.15)
    axes[0].set_title(f"{title}: validation loss (mean, min-max band over seeds)", fontsize=10)
    axes[1].set_title("second half of training, zoomed", fontsize=10)
    for ax in axes:
        ax.set_xlabel("optimizer step (0-based step of the evaluation)")
        ax.set_ylabel("val/loss (full validation split)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_lr_sweep(endpoints: dict[str, dict[float, dict[int, float]]], best: dict[str, Optional[float]],
                  path: Path, title: str) -> None:
    """Endpoint vs learning rate per variant: seeds as dots, the mean as a line, the best LR circled, a
    diverged run as an x at the top of the panel."""
    import numpy as np

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    cmap = plt.get_cmap("tab10")
    finite_all = [v for per_lr in endpoints.values() for seeds in per_lr.values() for v in seeds.values()
                  if math.isfinite(v)]
    top = max(finite_all) if finite_all else 1.0
    for i, (name, per_lr) in enumerate(endpoints.items()):
        lrs = sorted(per_lr)
        means = []
        for j, lr in enumerate(lrs):
            vals = list(per_lr[lr].values())
            fin = [v for v in vals if math.isfinite(v)]
            jitter = lr * (1 + 0.04 * (i - (len(endpoints) - 1) / 2))
            ax.scatter([jitter] * len(fin), fin, s=16, color=cmap(i % 10), alpha=0.6, zorder=3)
            n_div = len(vals) - len(fin)
            if n_div:
                ax.scatter([jitter], [top], marker="x", s=50, color=cmap(i % 10), zorder=4)
                ax.annotate(f"{n_div} diverged", (jitter, top), fontsize=7, color=cmap(i % 10),
                            xytext=(3, 3 + 9 * i), textcoords="offset points")
            means.append(np.mean(fin) if fin else np.nan)
        ax.plot(lrs, means, "-", color=cmap(i % 10), marker="s", markersize=4, label=name)
        if best.get(name) is not None:
            b = best[name]
            ax.scatter([b], [means[lrs.index(b)]], s=160, facecolors="none", edgecolors=cmap(i % 10), linewidths=1.5,
                       zorder=5)
    ax.set_xscale("log")
    ax.set_xticks(sorted({lr for per_lr in endpoints.values() for lr in per_lr}))
    ax.set_xticklabels([fmt_lr(x) for x in ax.get_xticks()])
    ax.set_xlabel("peak learning rate (AdamW)")
    ax.set_ylabel("endpoint (mean val loss of the last two evaluations)")
    ax.set_title(f"{title}: LR sweep (dots: seeds; squares: mean; circle: best LR)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_paired(rows: list[dict], path: Path, title: str, ci_name: str = "95% CI") -> None:
    """Per comparison: the per-pair differences (dots), their mean and its CI (``ci_name`` says which), and
    the zero line. ``rows``: ``{"label", "diffs", "mean", "ci"}``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, max(3.6, 0.55 * len(rows) + 1.4)))
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        ax.scatter(r["diffs"], [y] * len(r["diffs"]), s=18, color="tab:blue", alpha=0.7, zorder=3)
        if math.isfinite(r["mean"]):
            lo, hi = r["ci"]
            ax.plot([lo, hi], [y + 0.18, y + 0.18], color="black", linewidth=2)
            ax.scatter([r["mean"]], [y + 0.18], marker="D", color="black", s=22, zorder=4)
    ax.axvline(0, color="gray", linestyle="--", linewidth=1)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["label"] for r in reversed(rows)], fontsize=8)
    ax.set_xlabel("endpoint difference (variant − reference), same seed; > 0: variant worse", fontsize=9)
    ax.set_title(f"{title}: paired differences (dots), mean (diamond) and {ci_name}", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _site_key(tag: str) -> str:
    """A monitor tag -> ``<role>/<site>/<branch>`` (the layers of a site share a panel)."""
    t = parse_scale_tag(tag)
    return f"{t.role}/{t.site}/{t.branch}"


def _dynamics_tags(tags: list[str]) -> list[str]:
    """The mean effective γ of every vector: ``gamma/mean`` where the monitor logs it (a parameterization whose
    γ is not its one parameter), else the mean of the plain ``scale`` part."""
    parsed = {t: parse_scale_tag(t) for t in tags}
    parsed = {t: p for t, p in parsed.items() if p is not None and p.stat == "mean"}
    derived = {(p.role, p.site, p.branch, p.layer) for p in parsed.values() if p.part == "gamma"}
    return [t for t, p in parsed.items()
            if p.part == "gamma" or (p.part == "scale" and (p.role, p.site, p.branch, p.layer) not in derived)]


def plot_dynamics(roots: dict[str, list[Path]], path: Path) -> Optional[str]:
    """Mean effective γ per layer and site (mean over seeds) for the given variants (``name -> run roots``)."""
    import numpy as np

    data = {}
    for n, rs in roots.items():
        per_seed = [read_scalars(r, (TAG_PREFIX + "/",)) for r in rs]
        if not per_seed:
            continue
        tags = sorted(set.intersection(*(set(t) for t in per_seed)))
        wanted = _dynamics_tags(tags)
        series = {}
        for t in wanted:
            steps = sorted(set.intersection(*(set(dict(s[t])) for s in per_seed)))
            series[t] = (steps, np.mean([[dict(s[t])[k] for k in steps] for s in per_seed], axis=0))
        data[n] = series
    groups = sorted({_site_key(t) for s in data.values() for t in s})
    if not groups:
        return None
    plt = _plt()
    ncol = min(4, len(groups))
    nrow = math.ceil(len(groups) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, max(4.0, 3.3 * nrow)), squeeze=False)
    styles = ["-", "--", ":", "-."]
    names = list(data)
    for gi, g in enumerate(groups):
        ax = axes[gi // ncol][gi % ncol]
        for ni, n in enumerate(names):
            for t, (steps, ys) in sorted(data[n].items()):
                if _site_key(t) != g:
                    continue
                ax.plot(steps, ys, styles[ni % len(styles)], label=f"{n} {t.split('/')[4]}", linewidth=1.2)
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


def _seed_mean(per_seed: list[dict], tag: str):
    """(steps every seed logged, mean over seeds) of ``tag``, or None when some seed lacks it."""
    import numpy as np

    if not per_seed or any(tag not in s for s in per_seed):
        return None
    steps = sorted(set.intersection(*(set(dict(s[tag])) for s in per_seed)))
    return (steps, np.mean([[dict(s[tag])[k] for k in steps] for s in per_seed], axis=0)) if steps else None


#: what ``plot_sharpness`` draws, as ``SharpnessMonitor`` defines it (``callbacks/_hessian.preconditioner``)
ADAM_PRECONDITIONER = "P = (1 − β₁ᵗ) diag(√v̂ + ε), v̂ = v/(1 − β₂ᵗ)"
SHARPNESS_CAPTION = ("left, λ_max of the loss Hessian H (solid) and, for Adam/AdamW, of P^{-1/2} H P^{-1/2} with "
                     f"{ADAM_PRECONDITIONER}, t its step count (dashed; Cohen et al. 2022); right, that over the "
                     "stability threshold, (2 + 2β₁)/((1 − β₁)η) for Adam")


def plot_sharpness(roots: dict[str, list[Path]], out: Path) -> list[str]:
    """``SharpnessMonitor``'s figures (``sharpness/...``) of the given variants (``name -> run roots``), mean
    over seeds: per parameter subset, λ_max of the loss Hessian (and the preconditioned λ_max, dashed) on a
    log scale, and the ratio to the optimizer's stability threshold (1 = the edge of stability). Writes
    ``<out>/sharpness.png`` and returns the report's lines for it; nothing when no run logged sharpness."""
    data = {n: [read_scalars(r, ("sharpness/",)) for r in rs] for n, rs in roots.items() if rs}
    data = {n: s for n, s in data.items() if any(s)}
    prefixes = sorted({t[: -len("/lambda_max")] for s in data.values() for one in s for t in one
                       if t.endswith("/lambda_max") and not t.endswith("precond_lambda_max")})
    if not prefixes:
        return []
    plt = _plt()
    fig, axes = plt.subplots(len(prefixes), 2, figsize=(12, 3.6 * len(prefixes)), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for row, prefix in enumerate(prefixes):
        ax_l, ax_r = axes[row]
        plotted, ratios = [], []
        for i, (name, per_seed) in enumerate(data.items()):
            for suffix, style, label in (("lambda_max", "-", "λ_max"), ("precond_lambda_max", "--", "precond. λ_max")):
                series = _seed_mean(per_seed, f"{prefix}/{suffix}")
                if series:
                    ax_l.plot(series[0], series[1], style, color=cmap(i % 10), label=f"{name} {label}", linewidth=1.2)
                    plotted += [float(v) for v in series[1]]
            series = _seed_mean(per_seed, f"{prefix}/threshold_ratio")
            if series:
                ax_r.plot(series[0], series[1], "-", color=cmap(i % 10), label=name, marker="o", markersize=2)
                ratios += [float(v) for v in series[1]]
        sizes = [abs(v) for v in plotted if v != 0]  # eigenvalues span decades; a negative one needs symlog
        if sizes and all(v > 0 for v in plotted):
            ax_l.set_yscale("log")
        elif sizes:
            ax_l.set_yscale("symlog", linthresh=min(sizes))
        ax_l.set_title(f"{prefix}: top Hessian eigenvalue (mean over seeds)", fontsize=9)
        ax_r.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        if ratios and all(v > 0 for v in ratios):  # far below or far above 1 early in training: decades
            ax_r.set_yscale("log")
        ax_r.set_title(f"{prefix}: λ_max / stability threshold (1 = edge of stability)", fontsize=9)
        for ax in (ax_l, ax_r):
            ax.set_xlabel("optimizer step", fontsize=8)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(out) / "sharpness.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return [f"Sharpness (`SharpnessMonitor`, held-out batch) of {', '.join(data)} at their best LR: "
            f"{SHARPNESS_CAPTION}:", "", f"![sharpness]({path.name})", ""]
