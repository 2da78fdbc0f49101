"""Training rules of decay and the optimizer (issue 23, part C), each checked against a step computed by hand:
Muon + MoE decay per group and role, the ndim/all presets and Muon's own λ, a non-finite step skipped for
every parameter (scale vectors included), no decay without a gradient, part overrides and output-role
scales, and a negative lr_mult refused."""
from __future__ import annotations

import copy
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from helpers import check, fit, tiny_config
from scalevec_lit.callbacks import RoleWeightDecay
from scalevec_lit.errors import UserError
from scalevec_lit.lit.module import CausalLM
from scalevec_lit.lit.optim import MuonAdamW, build_param_groups, instantiate_optimizer
from scalevec_lit.lit.schedules import Constant
from scalevec_lit.model import MoEConfig, Transformer
from scalevec_lit.scale.registry import scale_parameters
from scalevec_lit.scale.strategy import ScaleStrategy

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

VOCAB = 64
# q/k dual norm: output-role u vectors beside the input-role γ (two roles to tell apart)
QK_NORM = dict(branch_specific=False, placement=dict(q="dual_norm", k="dual_norm"), output_shape="head")
LR, MUON_LR, WD, MUON_WD = 0.01, 0.05, 0.1, 0.02


def _moe_model() -> Transformer:
    moe = MoEConfig(num_experts=4, top_k=2, expert_intermediate_size=16, scales="expert")
    return Transformer(tiny_config(vocab_size=VOCAB, moe=moe), ScaleStrategy(**QK_NORM)).double()


