"""ScaleVectorMonitor: scale-vector statistics, histograms, heatmaps and preconditioner figures, to every logger.

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

The effective step of each consumer column (``step_size``, issue 27): for an input-role γ whose consumers
are known, the merged column ``w̃_j = γ_j w_j`` (every consumer's slice j along γ's axis, as folding merges
them) moves by ``Δw̃_j`` in one optimizer step; ``.../precond/step_rel_mean`` and ``step_rel_max`` are the
mean and max over j of ``‖Δw̃_j‖ / ‖w̃_j‖`` for the step that ends at the logged step (measured: whatever
the optimizer, its clipping and its decay did), and ``lr_gamma_sq_mean`` / ``lr_gamma_sq_min`` are
``η · mean_j γ_j²`` and ``η · min_j γ_j²`` (η: the learning rate of the consumers' optimizer group, for the
next step), the step size of gradient descent on ``w̃_j`` in the directions orthogonal to ``w_j`` (the
smallest eigenvalue of ``η P_j``, ``P_j = γ_j² I + w_j w_jᵀ``: docs/PAPER.md §2). For the measured ratio
the monitor copies the consumer weights once at the step before each log (one copy of those weights,
freed at the log; none on other steps). Off by default: ``step_size: true``.

At the first optimizer step it looks at the scale parameters' gradients, and looks again at the next
``RECHECK_STEPS`` steps at those that had none (zero, or below 1e-4 of the largest scale gradient:
``invisible_scales``): a parameter can lack a gradient at the start only (γ = 1 + U·v with v = 0 at
initialisation: U gets one once v moves). Those still without one are named in one line: as an invariance
only where the strategy has one (a magnitude in front of a per-head norm, ``size_divided_out``; the fix
``model.strategy.magnitude_before_norm: false``), otherwise as parameters the loss did not depend on.

Sharded parameters (FSDP2 DTensors) are handled: statistics are computed on each rank's local shard and
combined with one ``all_gather`` of a packed (sum, sum of squares, min, max, count) tensor per process
group; column norms of consumer weights are reduced with one ``all_reduce``; the small γ vectors
themselves are gathered (``full_tensor``) for effective γ, histograms and the preconditioner figures.
Every rank computes, rank 0 writes. Tags are made by ``scalevec_lit.scale.sites.scale_tag`` (read back
with ``parse_scale_tag``).

This file holds the callback (when, what, where to write); the reductions over shards are in
``_monitor_reduce.py``, the statistics of γ (effective γ, the conserved quantity, heatmap panels) in
``_monitor_stats.py``, the drawing in ``_monitor_figures.py``.

May import Lightning, torch and (lazily) matplotlib with the Agg backend; reads the model only through
``scalevec_lit.scale`` (the registry). Must not import ``scalevec_lit.lit``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from scalevec_lit.scale.registry import ScaleParam, scale_parameters
from scalevec_lit.scale.sites import INPUT, TAG_PREFIX, Consumer, ScaleInfo, scale_tag
from scalevec_lit.scale.vector import ScaleVector

from ._log_sinks import log_to_loggers, takes_figures
from ._monitor_figures import HeatmapFigure
from ._monitor_reduce import consumer_sq_norms, full_tensor, tensor_statistics
from ._monitor_stats import (RECHECK_STEPS, STATS, column_steps, conserved_quantity, effective_gamma, heatmap_data,
                             invisible_scales, same_values, size_divided_out, snapshot_columns)

__all__ = ["ScaleVectorMonitor", "ScaleSnapshot"]


# -- which weights consume each input-role scale: the registry says ---------------------------------------
def scale_consumers(model: nn.Module) -> dict[int, list[Consumer]]:
    """``id(ScaleVector)`` → the weights that read it (``ScaleParam.consumers``), for every vector that has
    them. Vectors without (output role, a normalized u, per-expert scales) get ``min_gamma_sq`` but no drift."""
    return {id(sp.vector): list(sp.consumers) for sp in scale_parameters(model) if sp.consumers}


# -- what one log holds ---------------------------------------------------------------------------------
@dataclass
class ScaleSnapshot:
    """Everything one log writes: scalars by tag, histogram values by tag, heatmap panels by role."""

    scalars: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, np.ndarray] = field(default_factory=dict)
    heatmaps: dict[str, tuple[list[str], list[str], dict[str, np.ndarray]]] = field(default_factory=dict)


class ScaleVectorMonitor(Callback):
    """Log scale-vector statistics to the trainer's loggers (see the module docstring for the tag layout;
    ``_log_sinks`` for what each kind of logger gets).

    Args:
        every_n_steps: optimizer steps between logs (also logs once before the first step).
        histogram_every_n_steps: steps between histograms of every scale part; 0 turns them off.
        heatmap: one image per role and log (layers × sites, a panel per statistic of γ).
        preconditioner: the input-role figures ``min_gamma_sq``, ``drift_mean``, ``drift_absmax``, ``drift_rel``.
        step_size: with ``preconditioner``, also the effective step of the consumer columns: ``step_rel_mean``,
            ``step_rel_max`` (measured; a copy of the consumer weights at the step before each log) and
            ``lr_gamma_sq_mean``, ``lr_gamma_sq_min`` (off by default: the copy costs one weights' worth of
            memory at those steps).
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        histogram_every_n_steps: int = 250,
        heatmap: bool = True,
        preconditioner: bool = True,
        step_size: bool = False,
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
        self.step_size = step_size
        self._before: Optional[dict[int, Any]] = None  # γ and consumer weights one step before the next log
        self._before_step: Optional[int] = None
        self.start: dict[str, torch.Tensor] = {}  # c_j at the start of training, per input-role vector tag
        self._last_step: Optional[int] = None
        self._figures: dict[str, Any] = {}
        self._warned = False
        self._grads_checked = False
        self._grad_checks = 0  # optimizer steps whose gradients were looked at (this fit)
        self._no_grad: list[str] = []  # scale parameters without gradient at every one of them

    # -- computing -----------------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, model: nn.Module, histograms: bool = False, lrs: Optional[dict[int, float]] = None,
                before: Optional[dict[int, Any]] = None) -> ScaleSnapshot:
        """Compute one log's content. Collective under FSDP2: every rank must call it, in step. ``lrs``:
        ``id(parameter)`` → its learning rate (for ``lr_gamma_sq_*``); ``before``: ``snapshot(model)`` taken
        one optimizer step earlier (for ``step_rel_*``)."""
        snap = ScaleSnapshot()
        params: list[ScaleParam] = list(scale_parameters(model))
        stats = tensor_statistics([sp.param for sp in params])
        for sp, row in zip(params, stats.tolist()):
            for name, value in zip(STATS, row):
                snap.scalars[scale_tag(sp.info, name)] = value

        vectors: dict[int, tuple[ScaleInfo, ScaleVector, list[ScaleParam]]] = {}
        for sp in params:
            vectors.setdefault(id(sp.vector), (replace(sp.info, part=""), sp.vector, []))[2].append(sp)
        gammas = {vid: effective_gamma(vec) for vid, (_, vec, _) in vectors.items()}
        # vectors whose γ is not simply their one parameter get their own γ statistics
        derived = [vid for vid, (_, vec, parts) in vectors.items()
                   if not (len(parts) == 1 and same_values(vec, parts[0].param))]
        gstats = dict(zip(gammas, tensor_statistics(list(gammas.values())).tolist())) if gammas else {}
        for vid in derived:
            info = vectors[vid][0]
            for name, value in zip(STATS, gstats[vid]):
                snap.scalars[scale_tag(replace(info, part="gamma"), name)] = value

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
                    c = conserved_quantity(vectors[vid][1], gamma, consumers[vid], norms[vid])
                    if c is not None:
                        key = replace(info, part="precond").tag
                        start = self.start.setdefault(key, c.clone())
                        if start.shape == c.shape:
                            drift = c - start
                            figures["drift_mean"] = float(drift.mean())
                            figures["drift_absmax"] = float(drift.abs().max())
                            figures["drift_rel"] = float(drift.mean() / start.abs().mean().clamp_min(1e-12))
                if self.step_size and vid in consumers:
                    figures.update(self._step_figures(vid, gammas[vid], consumers[vid], lrs, before))
                precond[vid] = figures
                for name, value in figures.items():
                    snap.scalars[scale_tag(replace(info, part="precond"), name)] = value

        if histograms:
            for sp in params:
                snap.histograms[f"{TAG_PREFIX}/{sp.info.tag}"] = full_tensor(sp.param).detach().float().cpu().numpy()
            for vid in derived:
                info = vectors[vid][0]
                snap.histograms[f"{TAG_PREFIX}/{replace(info, part='gamma').tag}"] = gammas[vid].float().cpu().numpy()

        if self.heatmap:
            snap.heatmaps = heatmap_data(vectors, gstats, precond)
        return snap

    @staticmethod
    def _step_figures(vid: int, gamma: torch.Tensor, consumers: list[Consumer], lrs: Optional[dict[int, float]],
                      before: Optional[dict[int, Any]]) -> dict[str, float]:
        figures: dict[str, float] = {}
        lr = (lrs or {}).get(id(consumers[0].weight))
        if lr is not None:
            g2 = gamma.double().cpu().square()
            figures["lr_gamma_sq_mean"] = lr * float(g2.mean())
            figures["lr_gamma_sq_min"] = lr * float(g2.min())
        if before is not None and vid in before:
            steps = column_steps(before[vid], gamma, consumers)
            if steps is not None:
                figures["step_rel_mean"] = float(steps.mean())
                figures["step_rel_max"] = float(steps.max())
        return figures

    @torch.no_grad()
    def snapshot(self, model: nn.Module) -> dict[int, Any]:
        """γ and a copy of the consumer weights of every input-role vector with consumers (``step_rel_*``)."""
        out: dict[int, Any] = {}
        for sp in scale_parameters(model):
            if sp.info.role == INPUT and sp.consumers and id(sp.vector) not in out:
                out[id(sp.vector)] = snapshot_columns(effective_gamma(sp.vector), list(sp.consumers))
        return out

    # -- writing -------------------------------------------------------------------------------------
    def write(self, snap: ScaleSnapshot, step: int, writer: Any = None, loggers: Iterable[Any] = ()) -> None:
        """Write to every logger in its own form (``_log_sinks``: TensorBoard scalars through ``add_scalar``,
        histograms, images; W&B, MLflow, CSV; scalars only to other loggers) and to a bare TensorBoard
        ``SummaryWriter`` ``writer``."""
        loggers = list(loggers)
        images = {}
        if snap.heatmaps and (writer is not None or takes_figures(loggers)):
            images = {f"{TAG_PREFIX}/{role}/heatmap": self.render_heatmap(role, rows, cols, panels, step)
                      for role, (rows, cols, panels) in snap.heatmaps.items()}
        log_to_loggers(loggers, step, snap.scalars, snap.histograms, images, tensorboard_add_scalar=True,
                       writer=writer)

    def render_heatmap(self, role: str, rows: list[str], cols: list[str], panels: dict[str, np.ndarray], step: int) -> np.ndarray:
        """An RGB uint8 image ``[H, W, 3]``; the figure is built once per layout and only redrawn."""
        key = (role, tuple(rows), tuple(cols), tuple(panels))
        fig = self._figures.get(role)
        if fig is None or fig.key != key:
            fig = self._figures[role] = HeatmapFigure(key, role, rows, cols, list(panels))
        return fig.render(panels, step)

    def log_model(self, model: nn.Module, step: int, writer: Any = None, loggers: Iterable[Any] = (),
                  is_writer: bool = True, lrs: Optional[dict[int, float]] = None) -> ScaleSnapshot:
        """Collect (on every rank) and write (where ``is_writer``) one log at ``step``."""
        hist = self.histogram_every_n_steps > 0 and step % self.histogram_every_n_steps == 0
        before = self._before if self._before_step == step - 1 else None
        self._before = None  # freed at the log
        figures = writer is not None or takes_figures(loggers)
        snap = self.collect(model, histograms=hist and figures, lrs=lrs, before=before)
        if is_writer:
            self.write(snap, step, writer, loggers)
        return snap

    # -- hooks ---------------------------------------------------------------------------------------
    def _log(self, trainer: Any, pl_module: nn.Module) -> None:
        step = trainer.global_step
        if self._last_step == step:
            return
        self._last_step = step
        loggers = list(trainer.loggers)
        if not loggers:
            if not self._warned:
                rank_zero_warn("ScaleVectorMonitor: the trainer has no logger, nothing is logged; set trainer.logger")
                self._warned = True
            return
        lrs = {id(p): float(g["lr"]) for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]}
        self.log_model(pl_module, step, None, loggers, is_writer=trainer.is_global_zero, lrs=lrs)

    def _snapshot_before_log(self, trainer: Any, pl_module: nn.Module) -> None:
        """At the step before a log: keep what ``step_rel_*`` compares with (nothing on other steps)."""
        step = trainer.global_step
        if (self.preconditioner and self.step_size and (step + 1) % self.every_n_steps == 0
                and self._before_step != step):
            self._before, self._before_step = self.snapshot(pl_module), step

    def on_train_start(self, trainer: Any, pl_module: nn.Module) -> None:
        self._last_step = None
        self._grads_checked, self._grad_checks, self._no_grad = False, 0, []
        if trainer.global_step == 0:  # the initial values (and the drift reference); a resumed run waits
            self._log(trainer, pl_module)
        self._snapshot_before_log(trainer, pl_module)

    def on_before_optimizer_step(self, trainer: Any, pl_module: nn.Module, optimizer: Any) -> None:
        if self._grads_checked:  # the first step and RECHECK_STEPS more, once per fit
            return
        params = list(scale_parameters(pl_module))
        names = invisible_scales(params)  # collective under FSDP2: every rank at the same steps
        self._no_grad = names if self._grad_checks == 0 else [n for n in self._no_grad if n in names]
        self._grad_checks += 1
        if self._no_grad and self._grad_checks <= RECHECK_STEPS:
            return  # look again at the next step before calling them invisible
        self._grads_checked = True
        if self._no_grad and trainer.is_global_zero:
            self._warn_no_grad([sp for sp in params if sp.name in self._no_grad])

    def _warn_no_grad(self, params: list[ScaleParam]) -> None:
        def listed(group: list[ScaleParam]) -> str:
            names = [sp.name for sp in group]
            return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")

        head = (f"ScaleVectorMonitor: {{}} scale parameter(s) got no gradient at the first {self._grad_checks} "
                "optimizer steps (below 1e-4 of the largest scale gradient): ")
        divided = [sp for sp in params if size_divided_out(sp)]
        other = [sp for sp in params if not size_divided_out(sp)]
        if divided:
            rank_zero_warn(head.format(len(divided)) + f"{listed(divided)}; every branch that reads their vector "
                           "normalizes its output, which divides γ's size out (an invariance of the strategy), so "
                           "only weight decay moves them; set model.strategy.magnitude_before_norm: false or do not "
                           "decay them")
        if other:
            rank_zero_warn(head.format(len(other)) + f"{listed(other)}; the loss did not depend on them at those "
                           "steps and the strategy has no invariance that explains it: check the parameterization "
                           "(a factor that stays 0 keeps the other factors' gradients at 0)")

    def on_train_batch_end(self, trainer: Any, pl_module: nn.Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._log(trainer, pl_module)
        self._snapshot_before_log(trainer, pl_module)

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
