"""Optimizer parameter groups, declared by parameter *kind*, and the Muon + AdamW hybrid.

Every parameter gets one kind from the model's structure (never from its name):
``scale`` (the scale registry), ``embedding`` (the token embedding), ``head`` (an untied LM head),
``matrix`` (other tensors with ndim >= 2: the hidden linear maps, experts) and ``vector`` (other 1-D
tensors). ``param_groups`` in YAML maps kinds to options (``weight_decay``, ``lr_mult``...);
scale parameters always get the optimizer's weight decay switched off, because
``scalevec_lit.callbacks.RoleWeightDecay`` decays them by role.

Must not import Lightning.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn

from ..scale.registry import scale_parameters

KINDS = ("matrix", "embedding", "head", "vector", "scale")

#: Defaults; ``model.param_groups`` overrides per kind. ``None`` weight decay = the optimizer's own.
DEFAULT_GROUP_OPTIONS: dict[str, dict[str, Any]] = {
    "matrix": {},
    "embedding": {"weight_decay": 0.0},
    "head": {},
    "vector": {"weight_decay": 0.0},
    "scale": {"weight_decay": 0.0},
}


def parameter_kinds(model: nn.Module) -> "OrderedDict[str, list[tuple[str, nn.Parameter]]]":
    """kind -> [(name, parameter)], every trainable parameter exactly once."""
    scale_ids = {id(sp.param) for sp in scale_parameters(model)}
    embed = getattr(getattr(model, "embed", None), "weight", None)
    head = getattr(getattr(model, "head", None), "weight", None)
    kinds: "OrderedDict[str, list]" = OrderedDict((k, []) for k in KINDS)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in scale_ids:
            kind = "scale"
        elif p is embed:
            kind = "embedding"
        elif p is head:
            kind = "head"
        elif p.ndim >= 2:
            kind = "matrix"
        else:
            kind = "vector"
        kinds[kind].append((name, p))
    return kinds


def build_param_groups(model: nn.Module, overrides: Optional[dict[str, dict[str, Any]]] = None) -> list[dict]:
    """One optimizer group per non-empty kind, with ``name`` and ``kind`` keys for logs and callbacks."""
    overrides = overrides or {}
    unknown = set(overrides) - set(KINDS)
    if unknown:
        raise ValueError(
            f"model.param_groups: {sorted(unknown)} are not parameter kinds; use some of {', '.join(KINDS)}"
        )
    groups = []
    for kind, named in parameter_kinds(model).items():
        if not named:
            continue
        options = {**DEFAULT_GROUP_OPTIONS[kind], **overrides.get(kind, {})}
        if kind == "scale" and options.get("weight_decay", 0.0) != 0.0:
            raise ValueError(
                "model.param_groups.scale.weight_decay: scale vectors are decayed by role with "
                "scalevec_lit.callbacks.RoleWeightDecay; set the decay there (e.g. --trainer.callbacks+=RoleWeightDecay)"
            )
        groups.append({"params": [p for _, p in named], "names": [n for n, _ in named], "kind": kind, "name": kind, **options})
    return groups


def instantiate_optimizer(factory: Callable[[Iterable], torch.optim.Optimizer], groups: list[dict]) -> torch.optim.Optimizer:
    """Call the optimizer factory with groups; ``lr_mult`` becomes each group's ``lr`` once the base lr is known."""
    clean = []
    for g in groups:
        g = {k: v for k, v in g.items() if k != "names"}
        if g.get("weight_decay") is None:
            g.pop("weight_decay", None)
        clean.append(g)
    opt = factory(clean)
    for g in opt.param_groups:
        mult = g.get("lr_mult")
        if mult is not None:
            g["lr"] = g["lr"] * mult
        g.setdefault("initial_lr", g["lr"])
    return opt


def describe_groups(opt: torch.optim.Optimizer) -> str:
    """A table: group -> optimizer, tensors, parameters, lr, weight decay."""
    rows = [("group", "optimizer", "tensors", "params", "lr", "weight_decay")]
    for g in getattr(opt, "all_param_groups", lambda: [(type(opt).__name__, g) for g in opt.param_groups])():
        name, grp = g
        rows.append(
            (
                str(grp.get("name", "?")),
                name,
                str(len(grp["params"])),
                f"{sum(p.numel() for p in grp['params']):,}",
                f"{grp['lr']:.3g}",
                f"{grp.get('weight_decay', 0.0):g}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
