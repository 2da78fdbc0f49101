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

import math
import re

import torch
from torch import nn

from ..errors import UserError
from ..scale.registry import GROUP_KINDS, scale_parameters

KINDS = GROUP_KINDS  # matrix, embedding, head, vector, scale (names shared with callbacks: scale/registry.py)

#: Defaults; ``model.param_groups`` overrides per kind. ``None`` weight decay = the optimizer's own.
DEFAULT_GROUP_OPTIONS: dict[str, dict[str, Any]] = {
    "matrix": {},
    "embedding": {"weight_decay": 0.0},
    "head": {},
    "vector": {"weight_decay": 0.0},
    # many tiny tensors: one multi-tensor (foreach) update instead of a Python loop over them
    "scale": {"weight_decay": 0.0, "foreach": True},
}


def parameter_kinds(model: nn.Module) -> "OrderedDict[str, list[tuple[str, nn.Parameter]]]":
    """kind -> [(name, parameter)], every trainable parameter exactly once."""
    scale_ids = {id(sp.param) for sp in scale_parameters(model)}
    embed = getattr(getattr(model, "embed", None), "weight", None)
    head = getattr(model, "head_weight", None)
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


def check_group_options(overrides: Optional[dict[str, dict[str, Any]]]) -> None:
    """Refuse ``model.param_groups`` values that would train silently wrong (a negative ``lr_mult``: gradient
    ascent; a negative ``weight_decay``: weights pushed away from 0), one ``UserError`` naming the key."""
    for kind, options in (overrides or {}).items():
        for name in ("lr_mult", "weight_decay"):
            value = (options or {}).get(name)
            if value is None:
                continue
            key = f"model.param_groups.{kind}.{name}"
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UserError(key, value, "is not a finite number", f"set a number >= 0, e.g. --{key}=1.0"
                                if name == "lr_mult" else f"set a number >= 0, e.g. --{key}=0.1")
            if value < 0 and name == "lr_mult":
                raise UserError(key, value, f"a negative multiplier makes the {kind} group's learning rate negative, "
                                "so it would train by gradient ascent (climb the loss)",
                                f"set a multiplier >= 0 (1 keeps the optimizer's lr, 0 freezes the group), e.g. "
                                f"--{key}=1.0")
            if value < 0:
                raise UserError(key, value, f"a negative weight decay grows the {kind} group's weights at every step",
                                f"set a value >= 0 (0 turns decay off), e.g. --{key}=0.0")


def build_param_groups(model: nn.Module, overrides: Optional[dict[str, dict[str, Any]]] = None) -> list[dict]:
    """One optimizer group per non-empty kind, with ``name`` and ``kind`` keys for logs and callbacks."""
    overrides = overrides or {}
    unknown = set(overrides) - set(KINDS)
    if unknown:
        raise ValueError(
            f"model.param_groups: {sorted(unknown)} are not parameter kinds; use some of {', '.join(KINDS)}"
        )
    check_group_options(overrides)
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


#: torch's names in ``Invalid <name> value: <value>`` -> the optimizer's argument
_TORCH_NAMES = {"epsilon": "eps", "learning rate": "lr", "beta parameter at index 0": "betas",
                "beta parameter at index 1": "betas"}


def check_decay(name: str, value: Any, optimizer: str = "the optimizer") -> None:
    """A negative or non-finite ``model.optimizer.init_args.<name>`` (a weight decay), refused in our words."""
    key = f"model.optimizer.init_args.{name}"
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(key, value, "is not a finite number", f"set a number >= 0 (0 turns decay off), e.g. --{key}=0.1")
    if value < 0:
        raise UserError(key, value, f"a negative weight decay makes {optimizer} grow every decayed weight at every "
                        "step (away from 0 instead of towards it)", f"set a value >= 0 (0 turns decay off), e.g. "
                        f"--{key}=0.1")


def _our_words(err: ValueError, optimizer: str) -> Optional[UserError]:
    """torch's ``Invalid weight_decay value: -0.1`` (raised by the optimizer's constructor) as a ``UserError``."""
    if str(err).startswith("Muon only supports 2D parameters"):  # torch.optim.Muon, e.g. --model.optimizer=Muon
        return UserError("model.optimizer", "torch.optim.Muon", "updates only 2-D parameters, and the model also has "
                         "vectors (the scale vectors, biases) for it", "use this library's MuonAdamW (Muon for the "
                         "hidden matrices, AdamW for the rest): --config recipes/optim/muon_wsd.yaml after the model "
                         "recipe, or --model.optimizer=MuonAdamW")
    found = re.fullmatch(r"Invalid (.+) value: (.+)", str(err).strip())
    if found is None:
        return None
    name, value = _TORCH_NAMES.get(found.group(1), found.group(1)), found.group(2)
    if name == "weight_decay":
        try:
            check_decay(name, float(value), optimizer)
        except UserError as ours:
            return ours
    key = f"model.optimizer.init_args.{name}"
    return UserError(key, value, f"is outside the range {optimizer} accepts", f"set --{key} to a valid value (a "
                     "learning rate, eps and weight_decay >= 0, betas in [0, 1))")


