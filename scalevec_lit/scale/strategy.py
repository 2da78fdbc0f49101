"""ScaleStrategy: one declarative object that says which parameterization and placement each site gets.

A strategy is a dataclass read from YAML (a preset file under ``recipes/strategy/`` is one strategy);
the model asks it to build every scale site. It holds no parameters itself.

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, get_args

from .vector import ScaleVector, PlainScale

PlacementName = Literal["input", "output", "dual", "dual_norm"]
OutputShape = Literal["channel", "head"]
PLACEMENTS: tuple[str, ...] = get_args(PlacementName)
OUTPUT_SHAPES: tuple[str, ...] = get_args(OutputShape)

#: Branches that a placement can name: attention (q, k, v), MLP (gate, up) and the MoE router.
BRANCHES: tuple[str, ...] = ("q", "k", "v", "gate", "up", "router")


@dataclass(frozen=True)
class Placement:
    """Where the scales sit around each projection that reads a normalized input.

    - ``input``: ``y = W(v ⊙ x̂)`` (today's standard Pre-Norm);
    - ``output``: ``y = u ⊙ W x̂``;
    - ``dual`` (DP): ``y = u ⊙ W(v ⊙ x̂)``;
    - ``dual_norm`` (DNP): ``y = u ⊙ RMSNorm_group(W(v ⊙ x̂))``, the RMS taken per attention head for
      q/k/v and over the whole output otherwise. On q and k this is QK-norm with a learned scale.
    """

    q: PlacementName = "input"
    k: PlacementName = "input"
    v: PlacementName = "input"
    gate: PlacementName = "input"
    up: PlacementName = "input"
    router: PlacementName = "input"

    def __post_init__(self) -> None:
        for branch in BRANCHES:
            value = getattr(self, branch)
            if value not in PLACEMENTS:
                raise ValueError(
                    f"model.strategy.placement.{branch}: {value!r} is not one of {', '.join(PLACEMENTS)}"
                )

    def of(self, branch: str) -> str:
        """The placement of ``branch`` (one of ``BRANCHES``): ``input``, ``output``, ``dual`` or ``dual_norm``."""
        return getattr(self, branch)


def has_input_side(placement: str) -> bool:
    return placement in ("input", "dual", "dual_norm")


def has_output_side(placement: str) -> bool:
    return placement in ("output", "dual", "dual_norm")


#: the placement whose output side normalizes (DNP); named for messages outside ``scale/``
NORMALIZED_PLACEMENT = "dual_norm"


def normalizes(placement: str) -> bool:
    """The placement normalizes the projection's output (per head for q/k/v) before its output scale."""
    return placement == NORMALIZED_PLACEMENT


@dataclass(frozen=True)
class ScaleStrategy:
    """Every scale-vector choice of a model, in one place.

    Args:
        vector: the parameterization of every scale vector, a ``ScaleVector`` subclass (called with the
            vector's dimension). In YAML: ``vector: {class_path: scalevec_lit.scale.MagnitudeDirectionScale}``.
        branch_specific: HG. One normalization per norm site, computed once, and one scale per consumer
            branch (q, k, v; gate, up; router) instead of one shared scale.
        placement: input / output / dual / dual_norm per projection (see ``Placement``).
        output_shape: shape of an output-side scale on q/k/v: ``channel`` (one per output channel) or
            ``head`` (one per head dimension, shared across heads, as Qwen3's QK-norm weight).
        sublayer_output_norm: a norm with an (output-role) scale on each sublayer's output before the
            residual add (Gemma 2/3, OLMo 2 style).
        final_norm: keep the final norm's scale (the final RMS normalization itself always runs).
        eps: epsilon of every RMS normalization.
        magnitude_before_norm: give an input-side scale whose every consumer normalizes its output
            (``dual_norm`` on all the branches that read it: q and k of ``unified`` with HG) the
            parameterization's separate magnitude. The function sees γ's size there only through the
            norm's ε (the per-head RMS divides the size out of a / √(mean a² + ε) up to ε: scaling γ by c moves
            each head's output by less than ε (1 − 1/c²) / (2 mean a²) relative, a few 1e-6): the magnitude would
            get a gradient about 1e-6 of the other scales' and decay would shrink it toward 0 nearly
            unopposed. ``false`` (the ``unified*`` presets): such a scale is its direction only
            (``ScaleVector.without_magnitude``; no change for parameterizations without a magnitude).
            Default ``true``: models, specs and checkpoints written before the option keep their parameters.
    """

    vector: Callable[[int], ScaleVector] = PlainScale
    branch_specific: bool = False
    placement: Placement = field(default_factory=Placement)
    output_shape: OutputShape = "channel"
    sublayer_output_norm: bool = False
    final_norm: bool = True
    eps: float = 1e-6
    magnitude_before_norm: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.placement, dict):  # frozen: a strategy is a value (safe as a shared default)
            object.__setattr__(self, "placement", Placement(**self.placement))
        if self.output_shape not in OUTPUT_SHAPES:
            raise ValueError(
                f"model.strategy.output_shape: {self.output_shape!r} is not one of {', '.join(OUTPUT_SHAPES)}"
            )
        if not callable(self.vector):
            raise TypeError(
                f"model.strategy.vector: {self.vector!r} is not a ScaleVector class; give a class_path such "
                "as scalevec_lit.scale.PlainScale"
            )

    def make_vector(self, dim: int, before_norm: bool = False) -> ScaleVector:
        """A new scale vector of ``dim``; ``before_norm``: an input-side scale whose every consumer
        normalizes its output (see ``magnitude_before_norm``)."""
        vec = self.vector(dim)
        if not isinstance(vec, ScaleVector):
            raise TypeError(
                f"model.strategy.vector: {self.vector!r} built a {type(vec).__name__}, not a ScaleVector; "
                "subclass scalevec_lit.scale.ScaleVector"
            )
        if before_norm and not self.magnitude_before_norm:
            alt = vec.without_magnitude()
            vec = vec if alt is None else alt
        return vec
