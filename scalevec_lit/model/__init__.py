"""The model: plain torch (no Lightning), built from a TransformerConfig and a ScaleStrategy."""
from .attention import CausalSelfAttention
from .block import Block, ParallelBlock
from .config import SIZES, MoEConfig, TransformerConfig
from .mlp import SwiGLU
from .parallel import OneNormParallelBlock
from .transformer import ParameterCount, Transformer, count_parameters

__all__ = [
    "Block", "CausalSelfAttention", "MoEConfig", "OneNormParallelBlock", "ParallelBlock", "ParameterCount", "SIZES", "SwiGLU",
    "Transformer", "TransformerConfig", "count_parameters",
]
