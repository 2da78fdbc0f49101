"""The checks of ``convert`` (``hub/convert.py``): the probe batch and its float64 logits (``Probe``; an MoE model
also with every token routed to every expert, ``every_expert``), the tolerances (``tolerance`` for the float64
transfer, ``written_tolerance`` for the model as written in its checkpoint's dtype) and what "the same strategy"
means (``resolved_strategy``: the vector's default arguments filled on both sides).

Plain torch (+ the model's classes): must not import Lightning or transformers.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch import nn

from ..model.block import Block
from ..model.moe import MoE
from ..model.spec import import_class, model_spec
from ..model.transformer import Transformer
from ..scale.strategy import ScaleStrategy

SAMPLE = (2, 64)  # the probe batch whose logits a conversion compares: 2 sequences of up to 64 random tokens


def probe_batch(model: Transformer, seed: int = 0) -> torch.Tensor:
    """The probe batch whose logits a conversion compares: ``SAMPLE`` random tokens (fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (SAMPLE[0], min(SAMPLE[1], model.config.seq_len)), generator=gen)


def tolerance(config) -> float:
    """The largest relative logits change (max |Δ| / max |logits|) that float64 rounding explains for a model of
    this size: ``ε₆₄ · (2 L + 1) · w^1.5``, a worst-case bound for L layers of two sublayers (plus the head)
    whose dot products have length up to ``w`` (the widest of n_embd, the q width and the MLP / expert width).
    Any conversion that keeps the function exactly moves the logits far less; any change of the function
    (a normalization added or removed, another eps, a scale that could not be held) far more."""
    return torch.finfo(torch.float64).eps * (2 * config.n_layer + 1) * float(widest(config)) ** 1.5


def widest(config) -> int:
    """The longest dot product of a layer: n_embd, the q width, the MLP or (shared) expert width."""
    widths = [config.n_embd, config.n_head * config.head_dim, config.intermediate_size or 0]
    if config.moe is not None:
        widths.append(config.moe.expert_intermediate_size * max(1, config.moe.num_shared_experts))
    return max(widths)


def written_tolerance(config, dtype: torch.dtype) -> float:
    """The largest relative logits change that rounding every weight once to ``dtype`` (the checkpoint's) explains:
    ``ε_dtype · (2 L + 1) · √w``. A rounded weight is off by at most ε/2 of itself, so a dot product of length
    ``w`` moves by at most ε/2 · ‖row‖·‖x‖, about ε/2 · √w of a typical output, once per map along the 2 L + 1 maps
    of a path; never below ``tolerance`` (the float64 check's)."""
    return max(tolerance(config),
               torch.finfo(dtype).eps * (2 * config.n_layer + 1) * float(widest(config)) ** 0.5)


def resolved_strategy(config, strategy: ScaleStrategy) -> dict[str, Any]:
    """The strategy as plain data with every default filled: the vector's ``init_args`` completed with the defaults
    of its class's signature (jsonargparse records them for a run; a preset file leaves them out)."""
    strat = model_spec(config, strategy, Block)["strategy"]
    vector = dict(strat["vector"])
    try:
        params = list(inspect.signature(import_class(vector["class_path"])).parameters.values())[1:]  # after dim
    except (ImportError, TypeError, ValueError):  # not importable, no signature: the recorded arguments as they are
        return strat
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return {**strat, "vector": {**vector, "init_args": {**defaults, **(vector.get("init_args") or {})}}}


def same_strategy(model: Transformer, strategy: ScaleStrategy) -> bool:
    """``strategy`` is the model's own, defaults filled on both sides (``resolved_strategy``)."""
    return resolved_strategy(model.config, model.strategy) == resolved_strategy(model.config, strategy)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-300))


@contextlib.contextmanager
def every_expert(*models: nn.Module):
    """Route every token to every routed expert of each MoE layer (top-k = E), so that a probe sees each expert's
    function, weighted by its routing score, whatever the routing would choose."""
    layers = [m for model in models for m in model.modules() if isinstance(m, MoE)]
    before = [m.top_k for m in layers]
    try:
        for m in layers:
            m.top_k = m.num_experts
        yield bool(layers)
    finally:
        for m, k in zip(layers, before):
            m.top_k = k


class Probe:
    """The probe batch ``idx`` and the float64 source's logits on it (computed once): plain, and for an MoE model also
    with every token routed to every expert (``every_expert``)."""

    def __init__(self, source: Transformer, idx: torch.Tensor) -> None:
        self.idx = idx
        with torch.no_grad():
            self.plain = source(idx)
            with every_expert(source) as moe:
                self.routed = source(idx) if moe else None

    def change(self, target: Transformer) -> float:
        """max |Δ| / max |logits| of ``target`` (float64) against the source: the larger of the two probes."""
        with torch.no_grad():
            moved = _relative(self.plain, target(self.idx))
            if self.routed is not None:
                with every_expert(target):
                    moved = max(moved, _relative(self.routed, target(self.idx)))
        return moved
