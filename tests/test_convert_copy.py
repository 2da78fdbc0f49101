"""``convert`` to the strategy a run was trained with is a copy (issue 32 item 3, issue 36 item 3): "the same
strategy" compares resolved strategies (every default argument of the vector class filled on both sides), so a
run's recorded strategy (jsonargparse records the defaults) and its preset file (which leaves them out) are the
same strategy, and the copy is bitwise for every preset, in float32 and float64, and for a user class without an
inverse. A refusal advises only the presets that keep this model exactly, computed for this model.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from helpers import ROOT, tiny_config
from scalevec_lit.errors import UserError
from scalevec_lit.hub import convert as hub_convert
from scalevec_lit.hub.convert import convert_model, read_strategy, same_strategy
from scalevec_lit.model import Transformer
from scalevec_lit.scale import ScaleStrategy, ScaleVector, scale_parameters

PRESETS = sorted((ROOT / "recipes" / "strategy").glob("*.yaml"))
CFG = dict(vocab_size=128, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48)


def recorded(path: Path) -> ScaleStrategy:
    """The strategy as a run records it: the preset's ``model.strategy`` through jsonargparse (as ``fit`` does),
    which fills the vector class's default arguments into its ``init_args``."""
    from jsonargparse import ArgumentParser

    section = yaml.safe_load(path.read_text())["model"]["strategy"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ScaleStrategy, "strategy")
    return parser.instantiate(parser.parse_object({"strategy": section})).strategy


def _trained(strategy: ScaleStrategy, dtype: torch.dtype) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(tiny_config(**CFG), strategy).to(dtype)
    with torch.no_grad():  # every parameter away from its initial value, as after training
        for p in model.parameters():
            p.mul_(1 + 0.3 * torch.rand_like(p))
    return model.eval()


def _assert_bitwise(copy: nn.Module, model: nn.Module) -> None:
    mine, theirs = copy.state_dict(), model.state_dict()
    assert list(mine) == list(theirs)
    differ = [k for k in mine if mine[k].dtype != theirs[k].dtype or not torch.equal(mine[k], theirs[k])]
    assert differ == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_converted_to_itself_is_a_bitwise_copy(preset, dtype):
    strategy = recorded(preset)
    model = _trained(strategy, dtype)
    target = read_strategy(preset, model.strategy.eps)  # the preset file, without the recorded defaults
    assert same_strategy(model, target)
    copy, report, moved = convert_model(model, target, value=str(preset))
    assert report.notes == ["the same strategy: a copy"] and report.changes == [] and moved == 0.0
    _assert_bitwise(copy, model)


class OffsetPowerScale(ScaleVector):
    """γ = (1 + w)^power, a user class with a default argument and no inverse."""

    def __init__(self, dim: int, power: float = 2.0) -> None:
        super().__init__(dim)
        self.power = float(power)
        self.scale = nn.Parameter(torch.zeros(dim))

    def forward(self) -> torch.Tensor:
        return (1.0 + self.scale).pow(self.power)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.scale)


def _user_preset(tmp_path: Path, init_args: dict) -> Path:
    vector = {"class_path": f"{__name__}.OffsetPowerScale", **({"init_args": init_args} if init_args else {})}
    path = tmp_path / "power.yaml"
    path.write_text(yaml.safe_dump({"model": {"strategy": {"vector": vector, "branch_specific": True}}}))
    return path


@pytest.mark.parametrize("file_args", [{}, {"power": 2.0}, {"power": 2}])
def test_a_user_class_recorded_with_its_defaults_is_the_same_strategy(tmp_path, file_args):
    """The run recorded ``power: 2.0`` (jsonargparse fills it); the file may leave it out or spell it ``2``."""
    preset = _user_preset(tmp_path, file_args)
    model = _trained(recorded(preset), torch.float32)
    assert [sp.vector.power for sp in scale_parameters(model)][:1] == [2.0]
    copy, report, moved = convert_model(model, read_strategy(preset, model.strategy.eps), value=str(preset))
    assert report.notes == ["the same strategy: a copy"] and moved == 0.0
    _assert_bitwise(copy, model)


def test_a_user_class_with_another_argument_is_another_strategy(tmp_path):
    model = _trained(recorded(_user_preset(tmp_path, {})), torch.float32)
    other = _user_preset(tmp_path, {"power": 3.0})
    assert not same_strategy(model, read_strategy(other, model.strategy.eps))
    with pytest.raises(UserError, match=r"OffsetPowerScale has no inverse"):
        convert_model(model, read_strategy(other, model.strategy.eps), value=str(other))


def _refusal(model: Transformer, preset: str) -> str:
    path = ROOT / "recipes" / "strategy" / f"{preset}.yaml"
    with pytest.raises(UserError) as err:
        convert_model(model, read_strategy(path, model.strategy.eps), value=str(path))
    return str(err.value)


def _advice(text: str) -> list[str]:
    head = "choose a strategy that the conversion keeps exactly for this model (checked for every preset in " \
           "recipes/strategy/): "
    assert head in text, text
    return text.split(head, 1)[1].split(";", 1)[0].split(", ")


def test_a_refusal_advises_only_the_presets_that_keep_this_model():
    """A QK-norm model (``qk_norm``) refused ``no_scale``: its normalized u cannot be folded anywhere. The advice is
    every preset whose conversion of this model is exact (computed), never the refused one."""
    model = _trained(recorded(ROOT / "recipes" / "strategy" / "qk_norm.yaml"), torch.float64)
    advice = _advice(_refusal(model, "no_scale"))
    assert "no_scale" not in advice and "baseline" not in advice and "hg" not in advice
    # the presets with DNP on q and k (each writes every vector through its inverse: unified_wide_qk's β init is moot)
    assert advice == ["dnp", "qk_norm", "unified", "unified_wide_qk"]
    for name in advice:  # each one it names does convert this model
        convert_model(model, read_strategy(ROOT / "recipes" / "strategy" / f"{name}.yaml", model.strategy.eps))


def test_the_advice_of_a_plain_model_leaves_out_the_refused_preset():
    model = _trained(recorded(ROOT / "recipes" / "strategy" / "baseline.yaml"), torch.float64)
    advice = _advice(_refusal(model, "unified"))
    assert "unified" not in advice and "qk_norm" not in advice and "sandwich" not in advice
    assert {"baseline", "hg", "no_scale", "or", "er", "unit_offset", "dp", "unified_no_dnp"} <= set(advice)


def test_no_preset_keeps_the_model_says_so(monkeypatch):
    model = _trained(recorded(ROOT / "recipes" / "strategy" / "baseline.yaml"), torch.float64)
    monkeypatch.setattr(hub_convert, "presets_folder", lambda: ROOT / "no-such-folder")
    text = _refusal(model, "unified")
    assert ("no preset in recipes/strategy/ keeps this model exactly; pass --allow-function-change and continue "
            "training to recover") in text
