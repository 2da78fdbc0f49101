"""RoleWeightDecay: decoupled weight decay for scale vectors by role and part, in the optimizer step.

The optimizer's own weight decay is off for scale parameters (``scalevec_lit.lit.optim`` puts them in the
``scale`` group with ``weight_decay=0``); this callback decays each one as AdamW would,
``p ← p · (1 − lr · λ)`` with ``lr`` the current (scheduled) learning rate of the group that holds ``p``,
right before the optimizer's update (``on_before_optimizer_step``: after backward, before the step), and
only for parameters that have a gradient (as AdamW skips the others). When the optimizer skips the step
on the device (``optimizer.found_inf`` is 1: fused AdamW under ``model.nonfinite``, see
``scalevec_lit/lit/nonfinite.py``), the decay is skipped with it, on the device too (no host-device sync),
so a skipped step leaves every parameter bitwise unchanged. Roles and parts come from the scale registry only.

Presets (``preset``):

============  =========================  ===========================================================
preset        scale vectors decayed      non-scale groups (set on the optimizer at fit start)
============  =========================  ===========================================================
iwd           input role only (default)  unchanged (``model.param_groups`` / optimizer defaults)
decay_all     input and output role      unchanged
decay_none    none                       unchanged
ndim          none (they are 1-D)        groups of >=2-D tensors: λ_matrix; 1-D groups: 0 (nanoGPT, Megatron)
all           input and output role      every group: λ_matrix (litgpt, torchtitan's default)
============  =========================  ===========================================================

λ for scales is ``weight_decay`` when given, else the optimizer's ``matrix`` group's weight decay
(λ_matrix; with ``MuonAdamW``, the Muon-held ``matrix`` group's, i.e. Muon's λ). ``role_weight_decay``
overrides λ per role (``{output: 0.01}``), and ``part_weight_decay`` per part of the roles that are decayed
(``{magnitude: 0.0}`` leaves β of a magnitude-direction scale free); it never decays a role the preset and
``role_weight_decay`` leave undecayed. A positive part override that does reach output-role scales (preset
``decay_all``/``all`` or ``role_weight_decay.output`` > 0) is applied with a one-line warning, since the paper
finds that decaying output-role scales hurts.

Groups held by Muon (``use_muon`` true, as ``MuonAdamW`` marks them) keep their own weight decay under
``ndim`` and ``all``: Muon's λ is configured with Muon (``muon_weight_decay`` or
``model.param_groups.<kind>.weight_decay``) and paired with Muon's learning rate, so the presets set only the
groups that AdamW (or another element-wise optimizer) updates.

May import Lightning and torch; reads the model only through ``scalevec_lit.scale.scale_parameters``
and the optimizer's parameter groups. Must not import ``scalevec_lit.lit`` (the module or its optimizers).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from scalevec_lit.errors import notice
from scalevec_lit.scale.registry import DECAYED_BY, MATRIX, scale_parameters

__all__ = ["RoleWeightDecay"]

ROLES = ("input", "output")
KNOWN_PARTS = ("scale", "magnitude", "direction")

#: preset -> (roles whose scales are decayed, rule for the non-scale groups or None to leave them)
PRESETS: dict[str, tuple[frozenset, Optional[str]]] = {
    "iwd": (frozenset({"input"}), None),
    "decay_all": (frozenset({"input", "output"}), None),
    "decay_none": (frozenset(), None),
    "ndim": (frozenset(), "ndim"),
    "all": (frozenset({"input", "output"}), "all"),
}


#: the group key by which ``MuonAdamW`` marks the groups Muon updates (their λ is Muon's own)
MUON_KEY = "use_muon"


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of an FSDP2 DTensor parameter (a view: in-place updates reach the parameter)."""
    return t.to_local() if hasattr(t, "to_local") else t


