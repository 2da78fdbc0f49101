"""The ScaleVector contract (issue 25 item 2) and the scale-site interface's guarantees (item 3).

Every shipped parameterization keeps the documented contract (initial γ, parts, identity, the inverse and
its refusals); a user class without an inverse says so by name; a wrong inverse is caught; a site refuses at
build time an absorbed branch without its map; and no module outside ``scalevec_lit/scale/`` reads a site's
internals or asks which shipped class a vector is.
"""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from helpers import ROOT
from scalevec_lit.scale import (
    Branch, DirectionScale, ExpMagnitudeDirectionScale, MagnitudeDirectionScale, NoInverse, NoScale, NormSite,
    PlainScale, ScaleStrategy, ScaleVector, UnitOffsetScale,
)
from scalevec_lit.scale.convert import set_scale_
from extensions.scales import RootScale, SquareScale

SHIPPED = [NoScale, PlainScale, UnitOffsetScale, DirectionScale, MagnitudeDirectionScale, ExpMagnitudeDirectionScale]
EPS = torch.finfo(torch.float64).eps


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("cls", SHIPPED)
def test_every_shipped_class_keeps_the_contract(cls):
    vec = cls(6).double()
    ones = torch.ones(6, dtype=torch.float64)
    start = getattr(vec, "eps", 0.0)  # the ε inside RMS(α) of a magnitude-direction form: γ = 1/√(1 + ε) at init
    assert _rel(vec(), ones) <= start and cls.invertible()  # starts at γ ≡ 1; has an inverse
    assert vec.is_identity == (cls is NoScale) and (not list(vec.parameters())) == (cls is NoScale)
    assert set(vec.parts()) == {"": set(), "scale": {"scale"}, "md": {"magnitude", "direction"},
                                "d": {"direction"}}[{NoScale: "", PlainScale: "scale", UnitOffsetScale: "scale",
                                                     DirectionScale: "d"}.get(cls, "md")]
    unit = torch.tensor([1.2, -0.4, 0.9, 1.3, -1.1, 0.5], dtype=torch.float64)
    unit = unit / unit.pow(2).mean().sqrt()  # RMS 1: every class but NoScale can hold it
    gamma = 1.7 * unit  # RMS 1.7: not a direction
    for want, holds in ((unit, cls is not NoScale), (gamma, cls not in (NoScale, DirectionScale)), (ones, True)):
        before = [p.detach().clone() for p in vec.parameters()]
        assert set_scale_(vec, want) is holds
        if holds:
            assert _rel(vec(), want) <= 8 * EPS
        else:  # refused: the parameters are as they were
            assert all(torch.equal(p, b) for p, b in zip(vec.parameters(), before))
    if cls is not NoScale:
        set_scale_(vec, gamma if cls is not DirectionScale else unit)
        vec.reset_parameters()
        assert _rel(vec(), ones) <= start


class WrongInverseScale(SquareScale):
    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        self.scale.copy_(gamma)  # forgets the square root
        return True


def test_a_class_without_an_inverse_says_so_by_name():
    vec = SquareScale(4)
    assert not SquareScale.invertible() and RootScale.invertible()
    with pytest.raises(NoInverse, match=r"^extensions\.scales\.SquareScale has no inverse \(ScaleVector\.set_gamma_\)"
                                        r": nothing can set it to a given γ; implement set_gamma_\(gamma\) -> bool"):
        set_scale_(vec, torch.full((4,), 2.0))
    assert torch.equal(vec(), torch.ones(4))


def test_an_inverse_that_does_not_produce_gamma_is_caught_and_undone():
    vec = WrongInverseScale(4).double()
    with pytest.raises(ValueError, match=rf"{re.escape(__name__)}\.WrongInverseScale\.set_gamma_ returned True but "
                                         r"the vector then produces a γ off by 2; fix its inverse"):
        set_scale_(vec, torch.full((4,), 2.0, dtype=torch.float64))
    assert torch.equal(vec(), torch.ones(4, dtype=torch.float64))
    good = RootScale(4).double()
    assert set_scale_(good, torch.full((4,), 2.0, dtype=torch.float64))
    assert not set_scale_(good, torch.tensor([1.0, -1.0, 1.0, 1.0], dtype=torch.float64))
    assert _rel(good(), torch.full((4,), 2.0, dtype=torch.float64)) <= 4 * EPS


def test_an_absorbed_branch_needs_its_map_when_the_site_is_built():
    branches = [Branch("fc", 8), Branch("proj", 8, absorbed_downstream=True)]
    with pytest.raises(ValueError, match=r"NormSite 'mlp_input': branch 'proj' is absorbed_downstream but absorbed_by "
                                         r"names no map for it; pass absorbed_by=\{'proj': <the nn\.Linear"):
        NormSite(4, branches, ScaleStrategy(), layer=0, site="mlp_input")
    with pytest.raises(ValueError, match=r"absorbed_by names 'fc', which is not a branch declared "
                                         r"absorbed_downstream=True \(branches: \['fc', 'proj'\]\)"):
        NormSite(4, branches, ScaleStrategy(), layer=0, site="mlp_input",
                 absorbed_by={"fc": nn.Linear(8, 4), "proj": nn.Linear(8, 4)})
    down = nn.Linear(8, 4, bias=False)
    site = NormSite(4, branches, ScaleStrategy(), layer=0, site="mlp_input", absorbed_by={"proj": down})
    assert site.factors("proj").absorbed_by is down.weight and site.factors("fc").absorbed_by is None


# -- the boundary: outside scale/, nobody reads site internals or tests a vector's class ------------------------
SITE_INTERNALS = re.compile(r"\.placement\[|\.placement_key\(|\.normalizes\(|\.out_scale\b|\.output_scale\("
                            r"|\.expert_scales\b|_next_maps|\.absorbed_by\(|\._expert_columns\(|\._u_full\(")
SHIPPED_CHECK = re.compile(r"isinstance\([^)]*\b(" + "|".join(c.__name__ for c in SHIPPED) + r")\b")


def _library_files():
    """The library's Python files: those git tracks (work in progress of a shared tree is not yet the library), or
    every one outside a git checkout."""
    import subprocess

    try:
        listed = subprocess.run(["git", "ls-files", "scalevec_lit", "callbacks"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = []
    if listed:
        return [ROOT / p for p in listed if p.endswith(".py")]
    return sorted(p for folder in ("scalevec_lit", "callbacks") for p in (ROOT / folder).rglob("*.py"))


def test_nothing_outside_scale_reads_site_internals_or_tests_a_shipped_class():
    internals, chains = [], []
    files = _library_files()
    assert any(p.name == "sites.py" for p in files)  # the scan sees the library
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if SHIPPED_CHECK.search(line):
                chains.append(f"{rel}:{n}: {line.strip()}")
            if not rel.startswith("scalevec_lit/scale/") and SITE_INTERNALS.search(line):
                internals.append(f"{rel}:{n}: {line.strip()}")
    assert chains == [], "isinstance over shipped ScaleVector classes (use the ScaleVector contract)"
    assert internals == [], ("site internals read outside scalevec_lit/scale/ (use NormSite.factors, input_scales, "
                             "output_vector, expert_factors / expert_output / expert_parameters)")
