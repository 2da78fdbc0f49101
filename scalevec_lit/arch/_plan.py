"""What the plan reads of a model and how it words a refusal, shared by every adapter: ``ModelFacts``
(dense or MoE, the router, QK-norm: which architectures a model can be), ``Refusals`` (problems by site
with their layers, each line ending with the way out, ``NATIVE_HINT``) and ``head_norm_weight``.

Plain torch: must not import Lightning or transformers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import torch

NATIVE_HINT = "or export the native format (--format native: our state dict + spec, reloadable with build_from_spec)"


def moe_class() -> Optional[type]:
    try:
        from ..model.moe import MoE
    except ImportError:  # pragma: no cover - a tree without the MoE module
        return None
    return MoE


@dataclass(frozen=True)
class ModelFacts:
    """What decides which architecture a model is: MoE or dense, the router's score, QK-norm."""

    moe: bool
    router: Optional[str]  # "softmax" / "sigmoid" for an MoE model, None when dense
    qk_norm: bool  # q and k both normalized (DNP) in the first block


def facts_of(model) -> ModelFacts:
    """The ``ModelFacts`` of a (folded) ``model``: MoE when any block's ``mlp`` is an ``MoE`` (then its
    ``config.moe.router``), QK-norm when q and k of the first block's attention site both normalize their output."""
    moe_cls = moe_class()
    moe = moe_cls is not None and any(type(getattr(b, "mlp", None)) is moe_cls for b in model.blocks)
    site = getattr(getattr(model.blocks[0], "attn", None), "input", None) if len(model.blocks) else None
    qk = site is not None and site.factors("q").normalized and site.factors("k").normalized
    return ModelFacts(moe, model.config.moe.router if moe else None, qk)


def head_norm_weight(site, branch: str, head_dim: int) -> tuple[torch.Tensor, float]:
    """The per-head u of a normalized q/k branch (ones when none) and the spread between heads."""
    u = site.factors(branch).after
    if u is None:
        return torch.ones(head_dim), 0.0
    per_head = u.detach().float().view(-1, head_dim)
    return per_head[0].clone(), float((per_head - per_head[0]).abs().max())


def join_or(titles: Iterable[str]) -> str:
    titles = list(titles)
    return titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " or " + titles[-1]


class Refusals:
    """Problems by site, with the layers where they occur (one line per site in the message). The same problem
    text added from several layers is one line; ``{amount}`` in it is replaced by the largest amount given."""

    def __init__(self, n_layer: int) -> None:
        self.n_layer, self.layers, self.amount = n_layer, {}, {}

    def add(self, problem: str, layer: Optional[int], amount: float = 0.0) -> None:
        """``layer`` None: a model-wide problem (no layer list in the message)."""
        self.layers.setdefault(problem, []).append(layer)
        self.amount[problem] = max(self.amount.get(problem, 0.0), amount)

    def lines(self) -> list[str]:
        """One line per problem, in the order added: its layers (``every layer``, ``layers 0, 2``; none for a
        model-wide one), the problem, and ``NATIVE_HINT``. Empty when nothing was refused."""
        out = []
        for problem, layers in self.layers.items():
            where = "" if layers == [None] else "every layer, " if len(layers) == self.n_layer else (
                "layer" + "s" * (len(layers) > 1) + " " + ", ".join(map(str, layers)) + ", ")
            if self.amount[problem]:
                problem = problem.replace("{amount}", f"{self.amount[problem]:.3g}")
            out.append(f"{where}{problem}, {NATIVE_HINT}")
        return out
