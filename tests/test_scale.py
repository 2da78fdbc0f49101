"""Scale vectors: parameterizations, roles per preset, exact folding, composable presets, cost."""
from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers import ROOT, module_from_config, print_config, recipe, smoke_args, tiny_config
from scalevec_lit.model import SIZES, Transformer, count_parameters
from scalevec_lit.scale import (
    INPUT, OUTPUT, ExpMagnitudeDirectionScale, MagnitudeDirectionScale, NoScale, PlainScale, ScaleStrategy,
    ScaleVector, UnitOffsetScale, fold_scales, scale_parameters,
)

PRESETS = sorted(Path(p).stem for p in glob.glob(str(ROOT / "recipes" / "strategy" / "*.yaml")))


def strategy_of(preset: str) -> ScaleStrategy:
    """The ScaleStrategy a preset file resolves to (through the real CLI parser)."""
    text = print_config("--config", recipe("smoke.yaml"), "--config", recipe("strategy", f"{preset}.yaml"))
    return module_from_config(text).strategy


def test_presets_present():
    assert set(PRESETS) >= {"no_scale", "baseline", "unit_offset", "hg", "dp", "dnp", "or", "er", "unified"}


# -- parameterizations -------------------------------------------------------------------------------
def test_parameterization_formulas():
    d = 6
    assert NoScale(d).is_identity and not list(NoScale(d).parameters())
    p = PlainScale(d)
    torch.testing.assert_close(p(), torch.ones(d))
    u = UnitOffsetScale(d)
    torch.testing.assert_close(u(), torch.ones(d))
    with torch.no_grad():
        u.scale.fill_(0.5)
    torch.testing.assert_close(u(), torch.full((d,), 1.5))
    m = MagnitudeDirectionScale(d)
    torch.testing.assert_close(m(), torch.ones(d))
    alpha = torch.arange(1.0, d + 1)
    with torch.no_grad():
        m.magnitude.fill_(2.0)
        m.direction.copy_(alpha)
    torch.testing.assert_close(m(), 2.0 * alpha / alpha.pow(2).mean().sqrt())
    e = ExpMagnitudeDirectionScale(d)
    torch.testing.assert_close(e(), torch.ones(d))
    with torch.no_grad():
        e.magnitude.fill_(0.3)
        e.direction.copy_(alpha)
    torch.testing.assert_close(e(), torch.exp(torch.tensor(0.3)) * alpha / alpha.pow(2).mean().sqrt())
    assert set(m.parts()) == {"magnitude", "direction"} and set(p.parts()) == {"scale"}


class SoftplusScale(ScaleVector):
    """A user-defined parameterization: γ = softplus(w) / softplus(0), w init 0 (so γ starts at 1)."""

    def __init__(self, dim: int, sharpness: float = 1.0) -> None:
        super().__init__(dim)
        self.sharpness = sharpness
        self.scale = torch.nn.Parameter(torch.zeros(dim))

    def forward(self) -> torch.Tensor:
        return F.softplus(self.sharpness * self.scale) / F.softplus(torch.zeros(()))

    def reset_parameters(self) -> None:
        torch.nn.init.zeros_(self.scale)


def test_new_parameterization_is_one_class_chosen_from_yaml(prepared_data, tmp_path):
    from scalevec_lit.cli import main

    preset = tmp_path / "softplus.yaml"
    preset.write_text(
        "model:\n  strategy:\n    vector:\n"
        f"      class_path: {SoftplusScale.__module__}.SoftplusScale\n      init_args: {{sharpness: 2.0}}\n"
        "    branch_specific: true\n"
    )
    cli = main(smoke_args(prepared_data, tmp_path, 10, "--config", str(preset), "--trainer.logger=false",
                          "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false"))
    model = cli.model.model
    vectors = {type(sp.vector).__name__ for sp in scale_parameters(model)}
    assert vectors == {"SoftplusScale"}
    assert model.blocks[0].attn.input.scales["q"].sharpness == 2.0
    moved = max((sp.param.detach().abs().max().item() for sp in scale_parameters(model)))
    assert moved > 1e-4  # trained: w left its init 0


def test_bad_vector_is_refused():
    with pytest.raises(TypeError, match="model.strategy.vector: .* built a Linear, not a ScaleVector"):
        ScaleStrategy(vector=lambda d: torch.nn.Linear(d, d)).make_vector(4)


