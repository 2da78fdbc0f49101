"""RoleWeightDecay: exact references per role, part and preset (the hand-computed decay of a run whose loss is 0),
the groups it leaves alone, the note when nothing decays scale vectors, and its errors (key, value, fix)."""
from __future__ import annotations

import logging
from functools import partial

import pytest
import torch

from callback_runs import QK_NORM, UNIFIED, VOCAB, LrRecorder, Start, _decayed, _fit, _lm
from helpers import tiny_config
from scalevec_lit.callbacks import RoleWeightDecay
from scalevec_lit.lit.optim import build_param_groups
from scalevec_lit.lit.schedules import WarmupCosine
from scalevec_lit.model.transformer import Transformer
from scalevec_lit.scale.registry import scale_parameters

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# -- RoleWeightDecay --------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset, decays", [("iwd", {"input"}), ("decay_all", {"input", "output"}), ("decay_none", set())])
def test_role_decay_matches_the_hand_computed_reference(preset, decays, caplog):
    """AdamW λ=0.1, warmup+cosine, the scale group at lr_mult 2: after 5 steps each scale is exactly
    1 · Π_k (1 − lr_k λ) for the decayed roles and exactly 1 for the others (output role: QK-norm u)."""
    caplog.set_level(logging.INFO)
    schedule = WarmupCosine(warmup_steps=2, min_lr_ratio=0.1)
    lm = _lm(QK_NORM, partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1), schedule,
             param_groups={"scale": {"lr_mult": 2.0}})
    rec, start = LrRecorder(), Start()
    _, caught = _fit(lm, [RoleWeightDecay(preset=preset), rec.callback, start.callback], steps=5)
    scale_lrs = [0.02 * schedule(k) for k in range(5)]
    assert [r["scale"] for r in rec.lrs] == scale_lrs  # the scheduled lr of the scale group, step by step
    roles = {}
    for sp in scale_parameters(lm.model):
        roles.setdefault(sp.info.role, []).append(sp)
        expected = _decayed(torch.ones_like(sp.param), scale_lrs, 0.1) if sp.info.role in decays else torch.ones_like(sp.param)
        assert torch.equal(sp.param.detach(), expected), (preset, sp.info.tag)
    assert set(roles) == {"input", "output"} and len(roles["output"]) == 4  # u on q and k, two layers
    # the same formula as AdamW's own decay of the matrices (λ = 0.1 at the matrix group's lr)
    w0 = start.state["blocks.0.attn.o.weight"]
    assert torch.equal(lm.model.blocks[0].attn.o.weight.detach(), _decayed(w0, [0.01 * schedule(k) for k in range(5)], 0.1))
    assert not any("scale vectors are not decayed" in m for m in caught)
    table = caplog.text  # printed at fit start through Lightning's rank-zero logger
    assert f"RoleWeightDecay (preset {preset})" in table
    lam_in, lam_out = ("0.1" if "input" in decays else "0"), ("0.1" if "output" in decays else "0")
    assert any(line.split()[:6] == ["scale", "input", "attn_input", "scale", "2", "128"] and line.split()[6] == lam_in
               for line in table.splitlines())
    assert any(line.split()[:4] == ["scale", "output", "attn_proj", "scale"] and line.split()[6] == lam_out
               for line in table.splitlines())


def test_part_and_role_overrides_with_magnitude_direction():
    """Unified strategy, SGD lr 0.1, explicit λ 0.05, the magnitude part left free: only input-role
    directions move, by exactly (1 − 0.1 · 0.05)^3."""
    lm = _lm(UNIFIED, partial(torch.optim.SGD, lr=0.1, weight_decay=0.0))
    _fit(lm, [RoleWeightDecay(weight_decay=0.05, part_weight_decay={"magnitude": 0.0})], steps=3)
    seen = set()
    for sp in scale_parameters(lm.model):
        seen.add((sp.info.role, sp.info.part))
        if sp.info.role == "input" and sp.info.part == "direction":
            assert torch.equal(sp.param.detach(), _decayed(torch.ones_like(sp.param), [0.1] * 3, 0.05)), sp.info.tag
        else:
            assert torch.equal(sp.param.detach(), torch.ones_like(sp.param)), sp.info.tag
    assert seen == {("input", "magnitude"), ("input", "direction"), ("output", "magnitude"), ("output", "direction")}


