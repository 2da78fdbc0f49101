"""Where the monitors' figures go: to every logger the trainer has, each in that logger's own form.

The callbacks hand one log (scalars, histograms, RGB images) to ``log_to_loggers`` and never branch on the
logger's type; this module does, once:

- ``TensorBoardLogger``: ``add_scalar`` (or the logger's ``log_metrics``), ``add_histogram`` of the raw
  values, ``add_image`` (HWC);
- ``WandbLogger``: one ``log_metrics`` row per log, with ``wandb.Histogram`` and ``wandb.Image`` values
  beside the scalars (x axis ``trainer/global_step``, as Lightning logs it);
- ``MLFlowLogger``: ``log_metrics`` for the scalars, ``MlflowClient.log_image`` (key = tag, step) for images
  and for a drawing of each histogram, and the histogram's bins and counts as a JSON artifact
  ``histograms/<tag>/step_<step>.json``;
- ``CSVLogger``: scalars to ``metrics.csv`` through ``log_metrics``; the figures as PNG files in the
  logger's ``log_dir`` under ``figures/<tag>/step_<step>.png`` (a histogram also as ``step_<step>.json``);
- any other logger: the scalars through its ``log_metrics``.

Histograms for every logger but TensorBoard are binned here (``HIST_BINS`` equal bins over the finite values,
``numpy.histogram``), so W&B, MLflow and CSV hold the same counts. Drawing (matplotlib, Agg) happens only
when a logger needs a picture of a histogram.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import numpy as np

__all__ = ["HIST_BINS", "Histogram", "log_to_loggers", "takes_figures", "sink_for"]

HIST_BINS = 64


@dataclass
class Histogram:
    """``HIST_BINS`` equal bins over the finite values (``numpy.histogram``), and how many were not finite."""

    counts: np.ndarray
    edges: np.ndarray
    nonfinite: int = 0

    @classmethod
    def of(cls, values: Any) -> "Histogram":
        a = np.asarray(values, dtype=np.float64).ravel()
        finite = a[np.isfinite(a)]
        counts, edges = np.histogram(finite, bins=HIST_BINS)
        return cls(counts.astype(np.int64), edges, int(a.size - finite.size))

    def as_dict(self) -> dict:
        return {"edges": self.edges.tolist(), "counts": self.counts.tolist(), "nonfinite": self.nonfinite}


class _Log:
    """One log's histograms, binned and drawn at most once whatever the number of loggers that need them."""

    def __init__(self, step: int, histograms: Mapping[str, Any]) -> None:
        self.step, self.values = step, histograms
        self._bins: dict[str, Histogram] = {}
        self._pictures: dict[str, np.ndarray] = {}

    def binned(self, tag: str) -> Histogram:
        if tag not in self._bins:
            self._bins[tag] = Histogram.of(self.values[tag])
        return self._bins[tag]

    def picture(self, tag: str) -> np.ndarray:
        if tag not in self._pictures:
            from ._monitor_figures import histogram_image

            h = self.binned(tag)
            self._pictures[tag] = histogram_image(tag, h.counts, h.edges, self.step)
        return self._pictures[tag]


class _Sink:
    """Scalars through the logger's ``log_metrics``; no figures."""

    figures = False

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def write(self, step: int, scalars: Mapping[str, float], histograms: Mapping[str, Any],
              images: Mapping[str, np.ndarray], log: Optional[_Log] = None) -> None:
        if scalars:
            self.logger.log_metrics(dict(scalars), step)


class _TensorBoard(_Sink):
    figures = True

    def __init__(self, logger: Any, writer: Any, add_scalar: bool) -> None:
        super().__init__(logger)
        self.writer, self.add_scalar = writer, add_scalar

    def write(self, step, scalars, histograms, images, log=None) -> None:
        if self.add_scalar or self.logger is None:
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, step)
        else:
            super().write(step, scalars, histograms, images, log)
        for tag, values in histograms.items():
            self.writer.add_histogram(tag, values, global_step=step)
        for tag, image in images.items():
            self.writer.add_image(tag, image, step, dataformats="HWC")