def instantiate_optimizer(factory: Callable[[Iterable], torch.optim.Optimizer], groups: list[dict]) -> torch.optim.Optimizer:
    """Call the optimizer factory with groups; ``lr_mult`` becomes each group's ``lr`` once the base lr is known.
    An argument the optimizer refuses (``Invalid weight_decay value``) is reported with its key and the fix."""
    clean = []
    for g in groups:
        g = {k: v for k, v in g.items() if k != "names"}
        if g.get("weight_decay") is None:
            g.pop("weight_decay", None)
        clean.append(g)
    try:
        opt = factory(clean)
    except ValueError as err:
        ours = _our_words(err, "the optimizer")
        if ours is None:
            raise
        raise ours from None
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


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the hidden 2-D matrices, AdamW for everything else, as one ``torch.optim.Optimizer``.

    Groups whose ``kind`` is in ``muon_kinds`` (default: ``matrix``) go to ``torch.optim.Muon`` with
    ``muon_lr`` and ``muon_weight_decay``; every other group (embedding, head, vector, scale) goes to
    ``torch.optim.AdamW`` with ``lr``, ``betas``, ``eps`` and ``weight_decay``. A group may also say
    ``use_muon: true/false`` itself. Tensors of a Muon kind that are not 2-D (e.g. stacked 3-D expert
    weights) are split off into a group ``<name>_nd`` that AdamW updates, since Muon orthogonalizes
    matrices only; that group keeps its kind's weight decay (``muon_weight_decay``, or the kind's own
    ``weight_decay`` from ``model.param_groups``) and takes AdamW's ``lr``. So every parameter of a kind
    decays by the same λ whichever optimizer holds it, and ``RoleWeightDecay`` reads λ_matrix from the
    Muon-held ``matrix`` group.

    One list ``param_groups`` and one ``state`` hold everything, so that ``LambdaLR`` schedules both
    parts, ``state_dict``/``load_state_dict`` round-trip as for any optimizer, and ``describe_groups``
    shows which optimizer updates each group (``all_param_groups``). The two inner optimizers are
    re-pointed at these shared groups and state before every step.

    YAML::

        model:
          optimizer:
            class_path: scalevec_lit.lit.optim.MuonAdamW
            init_args: {lr: 0.003, muon_lr: 0.02, weight_decay: 0.1}
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 3e-4,
        muon_lr: float = 0.02,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        muon_weight_decay: Optional[float] = None,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: Optional[str] = None,
        muon_kinds: tuple[str, ...] = ("matrix",),
    ) -> None:
        groups = list(params)
        if not groups or not all(isinstance(g, dict) for g in groups):
            raise TypeError(
                "model.optimizer: MuonAdamW needs parameter groups with a 'kind' key (as built from the scale "
                "registry by scalevec_lit.lit.optim.build_param_groups), not bare tensors"
            )
        check_decay("weight_decay", weight_decay, "MuonAdamW")
        check_decay("muon_weight_decay", muon_weight_decay, "MuonAdamW")
        muon_wd = weight_decay if muon_weight_decay is None else muon_weight_decay
        prepared: list[dict] = []
        for g in groups:
            g = dict(g)
            use_muon = g.pop("use_muon", None)
            if use_muon is None:
                use_muon = g.get("kind") in muon_kinds
            g["params"] = list(g["params"])
            if use_muon:
                names = g.pop("names", None)
                labels = names if names is not None else [None] * len(g["params"])
                flat = [(n, p) for n, p in zip(labels, g["params"]) if p.ndim == 2]
                other = [(n, p) for n, p in zip(labels, g["params"]) if p.ndim != 2]
                if other:  # Muon orthogonalizes matrices only: AdamW takes the rest of this kind
                    nd = {**g, "params": [p for _, p in other], "name": f"{g.get('name', g.get('kind', 'group'))}_nd"}
                    if names is not None:
                        nd["names"] = [n for n, _ in other]
                    nd.setdefault("lr", lr)  # AdamW's step size: Muon's lr is for orthogonalized updates
                    nd.setdefault("weight_decay", muon_wd)  # the decay of its kind, whichever optimizer holds it
                    prepared.append({**nd, "use_muon": False})
                if not flat:
                    continue
                g["params"] = [p for _, p in flat]
                if names is not None:
                    g["names"] = [n for n, _ in flat]
                g.setdefault("lr", muon_lr)
                g.setdefault("weight_decay", muon_wd)
            else:
                g.setdefault("lr", lr)
                g.setdefault("weight_decay", weight_decay)
            g["use_muon"] = bool(use_muon)
            prepared.append(g)
        super().__init__(prepared, {"lr": lr, "weight_decay": weight_decay})
        muon_groups = [g for g in self.param_groups if g["use_muon"]]
        adam_groups = [g for g in self.param_groups if not g["use_muon"]]
        # the inner optimizers fill their own defaults into these same group dicts
        self._muon = (
            torch.optim.Muon(
                muon_groups, lr=muon_lr, weight_decay=muon_wd, momentum=momentum, nesterov=nesterov,
                ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
            )
            if muon_groups
            else None
        )
        self._adamw = (
            torch.optim.AdamW(adam_groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
            if adam_groups
            else None
        )
        self._sync()

    def _sync(self) -> None:
        """Point the inner optimizers at the shared groups and state (``load_state_dict`` replaces both)."""
        for inner, flag in ((self._muon, True), (self._adamw, False)):
            if inner is None:
                continue
            inner.param_groups = [g for g in self.param_groups if bool(g["use_muon"]) == flag]
            for g in inner.param_groups:
                for key, value in inner.defaults.items():
                    g.setdefault(key, value)
            inner.state = self.state

    def all_param_groups(self) -> list[tuple[str, dict]]:
        """``(optimizer name, group)`` for every group, for ``describe_groups``."""
        return [("Muon" if g["use_muon"] else "AdamW", g) for g in self.param_groups]

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync()
        if self._muon is not None:
            self._muon.step()
        if self._adamw is not None:
            self._adamw.step()
        return loss