def _zero_grads(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.grad = torch.zeros_like(p)


# -- (1) and (2): Muon on an MoE model --------------------------------------------------------------------
#: preset -> λ by what a parameter is: hidden 2-D matrices (Muon), stacked 3-D experts (AdamW), embedding,
#: head, input-role and output-role scale vectors. Muon's λ (0.02) is the matrix kind's, whichever optimizer
#: holds the tensor; the presets never change it on Muon's own group.
EXPECTED = {
    "iwd": dict(muon=MUON_WD, experts=MUON_WD, embedding=0.0, head=WD, input=MUON_WD, output=0.0),
    "all": dict(muon=MUON_WD, experts=MUON_WD, embedding=MUON_WD, head=MUON_WD, input=MUON_WD, output=MUON_WD),
    "ndim": dict(muon=MUON_WD, experts=MUON_WD, embedding=MUON_WD, head=MUON_WD, input=0.0, output=0.0),
}


@pytest.mark.parametrize("preset", list(EXPECTED))
def test_muon_moe_step_decays_every_parameter_by_its_group_and_role(preset):
    """float64, one step with zero gradients (Muon's and AdamW's updates are then exactly 0): every parameter
    is exactly p0 · (1 − lr · λ) with the lr and λ stated in ``EXPECTED``, computed here by hand."""
    model = _moe_model()
    opt = instantiate_optimizer(partial(MuonAdamW, lr=LR, muon_lr=MUON_LR, weight_decay=WD, muon_weight_decay=MUON_WD),
                                build_param_groups(model))
    cb = RoleWeightDecay(preset=preset)
    trainer = SimpleNamespace(optimizers=[opt])
    cb.on_fit_start(trainer, model)
    cb.on_train_start(trainer, model)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    _zero_grads(model)
    cb.on_before_optimizer_step(trainer, model, opt)
    opt.step()

    want = EXPECTED[preset]
    roles = {id(sp.param): sp.info.role for sp in scale_parameters(model)}
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in roles:
            what, lr = roles[id(p)], LR
        elif p is model.embed.weight:
            what, lr = "embedding", LR
        elif p is model.head_weight:
            what, lr = "head", LR
        elif p.ndim == 3:
            what, lr = "experts", LR  # stacked experts: AdamW's step size
        else:
            assert p.ndim == 2, name
            what, lr = "muon", MUON_LR
        seen.add(what)
        assert p.dtype == torch.float64
        assert torch.equal(p.detach(), start[name] * (1 - lr * want[what])), (preset, name, what)
    assert seen == set(want)


def test_muon_group_keeps_its_own_decay_under_the_presets():
    """ndim/all leave a Muon-held group's λ as configured, also when it differs from λ_matrix (a second Muon kind)."""
    model = _moe_model()
    groups = build_param_groups(model, {"head": {"weight_decay": 0.0}})
    opt = instantiate_optimizer(partial(MuonAdamW, lr=LR, muon_lr=MUON_LR, weight_decay=WD, muon_weight_decay=MUON_WD,
                                        muon_kinds=("matrix", "head")), groups)
    for preset in ("ndim", "all"):
        rows = RoleWeightDecay(preset=preset).build_plan(model, opt)
        decay = {g["name"]: g["weight_decay"] for g in opt.param_groups}
        assert decay["head"] == 0.0 and decay["matrix"] == MUON_WD and decay["matrix_nd"] == MUON_WD
        assert decay["embedding"] == MUON_WD
        assert [r[4] for r in rows if r[0] in ("matrix", "head")] == ["Muon (its own λ; the preset leaves it)"] * 2


# -- (3): a non-finite step skipped -----------------------------------------------------------------------
class PoisonedLM(CausalLM):
    """The loss of training batch ``bad`` (a micro-batch under gradient accumulation) is NaN."""

    bad = 2

    def training_step(self, batch, batch_idx):
        self._batch_idx = batch_idx
        return super().training_step(batch, batch_idx)

    def _loss(self, batch):
        loss, n = super()._loss(batch)
        return (loss * float("nan"), n) if self.training and self._batch_idx == self.bad else (loss, n)


class Snapshots:
    """The parameters before and after every optimizer step (its first and last micro-batch), by global step."""

    def __init__(self):
        from lightning.pytorch.callbacks import Callback

        outer = self
        self.before: dict[int, dict] = {}
        self.after: dict[int, dict] = {}

        class _CB(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                outer.step = trainer.global_step
                if outer.step not in outer.before:
                    outer.before[outer.step] = copy.deepcopy(pl_module.model.state_dict())

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                outer.after[outer.step] = copy.deepcopy(pl_module.model.state_dict())

        self.callback = _CB()


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("deferred", [False, True], ids=["immediate", "deferred"])
def test_a_skipped_nonfinite_step_leaves_every_parameter_bitwise_unchanged(deferred, accumulate, monkeypatch):
    """nonfinite: skip, fused AdamW (deferred: the CUDA path on a CPU, the step skipped through found_inf), a NaN
    loss at step 2 (with accumulation: its second micro-batch, after a finite one): no parameter changes in that
    step, scale vectors included; the steps around it do decay them."""
    import lightning as L

    from scalevec_lit.lit import nonfinite

    monkeypatch.setattr(nonfinite, "DEFERRED_ON_CPU", deferred)
    lm = PoisonedLM(config=tiny_config(vocab_size=VOCAB), strategy=ScaleStrategy(**QK_NORM), schedule=Constant(),
                    optimizer=partial(torch.optim.AdamW, lr=LR, weight_decay=WD, fused=True), nonfinite="skip")
    lm.bad = 2 * accumulate + accumulate - 1  # the last micro-batch of step 2
    snaps = Snapshots()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, accumulate_grad_batches=accumulate,
                        callbacks=[RoleWeightDecay(), snaps.callback])
    with pytest.warns(UserWarning, match=r"non-finite loss nan at step 2\b.*: step skipped \(1 so far\)"):
        trainer.fit(lm, train_dataloaders=DataLoader(torch.randint(0, VOCAB, (32, 33)), batch_size=4))
    assert lm.skipped_steps == 1 and sorted(snaps.after) == [0, 1, 2, 3]
    before, after = snaps.before[2], snaps.after[2]
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == []
    inputs = [sp.name for sp in scale_parameters(lm.model) if sp.info.role == "input"]
    assert inputs and all(n in before for n in inputs)
    for step in (1, 3):  # the finite steps around it decay the input-role scales (the check above is not vacuous)
        moved = [n for n in inputs if not torch.equal(snaps.before[step][n], snaps.after[step][n])]
        assert moved == inputs, step


# -- (4): no gradient, no decay ---------------------------------------------------------------------------
def test_no_decay_for_a_parameter_without_a_gradient_as_adamw():
    """Half the scale vectors get a (zero) gradient: the library's step equals AdamW's own decoupled decay of
    the same tensors, which leaves a tensor without a gradient untouched (checked on AdamW itself too)."""
    model = Transformer(tiny_config(vocab_size=VOCAB), ScaleStrategy(**QK_NORM)).double()
    opt = torch.optim.AdamW(build_param_groups(model), lr=LR, weight_decay=WD)
    cb = RoleWeightDecay(preset="decay_all")
    scales = [sp.param for sp in scale_parameters(model)]
    reference = [p.detach().clone().requires_grad_(True) for p in scales]
    ref_opt = torch.optim.AdamW(reference, lr=LR, weight_decay=WD)  # AdamW decays these itself
    with torch.no_grad():
        for i, (p, r) in enumerate(zip(scales, reference)):
            p.mul_(1 + 0.01 * i)
            r.copy_(p)
    start = [p.detach().clone() for p in scales]
    for i, (p, r) in enumerate(zip(scales, reference)):
        p.grad = torch.zeros_like(p) if i % 2 == 0 else None
        r.grad = torch.zeros_like(r) if i % 2 == 0 else None
    cb.on_before_optimizer_step(None, model, opt)
    opt.step()
    ref_opt.step()
    assert len(scales) >= 4
    for i, (p, r, s) in enumerate(zip(scales, reference, start)):
        assert torch.equal(p.detach(), r.detach()), i
        if i % 2:
            assert torch.equal(p.detach(), s), i  # no gradient: bitwise unchanged
        else:
            assert torch.equal(p.detach(), s * (1 - LR * WD)), i


# -- (5): part overrides and output-role scales -----------------------------------------------------------
def _decay_once(cb: RoleWeightDecay, model) -> dict[str, tuple[str, torch.Tensor, torch.Tensor]]:
    opt = torch.optim.AdamW(build_param_groups(model), lr=LR, weight_decay=WD)
    start = {sp.name: (sp.info.role, sp.param.detach().clone()) for sp in scale_parameters(model)}
    _zero_grads(model)
    cb.on_before_optimizer_step(None, model, opt)
    return {sp.name: (start[sp.name][0], start[sp.name][1], sp.param.detach()) for sp in scale_parameters(model)}


def test_a_part_override_never_decays_an_output_role_the_preset_leaves_free(capfd):
    model = Transformer(tiny_config(vocab_size=VOCAB), ScaleStrategy(**QK_NORM)).double()
    out = _decay_once(RoleWeightDecay(preset="iwd", part_weight_decay={"scale": 0.3}), model)
    assert {role for role, _, _ in out.values()} == {"input", "output"}
    for name, (role, before, after) in out.items():
        assert torch.equal(after, before * (1 - LR * 0.3) if role == "input" else before), name
    assert "warning:" not in capfd.readouterr().err


@pytest.mark.parametrize("how", ["preset", "role"])
def test_a_part_override_that_decays_output_role_scales_says_so_in_one_line(how, capfd):
    """decay_all (or role_weight_decay.output) decays the output role: a positive part override reaching those
    scales is applied as asked, with one warning line that names the key, the value, the count and the fix."""
    model = Transformer(tiny_config(vocab_size=VOCAB), ScaleStrategy(**QK_NORM)).double()
    kw = dict(preset="decay_all") if how == "preset" else dict(role_weight_decay={"output": 0.05})
    out = _decay_once(RoleWeightDecay(part_weight_decay={"scale": 0.3}, **kw), model)
    for name, (role, before, after) in out.items():
        assert torch.equal(after, before * (1 - LR * 0.3)), name
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]
    by = "preset decay_all" if how == "preset" else "role_weight_decay.output"
    assert lines == [
        "warning: RoleWeightDecay.part_weight_decay.scale: 0.3: also decays 4 output-role scale vector(s) (attn_proj; "
        f"role output is decayed by {by}), and the paper finds that decaying output-role scales hurts; to decay "
        "input-role scales only, set role_weight_decay: {output: 0.0}"
    ]