class _Wandb(_Sink):
    figures = True

    def write(self, step, scalars, histograms, images, log=None) -> None:
        import wandb

        log = log or _Log(step, histograms)
        row: dict[str, Any] = dict(scalars)
        for tag in histograms:
            h = log.binned(tag)
            row[tag] = wandb.Histogram(np_histogram=(h.counts, h.edges))
        for tag, image in images.items():
            row[tag] = wandb.Image(image)
        if row:
            self.logger.log_metrics(row, step)


class _MLflow(_Sink):
    figures = True

    def write(self, step, scalars, histograms, images, log=None) -> None:
        log = log or _Log(step, histograms)
        super().write(step, scalars, histograms, images, log)
        client, run_id = self.logger.experiment, self.logger.run_id
        for tag in histograms:
            client.log_dict(run_id, log.binned(tag).as_dict(), f"histograms/{tag}/step_{step:08d}.json")
            client.log_image(run_id, log.picture(tag), key=tag, step=step)
        for tag, image in images.items():
            client.log_image(run_id, image, key=tag, step=step)


class _CSV(_Sink):
    figures = True

    def write(self, step, scalars, histograms, images, log=None) -> None:
        from PIL import Image

        log = log or _Log(step, histograms)
        super().write(step, scalars, histograms, images, log)
        folder = Path(self.logger.log_dir) / "figures"
        for tag in histograms:
            out = folder / tag
            out.mkdir(parents=True, exist_ok=True)
            (out / f"step_{step:08d}.json").write_text(json.dumps(log.binned(tag).as_dict()) + "\n")
            Image.fromarray(log.picture(tag)).save(out / f"step_{step:08d}.png")
        for tag, image in images.items():
            out = folder / tag
            out.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.ascontiguousarray(image)).save(out / f"step_{step:08d}.png")


def _kind(logger: Any) -> type:
    from lightning.pytorch import loggers as pl

    kinds = ((pl.TensorBoardLogger, _TensorBoard), (pl.WandbLogger, _Wandb), (pl.MLFlowLogger, _MLflow),
             (pl.CSVLogger, _CSV))
    return next((sink for cls, sink in kinds if isinstance(logger, cls)), _Sink)


def sink_for(logger: Any, tensorboard_add_scalar: bool = False) -> _Sink:
    """The writer for one Lightning logger (see the module docstring)."""
    kind = _kind(logger)
    if kind is _TensorBoard:
        return _TensorBoard(logger, logger.experiment, tensorboard_add_scalar)
    return kind(logger)


def takes_figures(loggers: Iterable[Any]) -> bool:
    """Whether any of ``loggers`` takes histograms and images (all but loggers of unknown kinds); by type
    only, so that every rank gets the same answer without touching a logger's experiment."""
    return any(_kind(logger).figures for logger in loggers)


def log_to_loggers(loggers: Iterable[Any], step: int, scalars: Optional[Mapping[str, float]] = None,
                   histograms: Optional[Mapping[str, Any]] = None, images: Optional[Mapping[str, np.ndarray]] = None,
                   tensorboard_add_scalar: bool = False, writer: Any = None) -> None:
    """Write one log to every logger: ``histograms`` tag -> raw values, ``images`` tag -> RGB uint8 ``[H, W, 3]``.
    ``tensorboard_add_scalar``: TensorBoard gets the scalars through ``add_scalar`` rather than ``log_metrics``;
    ``writer``: a bare TensorBoard ``SummaryWriter`` to write to as well (scalars through ``add_scalar``)."""
    scalars, histograms, images = scalars or {}, histograms or {}, images or {}
    sinks = [sink_for(logger, tensorboard_add_scalar) for logger in loggers]
    if writer is not None and not any(isinstance(s, _TensorBoard) and s.writer is writer for s in sinks):
        sinks.append(_TensorBoard(None, writer, True))
    log = _Log(step, histograms)
    for sink in sinks:
        sink.write(step, scalars, histograms if sink.figures else {}, images if sink.figures else {}, log)