def test_ndim_and_all_presets_set_the_other_groups_consistently():
    opt = partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1)
    lm = _lm(QK_NORM, opt)
    trainer, _ = _fit(lm, [RoleWeightDecay(preset="ndim")], steps=2)
    decay = {g["name"]: g["weight_decay"] for g in trainer.optimizers[0].param_groups}
    assert decay == {"matrix": 0.1, "embedding": 0.1, "head": 0.1, "scale": 0.0}  # >=2-D decayed, as nanoGPT
    assert all(torch.equal(sp.param.detach(), torch.ones_like(sp.param)) for sp in scale_parameters(lm.model))

    lm, start = _lm(QK_NORM, opt), Start()
    trainer, _ = _fit(lm, [RoleWeightDecay(preset="all"), start.callback], steps=2)
    e0 = start.state["embed.weight"]
    decay = {g["name"]: g["weight_decay"] for g in trainer.optimizers[0].param_groups}
    assert decay == {"matrix": 0.1, "embedding": 0.1, "head": 0.1, "scale": 0.0}  # scales: by the callback
    # every parameter decays by the same rule: the embedding through AdamW, the scales through the callback
    assert torch.equal(lm.model.embed.weight.detach(), _decayed(e0, [0.01, 0.01], 0.1))
    for sp in scale_parameters(lm.model):
        assert torch.equal(sp.param.detach(), _decayed(torch.ones_like(sp.param), [0.01, 0.01], 0.1)), sp.info.tag


def test_without_role_decay_the_module_says_scales_are_not_decayed():
    lm = _lm(QK_NORM, partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1))
    _, caught = _fit(lm, [], steps=1)
    assert any("scale vectors are not decayed" in m and "RoleWeightDecay" in m for m in caught)
    assert all(torch.equal(sp.param.detach(), torch.ones_like(sp.param)) for sp in scale_parameters(lm.model))


def test_role_decay_errors_name_key_value_and_fix():
    with pytest.raises(ValueError, match=r"RoleWeightDecay.preset: 'iwdd' is not one of iwd, decay_all, decay_none, ndim, all"):
        RoleWeightDecay(preset="iwdd")
    with pytest.raises(ValueError, match=r"RoleWeightDecay.role_weight_decay: \['inputs'\] are not roles; use input"):
        RoleWeightDecay(role_weight_decay={"inputs": 0.1})
    with pytest.raises(ValueError, match=r"RoleWeightDecay.weight_decay: -0.1 is negative"):
        RoleWeightDecay(weight_decay=-0.1)
    model = Transformer(tiny_config(vocab_size=VOCAB))
    with pytest.raises(ValueError, match=r"part_weight_decay: \['magnitud'\] are not parts of scale vectors; use some of "
                                         r"direction, magnitude, scale"):
        RoleWeightDecay(part_weight_decay={"magnitud": 0.0}).build_plan(model, torch.optim.AdamW(build_param_groups(model)))
    with pytest.raises(ValueError, match=r"scale parameter .* sits in optimizer group 0 with weight_decay=0.1; the "
                                         r"optimizer must not decay scale vectors"):
        RoleWeightDecay().build_plan(model, torch.optim.AdamW(model.parameters(), weight_decay=0.1))
    with pytest.raises(ValueError, match=r"RoleWeightDecay.weight_decay: None and the optimizer has no 'matrix' "
                                         r"parameter group .* --trainer.callbacks.init_args.weight_decay=0.1"):
        RoleWeightDecay().build_plan(model, torch.optim.SGD(model.parameters(), lr=0.1))
    # explicit λ works without kinds, and a mixed group under ndim is refused
    RoleWeightDecay(weight_decay=0.1).build_plan(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"preset: 'ndim' sets each group's weight decay, but group 0 mixes scale"):
        RoleWeightDecay(preset="ndim", weight_decay=0.1).build_plan(model, torch.optim.SGD(model.parameters(), lr=0.1))
