"""Which transformers architecture holds a folded model, and the refusals (``plan_hf``): read from the
registered adapters (``scalevec_lit/arch/``), never from a list of names here.

A model, or a block, that no adapter reads is refused by its class name. Otherwise every adapter whose
kind the model is (``HFArchitecture.fits``: dense or MoE, the router, QK-norm) checks it; the first that
holds every site is chosen, else the refusals of the one that refuses least are given, each site named
with its layers and the fix (``--format native`` always among them).

Plain torch: must not import Lightning or transformers, nor the hf / write / cli modules of this package.
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from ..scale.registry import scale_parameters
from ..arch import NATIVE_HINT, HFArchitecture, Refusals, architectures, facts_of, head_norm_weight

__all__ = ["NATIVE_HINT", "head_norm_weight", "plan", "plan_hf"]


def _unknown(model: nn.Module, adapters: list[HFArchitecture]) -> list[str]:
    """The refusals of a model or block class that no adapter reads."""
    if not any(type(model) in a.models for a in adapters):
        return [f"the model is a {type(model).__name__}, not scalevec_lit's Transformer (no Hugging Face "
                f"architecture adapter reads it); {NATIVE_HINT}"]
    r = Refusals(len(model.blocks))
    for i, block in enumerate(model.blocks):
        if not any(type(block) in a.blocks for a in adapters):
            r.add(f"model.block: {type(block).__qualname__} is not the Pre-Norm Block (no Hugging Face architecture "
                  "adapter reads it; one that does is registered with scalevec_lit.arch.register); use Block", i)
    return r.lines()


def plan(model: nn.Module) -> tuple[Optional[HFArchitecture], list[str]]:
    """``(adapter, problems)`` for a folded model: problems empty when the adapter holds it."""
    adapters = architectures()
    problems = _unknown(model, adapters)
    if problems:
        return None, problems
    facts = facts_of(model)
    best: Optional[list[str]] = None
    for adapter in adapters:
        if not adapter.fits(facts) or type(model) not in adapter.models or any(
                type(b) not in adapter.blocks for b in model.blocks):
            continue
        r = Refusals(len(model.blocks))
        adapter.check(model, facts, r)
        lines = r.lines()
        if not lines:
            kept = adapter.kept_scales(model, facts)
            left = [sp.name for sp in scale_parameters(model) if id(sp.vector) not in kept]
            if not left:
                return adapter, []
            lines = [f"scale parameters without a place in {adapter.title} after folding: {left[:4]}; {NATIVE_HINT}"]
        if best is None or len(lines) < len(best):
            best = lines
    if best is None:
        kind = f"an MoE model with a {facts.router} router" if facts.moe else "a dense model"
        best = [f"no registered architecture ({', '.join(a.title for a in adapters)}) holds {kind}"
                f"{' with' if facts.qk_norm else ' without'} QK-norm; {NATIVE_HINT}"]
    return None, best


def plan_hf(model: nn.Module) -> tuple[Optional[str], list[str]]:
    """``(architecture name, problems)`` for a folded model: problems empty when the architecture holds it."""
    adapter, problems = plan(model)
    return (adapter.architecture if adapter is not None else None), problems
