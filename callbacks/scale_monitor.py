"""ScaleVectorMonitor: scale-vector statistics, histograms, heatmaps and preconditioner figures in TensorBoard.

Every ``every_n_steps`` optimizer steps (and once before the first step) the monitor logs, for each
registered scale parameter, ``scale/<role>/<site>/<branch>/<layer>/<part>/<stat>`` with stat in mean, std
(population), min, max; for each vector whose γ is not simply its one parameter (magnitude-direction,
unit offset) the same statistics of the effective γ under ``.../gamma/<stat>``; for input-role vectors the
paper's preconditioner figures under ``.../precond/``: ``min_gamma_sq`` (min_j γ_j², the bound on
λ_min(P_j)) and, where the registry names the weights that consume γ (``ScaleParam.consumers``), the drift
of the parameterization's conserved quantity ``c`` (``ScaleVector.conserved``: ``‖w_j‖² − γ_j²`` per
channel for a plain γ, one number ``Σ_j ‖w_j‖² − β²`` for a magnitude-direction γ; none for others) from
its value at the start of training (c is conserved under pure gradient flow): ``drift_mean`` =
mean (c − c⁰), ``drift_absmax`` = max |c − c⁰|, ``drift_rel`` = drift_mean / mean |c⁰|. Every ``histogram_every_n_steps`` it adds histograms of each part, and
at every log one image per role, ``scale/<role>/heatmap``: layers × sites for each statistic of γ.

Sharded parameters (FSDP2 DTensors) are handled: statistics are computed on each rank's local shard and
combined with one ``all_gather`` of a packed (sum, sum of squares, min, max, count) tensor per process
group; column norms of consumer weights are reduced with one ``all_reduce``; the small γ vectors
themselves are gathered (``full_tensor``) for effective γ, histograms and the preconditioner figures.
Every rank computes, rank 0 writes.

May import Lightning, torch and (lazily) matplotlib with the Agg backend; reads the model only through
``scalevec_lit.scale`` (the registry). Must not import ``scalevec_lit.lit``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from scalevec_lit.scale.registry import ScaleParam, scale_parameters
from scalevec_lit.scale.sites import INPUT, Consumer, ScaleInfo
from scalevec_lit.scale.vector import ScaleVector

STATS = ("mean", "std", "min", "max")
DRIFT_COLOUR_UNIT = 0.01  # the heatmap's drift colours are linear below this, logarithmic above


# -- which weights consume each input-role scale: the registry says ---------------------------------------
def scale_consumers(model: nn.Module) -> dict[int, list[Consumer]]:
    """``id(ScaleVector)`` → the weights that read it (``ScaleParam.consumers``), for every vector that has
    them. Vectors without (output role, a normalized u, per-expert scales) get ``min_gamma_sq`` but no drift."""
    return {id(sp.vector): list(sp.consumers) for sp in scale_parameters(model) if sp.consumers}


# -- reductions that work on plain tensors and on FSDP2 DTensors --------------------------------------------
def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def _shard_group(t: torch.Tensor) -> Any:
    """The process group over which ``t``'s elements are split, ``None`` when ``t`` is whole on this rank,
    or ``"full"`` when its layout needs a gather (more than one sharded mesh dimension)."""
    if not _is_dtensor(t):
        return None
    dims = [i for i, p in enumerate(t.placements) if p.is_shard()]
    if not dims:
        return None
    if len(dims) > 1:
        return "full"
    return t.device_mesh.get_group(dims[0])


def tensor_statistics(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``[n, 4]`` float64 on CPU: mean, std (population), min, max of each tensor, over all its shards."""
    import torch.distributed as dist

    if not tensors:
        return torch.zeros(0, 4, dtype=torch.float64)
    rows = []
    groups: dict[Any, list[int]] = {}
    for i, t in enumerate(tensors):
        group = _shard_group(t)
        if group == "full":
            x = t.full_tensor()
        else:
            x = t.to_local() if _is_dtensor(t) else t
            if group is not None:
                groups.setdefault(group, []).append(i)
        x = x.detach().reshape(-1).double()
        if x.numel():
            rows.append(torch.stack([x.sum(), x.square().sum(), x.min(), x.max(), x.new_tensor(float(x.numel()))]))
        else:
            rows.append(x.new_tensor([0.0, 0.0, math.inf, -math.inf, 0.0]))
    packed = torch.stack(rows)
    for group, idx in groups.items():  # one collective per process group: (sum, sumsq, min, max, count)
        part = packed[idx].contiguous()
        world = dist.get_world_size(group)
        out = part.new_empty((world * len(idx), 5))
        dist.all_gather_into_tensor(out, part, group=group)
        out = out.view(world, len(idx), 5)
        packed[idx] = torch.stack(
            [out[..., 0].sum(0), out[..., 1].sum(0), out[..., 2].amin(0), out[..., 3].amax(0), out[..., 4].sum(0)], -1
        )
    packed = packed.cpu()
    count = packed[:, 4].clamp_min(1)
    mean = packed[:, 0] / count
    std = (packed[:, 1] / count - mean.square()).clamp_min(0).sqrt()
    return torch.stack([mean, std, packed[:, 2], packed[:, 3]], -1)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if _is_dtensor(t) else t


