"""Scale vectors: parameterizations, sites, the strategy that builds them, the registry, folding.

Plain torch: nothing here imports Lightning or the model.
"""
from .fold import fold_scales, fold_scales_
from .registry import ScaleParam, scale_parameters, scale_vectors
from .sites import INPUT, OUTPUT, BranchScales, DualScaledLinear, OutputNorm, ScaleInfo, ScaleSite, rms_norm
from .strategy import BRANCHES, PLACEMENTS, Placement, ScaleStrategy
from .vector import (
    ExpMagnitudeDirectionScale,
    MagnitudeDirectionScale,
    NoScale,
    PlainScale,
    ScaleVector,
    UnitOffsetScale,
)

__all__ = [
    "BRANCHES", "BranchScales", "DualScaledLinear", "ExpMagnitudeDirectionScale", "INPUT",
    "MagnitudeDirectionScale", "NoScale", "OUTPUT", "OutputNorm", "PLACEMENTS", "Placement", "PlainScale",
    "ScaleInfo", "ScaleParam", "ScaleSite", "ScaleStrategy", "ScaleVector", "UnitOffsetScale", "fold_scales",
    "fold_scales_", "rms_norm", "scale_parameters", "scale_vectors",
]
