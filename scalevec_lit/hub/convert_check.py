"""The checks of ``convert`` (``hub/convert.py``): the probe batch and its float64 logits (``Probe``; an MoE model
also with every token routed to every expert, each weighted equally: ``every_expert``), the tolerances
(``tolerance`` for the float64 transfer, ``written_tolerance`` for the model as written in its checkpoint's dtype,
measured on the model: every parameter moved by the dtype's ε) and what "the same strategy"
means (``resolved_strategy``: the vector's default arguments filled on both sides).

Plain torch (+ the model's classes): must not import Lightning or transformers.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
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


def written_tolerance(source: Transformer, probe: "Probe", dtype: torch.dtype, seed: int = 0) -> float:
    """The largest relative logits change that writing a converted model in ``dtype`` (the checkpoint's) explains,
    measured on the model itself: the change of the float64 ``source`` with every parameter moved by ε of itself
    (ε = ``finfo(dtype).eps``, each entry's sign drawn with ``seed``), on ``probe``'s batch. Writing rounds each
    entry of a written tensor by at most ε/2 of itself, and an entry that the model uses as a product of two
    written tensors (a γ folded into a weight) by at most about ε; the reference moves every entry by a full ε,
    so an exact conversion's write moves the logits less. A parameterization that cannot hold the model's γ in
    ``dtype`` (γ = 0.01 stored as γ − 1 in bfloat16: each γ off by up to a fifth of itself) moves them far more.
    Never below ``tolerance`` (the float64 check's)."""
    eps = torch.finfo(dtype).eps
    moved = copy.deepcopy(source).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moved.parameters():
            sign = torch.randint(0, 2, p.shape, generator=gen, dtype=torch.float64).mul_(2).sub_(1)
            p.mul_(1 + eps * sign)
    return max(tolerance(source.config), probe.change(moved))


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
    """Route every token to every routed expert of each MoE layer (top-k = E), each expert weighted 1/E whatever
    the router scores it, so that a probe sees each expert's function equally: an expert that the router scores
    2.9e-10 (or exactly 0 in float32) on every probe token is seen as much as any other. The router's own
    function is seen by the plain probe. (For the probe's forward only: ``route`` of ``model/moe.py`` is replaced
    while the context is open, in this thread's process.)"""
    from ..model import moe as moe_module

    layers = [m for model in models for m in model.modules() if isinstance(m, MoE)]
    before, real = [m.top_k for m in layers], moe_module.route

    def equal(logits, top_k, *args, **kwargs):
        r = real(logits, top_k, *args, **kwargs)
        return dataclasses.replace(r, weights=torch.full_like(r.weights, 1.0 / r.weights.shape[-1]))

    try:
        for m in layers:
            m.top_k = m.num_experts
        if layers:
            moe_module.route = equal
        yield bool(layers)
    finally:
        moe_module.route = real
        for m, k in zip(layers, before):
            m.top_k = k


class Probe:
    """The probe batch ``idx`` and the float64 source's logits on it (computed once): plain, and for an MoE model also
    with every token routed to every expert (``every_expert``)."""

    def __init__(self, source: Transformer, idx: torch.Tensor) -> None:
        self.idx, self.source, self._written = idx, source, {}
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

    def written_tolerance(self, dtype: torch.dtype) -> float:
        """``written_tolerance`` of the source in ``dtype`` (measured once)."""
        if dtype not in self._written:
            self._written[dtype] = written_tolerance(self.source, self, dtype)
        return self._written[dtype]