# -- (6): a negative lr_mult ------------------------------------------------------------------------------
def test_negative_lr_mult_is_refused_with_the_key():
    model = Transformer(tiny_config(vocab_size=VOCAB))
    with pytest.raises(UserError) as info:
        build_param_groups(model, {"head": {"lr_mult": -0.5}})
    assert str(info.value) == (
        "model.param_groups.head.lr_mult: -0.5: a negative multiplier makes the head group's learning rate negative, "
        "so it would train by gradient ascent (climb the loss); set a multiplier >= 0 (1 keeps the optimizer's lr, "
        "0 freezes the group), e.g. --model.param_groups.head.lr_mult=1.0")
    with pytest.raises(UserError, match=r"^model.param_groups.scale.weight_decay: -0.1: a negative weight decay"):
        build_param_groups(model, {"scale": {"weight_decay": -0.1}})
    with pytest.raises(UserError, match=r"^model.param_groups.matrix.lr_mult: nan: is not a finite number"):
        build_param_groups(model, {"matrix": {"lr_mult": float("nan")}})
    assert [g["name"] for g in build_param_groups(model, {"head": {"lr_mult": 0.0}})]  # 0 (frozen) is allowed


def test_negative_lr_mult_on_the_command_line_exits_2_before_the_run(world, capfd):
    check(world, capfd, fit(world, "--model.param_groups={embedding: {lr_mult: -1}}"), 2,
          "error: model.param_groups.embedding.lr_mult: -1: a negative multiplier", "gradient ascent",
          "--model.param_groups.embedding.lr_mult=1.0")
    assert not (world.path / "out").exists()