# -- roles ---------------------------------------------------------------------------------------
def expected_role(site: str, branch: str, placement: dict) -> str:
    """The absorbability rule of docs/PAPER.md §1/§3b, written independently of the sites' code."""
    if site in ("attn_input", "mlp_input", "final"):
        return INPUT  # the next linear map absorbs γ: W (γ ⊙ x̂) = (W diag γ) x̂
    if site in ("attn_output", "mlp_output"):
        return OUTPUT  # the residual add follows: no linear map to absorb it
    if site in ("attn_proj", "mlp_proj"):
        if placement[branch] != "dual_norm":
            return INPUT  # u ⊙ W x̂ = (diag u W) x̂
        return INPUT if branch in ("v", "up") else OUTPUT  # W_o / W_down absorb u on v / up
    raise AssertionError(site)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_registered_role_follows_the_rule(preset):
    strategy = strategy_of(preset)
    model = Transformer(tiny_config(), strategy)
    placement = vars(strategy.placement)
    registered = list(scale_parameters(model))
    if preset == "no_scale":
        assert registered == []
        return
    assert registered
    for sp in registered:
        assert sp.info.role == expected_role(sp.info.site, sp.info.branch, placement), sp.info
        assert sp.info.part in sp.vector.parts()
    sites = {(sp.info.site, sp.info.branch) for sp in registered}
    if strategy.branch_specific:
        assert {("attn_input", b) for b in "qkv"} | {("mlp_input", "gate"), ("mlp_input", "up")} <= sites
    else:
        assert ("attn_input", "shared") in sites and ("mlp_input", "shared") in sites
    names = {sp.name for sp in registered}
    assert len(names) == len(registered) and all(names)


# -- presets train -----------------------------------------------------------------------------------
@pytest.mark.slow  # a Lightning fit of the smoke recipe per preset (~3 CPU-seconds each)
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_on_the_smoke_recipe(preset, prepared_data, tmp_path):
    from scalevec_lit.cli import main

    cli = main(smoke_args(prepared_data, tmp_path, 6, "--config", recipe("strategy", f"{preset}.yaml"),
                          "--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
                          "--trainer.limit_val_batches=0"))
    assert cli.trainer.global_step == 6
    loss = cli.trainer.callback_metrics["train/loss"]
    assert torch.isfinite(loss) and loss < 8.3  # below the uniform-prediction loss ln(4096) = 8.32


# -- folding -------------------------------------------------------------------------------------
def _train(model: Transformer, steps: int, data_dir: Path) -> None:
    from scalevec_lit.data.datamodule import TokenDataModule

    dm = TokenDataModule(str(data_dir), seq_len=model.config.seq_len, batch_size=8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    it = iter(dm.train_dataloader())
    for _ in range(steps):
        batch = next(it).long()
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.slow  # 50 AdamW steps per preset (~1 CPU-second each)
@pytest.mark.parametrize("preset", PRESETS)
def test_fold_is_exact_after_training(preset, prepared_data):
    strategy = strategy_of(preset)
    model = Transformer(tiny_config(), strategy)
    # 50 steps at 1e-2 move every preset's γ by 0.22 to 0.40 from its mean (measured), four times the bar below
    _train(model, 50, prepared_data)
    # Training ran in float32 (its trajectory differs across CPU kinds and thread counts, which is fine);
    # the fold is then checked in float64, where "exact" means reduction-order rounding (~1e-15).
    model.double().eval()
    gammas = [sp.vector().detach() for sp in scale_parameters(model)]
    if preset != "no_scale":
        assert max((g - g.mean()).abs().max().item() for g in gammas) > 0.05  # scales are non-trivial
    folded = fold_scales(model).eval()
    left = list(scale_parameters(folded))
    assert all(sp.info.role == OUTPUT for sp in left)
    assert len(left) == sum(sp.info.role == OUTPUT for sp in scale_parameters(model))
    idx = torch.randint(0, 4096, (4, 32))
    with torch.no_grad():
        a, b = model(idx), folded(idx)
    rel = ((a - b).abs().max() / a.abs().max()).item()
    assert rel <= 1e-10, rel
    if not left:  # (theory a) input-role scales add no expressivity: a scale-free model computes the same function
        # (scale-free, not norm-free: a DNP placement keeps its parameter-free per-head norm)
        scale_free = ScaleStrategy(vector=NoScale, placement=strategy.placement, eps=strategy.eps)
        plain = Transformer(tiny_config(), scale_free).double()
        plain.load_state_dict(folded.state_dict(), strict=True)
        with torch.no_grad():
            c = plain.eval()(idx)
        assert ((a - c).abs().max() / a.abs().max()).item() <= 1e-10


def test_fold_unties_a_tied_head():
    model = Transformer(tiny_config(tie_embeddings=True)).double()
    with torch.no_grad():
        model.final.scales["shared"].scale.uniform_(0.5, 1.5)
    folded = fold_scales(model)
    assert folded.head_weight is not folded.embed.weight and not folded.tied
    torch.testing.assert_close(folded.embed.weight, model.embed.weight)
    idx = torch.randint(0, 4096, (2, 8))
    torch.testing.assert_close(folded(idx), model(idx), rtol=1e-10, atol=1e-12)


# -- cost ------------------------------------------------------------------------------------------
def test_unified_adds_under_a_tenth_of_a_percent_at_0_12b():
    base = count_parameters(SIZES["dense_0.12b"], strategy_of("baseline"))
    unified = count_parameters(SIZES["dense_0.12b"], strategy_of("unified"))
    added = (unified.total - base.total) / base.total
    assert 0 < added < 1e-3, added
    assert unified.scale > base.scale
    nothing = count_parameters(SIZES["dense_0.12b"], strategy_of("no_scale"))
    assert nothing.scale == 0 and base.total - nothing.total == base.scale