@torch.no_grad()
def effective_gamma(vector: ScaleVector) -> torch.Tensor:
    """The full effective γ of a parameterization (gathering sharded parameters first)."""
    named = dict(vector.named_parameters())
    if not any(_is_dtensor(p) for p in named.values()):
        return vector().detach()
    full = {n: full_tensor(p).detach() for n, p in named.items()}
    return torch.func.functional_call(vector, full, ()).detach()


def _sq_along(w: torch.Tensor, axis: int) -> torch.Tensor:
    """Squared norms of the slices of ``w`` along ``axis`` (summed over every other dimension), float64."""
    axis = axis % w.ndim
    return w.detach().double().square().sum(dim=[d for d in range(w.ndim) if d != axis])


@torch.no_grad()
def consumer_sq_norms(consumers: Iterable[list[Consumer]]) -> list[list[torch.Tensor]]:
    """For each list of consumers, the full squared norms of the columns (axis -1) or rows (axis -2) paired
    with γ, float64. Column sums of row-sharded weights are reduced with one ``all_reduce`` per group."""
    import torch.distributed as dist

    result: list[list[Optional[torch.Tensor]]] = []
    pending: dict[Any, list[tuple[int, int, torch.Tensor]]] = {}
    for i, cons in enumerate(consumers):
        result.append([])
        for j, c in enumerate(cons):
            w = c.weight
            if not _is_dtensor(w):
                result[i].append(_sq_along(w, c.axis))
                continue
            group = _shard_group(w)
            axis = c.axis % w.ndim
            if group is None:  # replicated DTensor: the local tensor is the whole weight
                result[i].append(_sq_along(w.to_local(), axis))
            elif axis == w.ndim - 1 and group != "full" and w.placements[_shard_dim(w)].dim == 0:
                local = _sq_along(w.to_local(), axis)  # partial column sums of this rank's rows
                pending.setdefault(group, []).append((i, j, local))
                result[i].append(None)
            else:  # any other layout: let DTensor reduce it
                dims = [d for d in range(w.ndim) if d != axis]
                result[i].append(full_tensor(w.detach().square().sum(dim=dims)).double())
    for group, items in pending.items():
        flat = torch.cat([t for _, _, t in items])
        dist.all_reduce(flat, group=group)
        for (i, j, _), t in zip(items, flat.split([t.numel() for _, _, t in items])):
            result[i][j] = t
    return result  # type: ignore[return-value]


def _shard_dim(t: torch.Tensor) -> int:
    return next(i for i, p in enumerate(t.placements) if p.is_shard())


# -- what one log holds ---------------------------------------------------------------------------------
@dataclass
class ScaleSnapshot:
    """Everything one log writes: scalars by tag, histogram values by tag, heatmap panels by role."""

    scalars: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, np.ndarray] = field(default_factory=dict)
    heatmaps: dict[str, tuple[list[str], list[str], dict[str, np.ndarray]]] = field(default_factory=dict)


def _layer_label(layer: int) -> str:
    return "final" if layer < 0 else f"layer{layer:02d}"


