"""The plan asks the sites (issue 33, item 3): what a placement means (which branches normalize, what a branch
keeps for the backward on CPU and on an accelerator, which branches moved, whether a site divides an input
scale's size out) is answered in ``scale/`` (``scale/keeps.py`` and the sites' methods), and no file outside
``scalevec_lit/scale/`` reads a placement (an ``ast`` scan for attribute access named ``placement``).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import ROOT, tiny_config
from scalevec_lit.model import Transformer
from scalevec_lit.scale import BRANCHES, MagnitudeDirectionScale, NoScale, OutputNorm, PlainScale, ScaleStrategy
from scalevec_lit.scale.keeps import (BranchKeeps, branch_keeps, branch_normalizes, moved_branches,
                                      normalized_branches, placement_data)

#: the folders of the package's code (``callbacks/`` is installed as ``scalevec_lit.callbacks``)
PACKAGES = ("scalevec_lit", "callbacks", "benchmarks")
OWNER = Path("scalevec_lit") / "scale"


def placement_readers(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """``file:line`` of every read of an attribute named ``placement`` (``x.placement`` or ``getattr(x,
    "placement")``) in the ``.py`` files of ``packages`` under ``root``, those of ``scalevec_lit/scale/`` apart."""
    found = []
    for package in packages:
        for f in sorted((root / package).rglob("*.py")):
            rel = f.relative_to(root)
            if rel.parts[:2] == OWNER.parts:
                continue
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), filename=str(f))):
                attr = isinstance(node, ast.Attribute) and node.attr == "placement"
                by_name = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                           and node.func.id in ("getattr", "hasattr") and len(node.args) > 1
                           and isinstance(node.args[1], ast.Constant) and node.args[1].value == "placement")
                if attr or by_name:
                    found.append(f"{rel.as_posix()}:{node.lineno}")
    return found


def test_nothing_outside_scale_reads_a_placement():
    assert placement_readers(ROOT) == []


def test_the_scan_finds_a_reader_and_leaves_the_rest(tmp_path):
    for rel, text in {
        "scalevec_lit/lit/count.py": "def f(s):\n    return s.placement.of('q')\n",
        "callbacks/mon.py": "x = 1\n\n\ndef g(site):\n    return getattr(site, 'placement', {})\n",
        "scalevec_lit/scale/own.py": "def h(s):\n    return s.placement\n",  # the owner may
        "benchmarks/ok.py": "S = dict(placement=dict(q='dual_norm'))\n\n\ndef d(t):\n    return t.placements\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    assert placement_readers(tmp_path) == ["scalevec_lit/lit/count.py:2", "callbacks/mon.py:5"]


MIXED = dict(q="dual_norm", k="dual", v="output", gate="dual_norm")


def test_which_branches_normalize():
    s = ScaleStrategy(placement=MIXED)
    assert [b for b in BRANCHES if branch_normalizes(s, b)] == ["q", "gate"]
    assert normalized_branches(s) == ("q", "gate")
    assert normalized_branches(s, ("up", "gate", "v", "q")) == ("gate", "q")
    assert normalized_branches(ScaleStrategy()) == ()


def test_what_a_branch_keeps_on_cpu_and_on_an_accelerator():
    s = ScaleStrategy(vector=PlainScale, placement=MIXED)
    assert branch_keeps(s, "q", on_accelerator=True) == BranchKeeps(reciprocal_rms=True, normalized_input=True)
    assert branch_keeps(s, "q", on_accelerator=False) == BranchKeeps(reciprocal_rms=True, normalized_input=False)
    assert branch_keeps(s, "gate") == BranchKeeps(reciprocal_rms=True, normalized_input=True)
    for b in ("k", "v", "up", "router"):  # not normalized: nothing kept beyond the projection, wherever it runs
        assert branch_keeps(s, b, True) == branch_keeps(s, b, False) == BranchKeeps(False, False)
    # no output scale u (γ ≡ 1): group_norm_rope has no u_j to test, so the input is not kept on an accelerator
    assert branch_keeps(ScaleStrategy(vector=NoScale, placement=MIXED), "q", True) == BranchKeeps(True, False)


def test_moved_branches_and_the_placement_as_data():
    s = ScaleStrategy(placement=MIXED)
    assert list(moved_branches(s).items()) == [("q", "dual_norm"), ("k", "dual"), ("v", "output"), ("gate", "dual_norm")]
    assert moved_branches(ScaleStrategy()) == {}
    assert placement_data(s) == {"q": "dual_norm", "k": "dual", "v": "output", "gate": "dual_norm", "up": "input",
                                 "router": "input"}
    assert list(placement_data(s)) == list(BRANCHES)


def _sites(strategy: ScaleStrategy):
    model = Transformer(tiny_config(n_layer=1), strategy)
    block = model.blocks[0]
    return block.attn.input, block.mlp.input, model


@pytest.mark.usefixtures("one_thread")
def test_a_site_says_whether_it_divides_an_input_scale_size_out():
    hg = ScaleStrategy(vector=MagnitudeDirectionScale, branch_specific=True, sublayer_output_norm=True,
                       placement=dict(q="dual_norm", k="dual_norm"))
    attn, mlp, model = _sites(hg)
    by_key = {s.key: s.vector for s in attn.input_scales()}
    assert [k for k, v in by_key.items() if attn.divides_size_out(v)] == ["q", "k"]  # v reads its own, un-normalized
    assert not any(mlp.divides_size_out(s.vector) for s in mlp.input_scales())
    assert not attn.divides_size_out(next(iter(mlp.input_scales())).vector)  # not one of its own
    outs = [m for m in model.modules() if isinstance(m, OutputNorm)]
    assert outs and not any(o.divides_size_out(v) for o in outs for _, v in o.scale_vectors())
    # one shared γ: divided out only when every branch that reads it normalizes
    for placement, expected in ((dict(q="dual_norm", k="dual_norm"), False),
                                (dict(q="dual_norm", k="dual_norm", v="dual_norm"), True)):
        attn, _, _ = _sites(ScaleStrategy(vector=MagnitudeDirectionScale, placement=placement))
        [shared] = attn.input_scales()
        assert shared.branches == ("q", "k", "v") and attn.divides_size_out(shared.vector) is expected