class RoleWeightDecay(Callback):
    """Decay scale vectors by role (and part) with decoupled weight decay; see the module docstring.

    Args:
        preset: ``iwd`` (default), ``decay_all``, ``decay_none``, ``ndim`` or ``all``.
        weight_decay: λ for the decayed scales; ``None`` = the optimizer's ``matrix`` group's λ.
        role_weight_decay: per-role λ overriding the preset (``{input: 0.1, output: 0.0}``).
        part_weight_decay: per-part λ (``scale``, ``magnitude``, ``direction``) for decayed roles.
    """

    def __init__(
        self,
        preset: str = "iwd",
        weight_decay: Optional[float] = None,
        role_weight_decay: Optional[dict[str, float]] = None,
        part_weight_decay: Optional[dict[str, float]] = None,
    ) -> None:
        if preset not in PRESETS:
            raise ValueError(
                f"RoleWeightDecay.preset: {preset!r} is not one of {', '.join(PRESETS)}; pick one of them"
            )
        self.preset = preset
        self.weight_decay = None if weight_decay is None else _non_negative("weight_decay", weight_decay)
        self.role_weight_decay = {
            k: _non_negative(f"role_weight_decay.{k}", v) for k, v in (role_weight_decay or {}).items()
        }
        self.part_weight_decay = {
            k: _non_negative(f"part_weight_decay.{k}", v) for k, v in (part_weight_decay or {}).items()
        }
        unknown = set(self.role_weight_decay) - set(ROLES)
        if unknown:
            raise ValueError(
                f"RoleWeightDecay.role_weight_decay: {sorted(unknown)} are not roles; use input and/or output"
            )
        # plan per optimizer: [(group index, [params], λ)], built at fit start
        self._plans: dict[int, list[tuple[int, list[torch.Tensor], float]]] = {}
        self._group_decay: dict[int, dict[int, float]] = {}

    # -- the decay rule ------------------------------------------------------------------------------
    def scale_decay(self, role: str, part: str, lam: float) -> float:
        """λ for one scale parameter of ``role`` and ``part`` given the base λ."""
        decayed, _ = PRESETS[self.preset]
        base = self.role_weight_decay.get(role, lam if role in decayed else 0.0)
        if base == 0.0:
            return 0.0
        return float(self.part_weight_decay.get(part, base))

    @staticmethod
    def matrix_weight_decay(optimizer: torch.optim.Optimizer) -> Optional[float]:
        """λ_matrix: the ``matrix`` group's weight decay; of the Muon-held one when the kind is split."""
        found = [g for g in optimizer.param_groups if g.get("kind") == MATRIX]
        if not found:
            return None
        held = [g for g in found if g.get(MUON_KEY)] or found
        return float(held[0].get("weight_decay", 0.0))

    # -- set-up --------------------------------------------------------------------------------------
    def build_plan(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
        """Resolve every decay for ``optimizer``; returns the rows of the start-up table."""
        groups = optimizer.param_groups
        where = {id(p): gi for gi, g in enumerate(groups) for p in g["params"]}
        scales = list(scale_parameters(module))
        for sp in scales:
            gi = where.get(id(sp.param))
            own = 0.0 if gi is None else float(groups[gi].get("weight_decay", 0.0) or 0.0)
            if own != 0.0:
                raise ValueError(
                    f"RoleWeightDecay: scale parameter {sp.name or sp.info.tag} sits in optimizer group "
                    f"{groups[gi].get('name', gi)!r} with weight_decay={own}; the optimizer must not decay scale "
                    "vectors (keep model.param_groups.scale.weight_decay at 0 and let RoleWeightDecay decay them)"
                )
        lam_matrix = self.matrix_weight_decay(optimizer)
        lam = self.weight_decay if self.weight_decay is not None else lam_matrix
        if lam is None:
            raise ValueError(
                "RoleWeightDecay.weight_decay: None and the optimizer has no 'matrix' parameter group to take λ "
                "from; set it, e.g. --trainer.callbacks.init_args.weight_decay=0.1"
            )
        parts = {sp.info.part for sp in scales} | set(KNOWN_PARTS)
        unknown = set(self.part_weight_decay) - parts
        if unknown:
            raise ValueError(
                f"RoleWeightDecay.part_weight_decay: {sorted(unknown)} are not parts of scale vectors; use some of "
                f"{', '.join(sorted(parts))}"
            )
        scale_groups: set[int] = set()
        by_key: dict[tuple[int, float], list[torch.Tensor]] = {}
        summary: dict[tuple[str, str, str], list] = {}
        output_by_part: dict[str, list] = {}  # part -> [count, sites] of output-role scales a part override decays
        for sp in scales:
            gi = where.get(id(sp.param))
            if gi is None:  # frozen or not optimized by this optimizer
                continue
            scale_groups.add(gi)
            groups[gi][DECAYED_BY] = type(self).__name__  # the module reads this from its own groups
            wd = self.scale_decay(sp.info.role, sp.info.part, lam)
            if wd:
                by_key.setdefault((gi, wd), []).append(sp.param)
                if sp.info.role == "output" and sp.info.part in self.part_weight_decay:
                    row = output_by_part.setdefault(sp.info.part, [0, []])
                    row[0] += 1
                    if sp.info.site not in row[1]:
                        row[1].append(sp.info.site)
            row = summary.setdefault((sp.info.role, sp.info.site, sp.info.part), [0, 0, set()])
            row[0] += 1
            row[1] += sp.param.numel()
            row[2].add(wd)
        self._plans[id(optimizer)] = [(gi, params, wd) for (gi, wd), params in by_key.items()]
        for part, (n, sites) in output_by_part.items():
            notice(
                f"RoleWeightDecay.part_weight_decay.{part}: {self.part_weight_decay[part]:g}: also decays {n} "
                f"output-role scale vector(s) ({', '.join(sites)}; role output is decayed by "
                f"{'role_weight_decay.output' if 'output' in self.role_weight_decay else 'preset ' + self.preset}), "
                "and the paper finds that decaying output-role scales hurts; to decay input-role scales only, set "
                "role_weight_decay: {output: 0.0}", kind="warning")

        # the non-scale groups under ndim / all
        _, rule = PRESETS[self.preset]
        group_decay: dict[int, float] = {}
        if rule is not None:
            lam_groups = lam_matrix if lam_matrix is not None else lam
            for gi, g in enumerate(groups):
                if gi in scale_groups:
                    if len(g["params"]) != sum(1 for sp in scales if where.get(id(sp.param)) == gi):
                        raise ValueError(
                            f"RoleWeightDecay.preset: {self.preset!r} sets each group's weight decay, but group "
                            f"{g.get('name', gi)!r} mixes scale vectors with other tensors; build the optimizer "
                            "from scalevec_lit.lit.optim.build_param_groups (one group per kind)"
                        )
                    continue
                if g.get(MUON_KEY):  # Muon's own λ, paired with Muon's lr: never overwritten by a preset
                    continue
                if rule == "all":
                    group_decay[gi] = lam_groups
                else:
                    big = {p.ndim >= 2 for p in g["params"]}
                    if len(big) > 1:
                        raise ValueError(
                            f"RoleWeightDecay.preset: 'ndim' needs each optimizer group to hold only >=2-D or only "
                            f"1-D tensors, and group {g.get('name', gi)!r} mixes them; split it by kind "
                            "(scalevec_lit.lit.optim.build_param_groups does)"
                        )
                    group_decay[gi] = lam_groups if big == {True} else 0.0
        self._group_decay[id(optimizer)] = group_decay
        self.apply_group_decay(optimizer)

        rows = [["group", "tensors", "params", "weight_decay", "applied by"]]
        for gi, g in enumerate(groups):
            if gi in scale_groups:
                continue
            by = "Muon (its own λ; the preset leaves it)" if rule is not None and g.get(MUON_KEY) else "optimizer"
            rows.append(
                [str(g.get("name", gi)), str(len(g["params"])), f"{sum(p.numel() for p in g['params']):,}",
                 f"{float(g.get('weight_decay', 0.0)):g}", by]
            )
        for (role, site, part), (n, numel, wds) in summary.items():
            wd = "/".join(f"{w:g}" for w in sorted(wds))
            rows.append([f"scale {role} {site} {part}", str(n), f"{numel:,}", wd, "RoleWeightDecay"])
        return rows

    def apply_group_decay(self, optimizer: torch.optim.Optimizer) -> None:
        """Set the non-scale groups' weight decay of the ndim/all presets (idempotent)."""
        for gi, wd in self._group_decay.get(id(optimizer), {}).items():
            optimizer.param_groups[gi]["weight_decay"] = wd

    # -- hooks ---------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._plans.clear()
        self._group_decay.clear()
        for optimizer in trainer.optimizers:
            rows = self.build_plan(pl_module, optimizer)
            rank_zero_info(
                f"RoleWeightDecay (preset {self.preset}): weight decay per parameter group\n" + _table(rows)
            )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # a resumed optimizer state replaces the group dicts after on_fit_start: set the presets again
        for optimizer in trainer.optimizers:
            self.apply_group_decay(optimizer)

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: torch.optim.Optimizer) -> None:
        plan = self._plans.get(id(optimizer))
        if plan is None:
            self.build_plan(pl_module, optimizer)
            plan = self._plans[id(optimizer)]
        groups = optimizer.param_groups
        skip = _device_skip_flag(optimizer)
        for gi, params, wd in plan:
            lr = groups[gi]["lr"]
            lr = float(lr) if torch.is_tensor(lr) else lr
            local = [_local(p) for p in params if p.grad is not None]  # as AdamW: no gradient, no decay
            if not local:
                continue
            if skip is None:
                torch._foreach_mul_(local, 1 - lr * wd)  # the same scalar as torch's AdamW: 1 - lr * weight_decay
                continue
            # the optimizer skips this step on the device when found_inf is 1: keep or decay there, no sync
            decayed = torch._foreach_mul(local, 1 - lr * wd)
            for p, d in zip(local, decayed):
                p.copy_(torch.where(skip.to(p.device), p, d))


def _device_skip_flag(optimizer: torch.optim.Optimizer) -> Optional[torch.Tensor]:
    """``found_inf != 0`` as a device tensor when ``optimizer.step`` honours ``found_inf`` (fused Adam/AdamW/SGD,
    the test of ``scalevec_lit.lit.nonfinite.supports_found_inf``), else None."""
    found_inf = getattr(optimizer, "found_inf", None)
    fused = getattr(optimizer, "_step_supports_amp_scaling", False) and getattr(optimizer, "defaults", {}).get("fused")
    if not fused or not torch.is_tensor(found_inf):
        return None
    return found_inf != 0


def _non_negative(key: str, value: Any) -> float:
    value = float(value)
    if value < 0:
        raise ValueError(f"RoleWeightDecay.{key}: {value} is negative; weight decay must be >= 0")
    return value


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
