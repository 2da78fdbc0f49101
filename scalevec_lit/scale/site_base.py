"""The base of every scale site (``ScaleSite``: what the registry, fold, convert and the monitor read a site
through) and the simplest site, ``OutputNorm``. ``sites.py`` holds ``NormSite`` and re-exports both.
Plain torch only."""
from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch import nn

from .branch import Consumer
from .ops import rms_norm
from .strategy import ScaleStrategy
from .tags import OUTPUT, ScaleInfo
from .vector import ScaleVector

__all__ = ["OutputNorm", "ScaleSite"]


class ScaleSite(nn.Module):
    """Base of every module that owns scale vectors: ``scale_vectors()`` and ``consumers(vector)``.

    The registry (``scale_parameters``) finds a model's vectors only through these: a subclass implements
    ``scale_vectors`` and overrides ``consumers``, ``divides_size_out`` and ``fold_`` where they apply. ``convert``
    needs ``convert_from_(source) -> list[str]`` of any other site than ``NormSite`` and ``OutputNorm``."""

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:  # pragma: no cover - abstract
        """Every scale vector this site owns, once each, as ``(ScaleInfo(layer, site, branch, role), vector)``;
        ``part`` stays '' (the registry adds one entry per ``vector.parts()``). The role is the site's to say:
        ``input`` when a linear map absorbs the vector exactly, else ``output``. A subclass must implement it."""
        raise NotImplementedError

    def consumers(self, vector: ScaleVector) -> Optional[list[Consumer]]:
        """The weights that read ``vector`` (``None``: none that a law about them could use)."""
        return None

    def divides_size_out(self, vector: ScaleVector) -> bool:
        """True when every consumer of ``vector`` (one of this site's) normalizes its output, so that the loss sees
        γ's size only through that norm's ε (``ScaleStrategy.magnitude_before_norm``); the monitor then names a
        magnitude part without gradient as that invariance. Default False (a site without such consumers);
        ``NormSite`` answers from its placement (``scale/keeps.py``)."""
        return False

    @torch.no_grad()
    def fold_(self) -> None:
        """Fold every input-role scale into its consumers (default: a site with none)."""


class OutputNorm(ScaleSite):
    """``γ ⊙ x / RMS(x)`` on a sublayer's output, before the residual add: output role."""

    def __init__(self, dim: int, strategy: ScaleStrategy, *, layer: int, site: str) -> None:
        super().__init__()
        self.layer, self.site, self.eps = layer, site, strategy.eps
        self.scale = strategy.make_vector(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps) if self.scale.is_identity else rms_norm(x, self.eps, self.scale())

    @torch.no_grad()
    def init_weights(self) -> None:
        """Reset the scale vector through its ``reset_parameters`` (``Transformer.reset_parameters`` calls it)."""
        if hasattr(self.scale, "reset_parameters"):
            self.scale.reset_parameters()

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        """Its one vector: branch ``out``, role ``output`` (the residual add reads it; no linear map absorbs it)."""
        yield ScaleInfo(self.layer, self.site, "out", OUTPUT), self.scale
