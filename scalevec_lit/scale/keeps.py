"""What a strategy's placement means to the code outside ``scale/``, asked here instead of re-derived there:
which branches normalize their output (``dual_norm``), what a branch's output side keeps for the backward
(the launch plan's activation count, ``lit/activations.py``), which branches moved off the plain input
placement (``inspect``'s one-line strategy), and whether a site divides an input scale's size out (the
monitor's invariance check), and the placement as a spec writes it.

Nothing outside ``scale/`` reads ``strategy.placement`` or a site's placement: it asks these functions, or the
``NormSite`` methods that call them (``tests/test_scale_keeps.py`` scans the package for readers).

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping

from .branch import InputScale
from .strategy import BRANCHES, ScaleStrategy, has_output_side, normalizes
from .vector import ScaleVector


@dataclass(frozen=True)
class BranchKeeps:
    """What one branch's output side keeps for the backward, beyond the projection itself.

    - ``reciprocal_rms``: a normalized branch (``dual_norm``) keeps its fp32 reciprocal RMS, one per group
      (per head on q/k/v, one per row on the MLP's gate/up, per routed row of an expert);
    - ``normalized_input``: it also keeps its input (the projection's output, before the norm) where
      ``group_norm_rope`` cannot tell cheaply whether some ``u_j`` is exactly 0: on an accelerator, when the
      branch has an output scale u (on CPU it checks, and recovers the input from the output it returns;
      ``scale/norm_rope.py``).
    """

    reciprocal_rms: bool
    normalized_input: bool


def branch_normalizes(strategy: ScaleStrategy, branch: str) -> bool:
    """``branch`` (one of ``BRANCHES``) normalizes its projection's output before its output scale."""
    return normalizes(strategy.placement.of(branch))


def normalized_branches(strategy: ScaleStrategy, branches: Iterable[str] = BRANCHES) -> tuple[str, ...]:
    """The ones of ``branches`` that normalize their output, in the order given."""
    return tuple(b for b in branches if branch_normalizes(strategy, b))


def branch_keeps(strategy: ScaleStrategy, branch: str, on_accelerator: bool = True) -> BranchKeeps:
    """What ``branch``'s output side keeps for the backward (eager; see ``BranchKeeps``), on an accelerator
    (``on_accelerator``) or on CPU."""
    p = strategy.placement.of(branch)
    norm = normalizes(p)
    has_u = has_output_side(p) and not strategy.vector(1).is_identity
    return BranchKeeps(reciprocal_rms=norm, normalized_input=on_accelerator and norm and has_u)


def moved_branches(strategy: ScaleStrategy) -> dict[str, str]:
    """Each branch whose placement is not the plain ``input`` one, with its placement, in ``BRANCHES`` order."""
    return {b: strategy.placement.of(b) for b in BRANCHES if strategy.placement.of(b) != "input"}


def placement_data(strategy: ScaleStrategy) -> dict[str, str]:
    """The placement as plain data, branch by branch (a model spec's ``strategy.placement``)."""
    return dataclasses.asdict(strategy.placement)


def all_normalize(placement: Mapping[str, str], branches: Iterable[str]) -> bool:
    """Every one of ``branches`` (a site's branch names; a site's ``placement`` maps them) normalizes its output,
    and there is at least one."""
    names = list(branches)
    return bool(names) and all(b in placement and normalizes(placement[b]) for b in names)


def divides_size_out(scales: Iterable[InputScale], placement: Mapping[str, str], vector: ScaleVector) -> bool:
    """``vector`` is one of a site's input ``scales`` (not an expert's) whose every consumer branch normalizes its
    output: the per-head / per-row RMS divides its size out (``ScaleStrategy.magnitude_before_norm``)."""
    scale = next((s for s in scales if s.vector is vector), None)
    return scale is not None and scale.expert is None and all_normalize(placement, scale.branches)