class ScaleVectorMonitor(Callback):
    """Log scale-vector statistics to TensorBoard (see the module docstring for the tag layout).

    Args:
        every_n_steps: optimizer steps between logs (also logs once before the first step).
        histogram_every_n_steps: steps between histograms of every scale part; 0 turns them off.
        heatmap: one image per role and log (layers × sites, a panel per statistic of γ).
        preconditioner: the input-role figures ``min_gamma_sq``, ``drift_mean``, ``drift_absmax``, ``drift_rel``.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        histogram_every_n_steps: int = 250,
        heatmap: bool = True,
        preconditioner: bool = True,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"ScaleVectorMonitor.every_n_steps: {every_n_steps} must be >= 1")
        if histogram_every_n_steps < 0:
            raise ValueError(
                f"ScaleVectorMonitor.histogram_every_n_steps: {histogram_every_n_steps} must be >= 0 (0 = off)"
            )
        self.every_n_steps = int(every_n_steps)
        self.histogram_every_n_steps = int(histogram_every_n_steps)
        self.heatmap = heatmap
        self.preconditioner = preconditioner
        self.start: dict[str, torch.Tensor] = {}  # c_j at the start of training, per input-role vector tag
        self._last_step: Optional[int] = None
        self._figures: dict[str, Any] = {}
        self._warned = False

    # -- computing -----------------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, model: nn.Module, histograms: bool = False) -> ScaleSnapshot:
        """Compute one log's content. Collective under FSDP2: every rank must call it, in step."""
        snap = ScaleSnapshot()
        params: list[ScaleParam] = list(scale_parameters(model))
        stats = tensor_statistics([sp.param for sp in params])
        for sp, row in zip(params, stats.tolist()):
            for name, value in zip(STATS, row):
                snap.scalars[f"scale/{sp.info.tag}/{name}"] = value

        vectors: dict[int, tuple[ScaleInfo, ScaleVector, list[ScaleParam]]] = {}
        for sp in params:
            vectors.setdefault(id(sp.vector), (replace(sp.info, part=""), sp.vector, []))[2].append(sp)
        gammas = {vid: effective_gamma(vec) for vid, (_, vec, _) in vectors.items()}
        # vectors whose γ is not simply their one parameter get their own γ statistics
        derived = [vid for vid, (_, vec, parts) in vectors.items()
                   if not (len(parts) == 1 and _same_values(vec, parts[0].param))]
        gstats = dict(zip(gammas, tensor_statistics(list(gammas.values())).tolist())) if gammas else {}
        for vid in derived:
            info = vectors[vid][0]
            for name, value in zip(STATS, gstats[vid]):
                snap.scalars[f"scale/{replace(info, part='gamma').tag}/{name}"] = value

        precond: dict[int, dict[str, float]] = {}
        if self.preconditioner:
            consumers = scale_consumers(model)
            inputs = [vid for vid, (info, _, _) in vectors.items() if info.role == INPUT]
            known = [vid for vid in inputs if vid in consumers]
            norms = dict(zip(known, consumer_sq_norms([consumers[vid] for vid in known])))
            for vid in inputs:
                info = vectors[vid][0]
                gamma = gammas[vid].double().cpu()
                figures = {"min_gamma_sq": float(gamma.square().min())}
                if vid in norms:
                    c = self._conserved(vectors[vid][1], gamma, consumers[vid], norms[vid])
                    if c is not None:
                        key = replace(info, part="precond").tag
                        start = self.start.setdefault(key, c.clone())
                        if start.shape == c.shape:
                            drift = c - start
                            figures["drift_mean"] = float(drift.mean())
                            figures["drift_absmax"] = float(drift.abs().max())
                            figures["drift_rel"] = float(drift.mean() / start.abs().mean().clamp_min(1e-12))
                precond[vid] = figures
                for name, value in figures.items():
                    snap.scalars[f"scale/{replace(info, part='precond').tag}/{name}"] = value

        if histograms:
            for sp in params:
                snap.histograms[f"scale/{sp.info.tag}"] = full_tensor(sp.param).detach().float().cpu().numpy()
            for vid in derived:
                info = vectors[vid][0]
                snap.histograms[f"scale/{replace(info, part='gamma').tag}"] = gammas[vid].float().cpu().numpy()

        if self.heatmap:
            snap.heatmaps = self._heatmap_data(vectors, gstats, precond)
        return snap

    @staticmethod
    def _conserved(vector: ScaleVector, gamma: torch.Tensor, consumers: list[Consumer],
                   norms: list[torch.Tensor]) -> Optional[torch.Tensor]:
        """The parameterization's conserved quantity (``ScaleVector.conserved``) from ``Σ_consumers ‖w_j‖²``;
        rows shared by a head-shaped γ are summed; None on a shape mismatch or without such a quantity."""
        total = torch.zeros_like(gamma)
        for c, n in zip(consumers, norms):
            n = n.cpu()
            if n.numel() != gamma.numel():
                if c.axis % c.weight.ndim == c.weight.ndim - 1 or n.numel() % gamma.numel():
                    return None
                n = n.view(-1, gamma.numel()).sum(0)
            total += n
        parts = {name: full_tensor(p).detach().double().cpu() for name, p in vector.parts().items()}
        return vector.conserved(total, gamma, parts)

    @staticmethod
    def _heatmap_data(vectors, gstats, precond) -> dict[str, tuple[list[str], list[str], dict[str, np.ndarray]]]:
        out = {}
        for role in sorted({info.role for info, _, _ in vectors.values()}):
            items = [(vid, info) for vid, (info, _, _) in vectors.items() if info.role == role]
            layers = sorted({info.layer for _, info in items}, key=lambda l: (l < 0, l))
            rows = [_layer_label(l) for l in layers]
            cols: list[str] = []
            for _, info in items:
                col = f"{info.site}/{info.branch}"
                if col not in cols:
                    cols.append(col)
            names = list(STATS) + (["min γ²", "drift of ‖w‖²−γ², relative"] if role == INPUT and precond else [])
            panels = {n: np.full((len(rows), len(cols)), np.nan) for n in names}
            for vid, info in items:
                r, c = layers.index(info.layer), cols.index(f"{info.site}/{info.branch}")
                for n, v in zip(STATS, gstats[vid]):
                    panels[n][r, c] = v
                if vid in precond and len(names) > 4:
                    panels[names[4]][r, c] = precond[vid]["min_gamma_sq"]
                    panels[names[5]][r, c] = precond[vid].get("drift_rel", np.nan)
            out[role] = (rows, cols, panels)
        return out

    # -- writing -------------------------------------------------------------------------------------
    def write(self, snap: ScaleSnapshot, step: int, writer: Any = None, loggers: Iterable[Any] = ()) -> None:
        """Write to a TensorBoard ``SummaryWriter`` (scalars, histograms, images), else ``log_metrics`` scalars."""
        if writer is None:
            for logger in loggers:
                logger.log_metrics(snap.scalars, step)
            return
        for tag, value in snap.scalars.items():
            writer.add_scalar(tag, value, step)
        for tag, values in snap.histograms.items():
            writer.add_histogram(tag, values, step)
        for role, (rows, cols, panels) in snap.heatmaps.items():
            writer.add_image(f"scale/{role}/heatmap", self.render_heatmap(role, rows, cols, panels, step), step,
                             dataformats="HWC")

    def render_heatmap(self, role: str, rows: list[str], cols: list[str], panels: dict[str, np.ndarray], step: int) -> np.ndarray:
        """An RGB uint8 image ``[H, W, 3]``; the figure is built once per layout and only redrawn."""
        key = (role, tuple(rows), tuple(cols), tuple(panels))
        fig = self._figures.get(role)
        if fig is None or fig.key != key:
            fig = self._figures[role] = _HeatmapFigure(key, role, rows, cols, list(panels))
        return fig.render(panels, step)

    def log_model(self, model: nn.Module, step: int, writer: Any = None, loggers: Iterable[Any] = (),
                  is_writer: bool = True) -> ScaleSnapshot:
        """Collect (on every rank) and write (where ``is_writer``) one log at ``step``."""
        hist = self.histogram_every_n_steps > 0 and step % self.histogram_every_n_steps == 0
        snap = self.collect(model, histograms=hist and (writer is not None))
        if is_writer:
            self.write(snap, step, writer, loggers)
        return snap

    # -- hooks ---------------------------------------------------------------------------------------
    def _log(self, trainer: Any, pl_module: nn.Module) -> None:
        step = trainer.global_step
        if self._last_step == step:
            return
        self._last_step = step
        from lightning.pytorch.loggers import TensorBoardLogger

        writer = None
        loggers = list(trainer.loggers)
        for logger in loggers:
            if isinstance(logger, TensorBoardLogger):
                writer = logger.experiment
        if not loggers:
            if not self._warned:
                rank_zero_warn("ScaleVectorMonitor: the trainer has no logger, nothing is logged; set trainer.logger")
                self._warned = True
            return
        self.log_model(pl_module, step, writer, loggers, is_writer=trainer.is_global_zero)

    def on_train_start(self, trainer: Any, pl_module: nn.Module) -> None:
        self._last_step = None
        if trainer.global_step == 0:  # the initial values (and the drift reference); a resumed run waits
            self._log(trainer, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: nn.Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._log(trainer, pl_module)

    @property
    def state_key(self) -> str:
        """Unique per configuration, so that several monitors can sit in one trainer and be checkpointed."""
        return self._generate_state_key(
            every_n_steps=self.every_n_steps, histogram_every_n_steps=self.histogram_every_n_steps,
            heatmap=self.heatmap, preconditioner=self.preconditioner,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"start": {k: v.clone() for k, v in self.start.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.start = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in state_dict.get("start", {}).items()}


def _same_values(vector: ScaleVector, param: torch.Tensor) -> bool:
    """True when γ is the parameter itself (``PlainScale``): its statistics are already logged."""
    try:
        return vector() is param
    except Exception:  # a parameterization that cannot run on sharded parameters: treat γ as derived
        return False


class _HeatmapFigure:
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
