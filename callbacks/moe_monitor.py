"""MoELoadMonitor: per-layer expert load, router entropy and balancing losses, to every logger (``_log_sinks``).

Reads only the public surface of MoE layers: every module with a non-empty ``last_load_stats`` dict and a
``layer`` index (``scalevec_lit.model.moe.MoE`` sets both after each forward). Figures are those of the
last training micro-batch of the logged step, averaged over data-parallel ranks (each rank sees the
same number of tokens, so the mean of the ranks' fractions is the global fraction), and the load
figures are computed from that global fraction.

The layers compute these figures on the device at every forward; this callback reads them (one packed
copy to the host, after one all-reduce) on logging steps only, and touches nothing on the other steps:
the training step itself never waits for the device.

Must not import the model (it reads attributes only) and must not change the model.
"""
from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from ._log_sinks import log_to_loggers

__all__ = ["MoELoadMonitor"]

#: Scalars of ``last_load_stats`` reduced as means over ranks (besides the per-expert ``fraction``).
_MEAN_STATS = ("router_entropy", "router_entropy_norm", "aux_loss", "z_loss")


class MoELoadMonitor(Callback):
    """Log, for every MoE layer, every ``every_n_steps`` optimizer steps (and at step 1):

    - ``moe/layerXX/load_max_over_mean``: the busiest expert's share over the mean share (1 = balanced,
      E/k = every token sends all its k slots to the same k experts);
    - ``moe/layerXX/load_min_over_mean`` and ``moe/layerXX/unused_experts`` (experts that got no token);
    - ``moe/layerXX/router_entropy`` (nats per token; ln E = uniform routing) and ``router_entropy_norm``
      (divided by ln E, in [0, 1]);
    - ``moe/layerXX/aux_loss``: the Switch balance loss ``E Σ f_i P_i`` *without* its coefficient (1 at a
      uniform load), logged even when ``aux_loss_coef`` is 0; ``moe/layerXX/z_loss``: mean logsumexp²,
      also without coefficient;
    - ``moe/layerXX/bias_spread``: max − min of the balancing bias (with ``bias_balancing``);
    - ``moe_fraction/layerXX/expertYY``: each expert's share of the assignments (uniform = 1/E), when
      ``per_expert``; a histogram of the shares per layer, ``moe/layerXX/fraction``, when ``histograms`` (to every
      logger in its own form: ``_log_sinks``);
    - ``moe/all/load_max_over_mean`` (worst layer) and ``moe/all/router_entropy_norm`` (mean of layers).

    The weighted losses that enter the training loss are logged by the module as ``train/moe_aux_loss``
    and ``train/moe_z_loss`` (sums over layers).
    """

    def __init__(self, every_n_steps: int = 50, per_expert: bool = True, histograms: bool = False) -> None:
        if every_n_steps < 1:
            raise ValueError(f"MoELoadMonitor.every_n_steps: {every_n_steps} must be at least 1")
        self.every_n_steps = int(every_n_steps)
        self.per_expert = per_expert
        self.histograms = histograms
        self._last_step = -1

    @staticmethod
    def layer_stats(module: torch.nn.Module) -> list[tuple[int, dict[str, torch.Tensor]]]:
        """``(layer, last_load_stats)`` of every MoE layer of ``module``, in layer order."""
        found = []
        for m in module.modules():
            stats = getattr(m, "last_load_stats", None)
            if stats:
                found.append((int(getattr(m, "layer", len(found))), stats))
        return sorted(found, key=lambda t: t[0])

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last_step or not (step == 1 or step % self.every_n_steps == 0):
            return
        self._last_step = step
        layers = self.layer_stats(pl_module)
        if not layers:
            return
        metrics, fractions = self.compute_metrics(layers, trainer.strategy.reduce)
        if not trainer.is_global_zero:
            return
        histograms = ({f"moe/layer{layer:02d}/fraction": frac for layer, frac in fractions.items()}
                      if self.histograms else {})
        log_to_loggers(trainer.loggers, step, metrics, histograms)

    def compute_metrics(self, layers, reduce=None) -> tuple[dict[str, float], dict[int, torch.Tensor]]:
        """Metrics dict and per-layer global fractions from ``layer_stats`` (``reduce``: mean over ranks)."""
        packed = torch.cat(
            [torch.cat([s["fraction"].float().flatten(), torch.stack([s[k].float() for k in _MEAN_STATS])])
             for _, s in layers]
        )
        if reduce is not None:
            packed = reduce(packed, reduce_op="mean")
        packed = packed.detach().cpu()
        metrics: dict[str, float] = {}
        fractions: dict[int, torch.Tensor] = {}
        offset, worst, entropies = 0, 0.0, []
        for layer, s in layers:
            e = s["fraction"].numel()
            frac = packed[offset : offset + e]
            scalars = dict(zip(_MEAN_STATS, packed[offset + e : offset + e + len(_MEAN_STATS)].tolist()))
            offset += e + len(_MEAN_STATS)
            fractions[layer] = frac
            tag = f"moe/layer{layer:02d}"
            mean = frac.mean().clamp_min(1e-20)
            max_over_mean = float(frac.max() / mean)
            metrics[f"{tag}/load_max_over_mean"] = max_over_mean
            metrics[f"{tag}/load_min_over_mean"] = float(frac.min() / mean)
            metrics[f"{tag}/unused_experts"] = float((frac == 0).sum())
            for key, value in scalars.items():
                metrics[f"{tag}/{key}"] = value
            if "bias_spread" in s:
                metrics[f"{tag}/bias_spread"] = float(s["bias_spread"])
            if self.per_expert:
                for i, value in enumerate(frac.tolist()):
                    metrics[f"moe_fraction/layer{layer:02d}/expert{i:02d}"] = value
            worst = max(worst, max_over_mean)
            entropies.append(scalars["router_entropy_norm"])
        metrics["moe/all/load_max_over_mean"] = worst
        metrics["moe/all/router_entropy_norm"] = sum(entropies) / len(entropies)
        return metrics, fractions
