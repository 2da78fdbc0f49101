"""Scale vectors: parameterizations, sites, the strategy that builds them, the registry, folding.

Plain torch: nothing here imports Lightning or the model.
"""
from .fold import fold_scales, fold_scales_
from .norm_rope import group_norm_rope
from .ops import apply_rope, rms_norm, scaled_linear
from .registry import ScaleParam, scale_parameters, scale_sites
from .sites import INPUT, OUTPUT, Branch, Consumer, Factors, InputScale, NormSite, OutputNorm, ScaleInfo, ScaleSite
from .strategy import BRANCHES, PLACEMENTS, Placement, ScaleStrategy
from .vector import (
    DirectionScale,
    ExpMagnitudeDirectionScale,
    MagnitudeDirectionScale,
    NoInverse,
    NoScale,
    PlainScale,
    ScaleVector,
    UnitOffsetScale,
)

__all__ = [
    "BRANCHES", "Branch", "Consumer", "DirectionScale", "ExpMagnitudeDirectionScale", "Factors", "INPUT",
    "InputScale", "MagnitudeDirectionScale", "NoInverse", "NoScale", "NormSite", "OUTPUT", "OutputNorm", "PLACEMENTS", "Placement", "PlainScale", "ScaleInfo",
    "ScaleParam", "ScaleSite", "ScaleStrategy", "ScaleVector", "UnitOffsetScale", "apply_rope", "fold_scales",
    "fold_scales_", "group_norm_rope", "rms_norm", "scale_parameters", "scale_sites", "scaled_linear",
]
