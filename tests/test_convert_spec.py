"""``convert`` and ``export`` carry the spec they read from the checkpoint (issue 33 item 2): the model class
with its ``init_args``, the config and the block are written as the checkpoint records them (the strategy as
converted), and the targets that a refusal's advice checks are built from that spec too, never from what the
live model says of itself (``spec_of``), which a model class may not reproduce."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from helpers import ROOT, tiny_config
from scalevec_lit.model import Block, Transformer

STRATEGIES = ROOT / "recipes" / "strategy"
CFG = dict(n_layer=1, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48)


class DriftingTransformer(Transformer):
    """A model whose live record of its constructor arguments is not what built it: ``spec_of`` on it names an
    argument (``built``) that its constructor does not take, so only its checkpoint's spec rebuilds it."""

    def __init__(self, config, strategy=None, block=Block, note: int = 0) -> None:
        super().__init__(config, strategy, block)
        self.init_args = {"note": note, "built": True}


CLASS = f"{__name__}.DriftingTransformer"


@pytest.fixture
def checkpoint(tmp_path):
    """A native folder of a trained-looking ``DriftingTransformer`` (baseline strategy) and the spec it holds."""
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER
    from scalevec_lit.export import save_native
    from scalevec_lit.hub.convert import read_strategy
    from scalevec_lit.model.spec import model_spec

    strategy = read_strategy(STRATEGIES / "baseline.yaml", 1e-5)
    torch.manual_seed(0)
    model = DriftingTransformer(tiny_config(**CFG), strategy, note=3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.3 * torch.rand_like(p))
    spec = {**model_spec(model.config, strategy, Block), "model": {"class_path": CLASS, "init_args": {"note": 3}}}
    save_native(model, tmp_path / "ckpt", spec=spec, tokenizer=DEFAULT_TOKENIZER)
    assert json.loads((tmp_path / "ckpt" / "scalevec_spec.json").read_text()) == spec
    return tmp_path / "ckpt", spec


def _written(folder):
    return json.loads((folder / "scalevec_spec.json").read_text())


def test_convert_to_its_own_strategy_writes_the_checkpoint_spec(checkpoint, tmp_path):
    from scalevec_lit.hub.convert import convert_checkpoint

    folder, spec = checkpoint
    done = convert_checkpoint(folder, STRATEGIES / "baseline.yaml", tmp_path / "out")
    assert done.report.notes == ["the same strategy: a copy"]
    assert _written(tmp_path / "out") == spec


def test_convert_to_another_strategy_writes_the_checkpoint_model_with_the_new_strategy(checkpoint, tmp_path):
    from scalevec_lit.hub.convert import convert_checkpoint, read_strategy
    from scalevec_lit.model.spec import strategy_data

    folder, spec = checkpoint
    done = convert_checkpoint(folder, STRATEGIES / "hg.yaml", tmp_path / "out")
    assert not done.report.changes
    written = _written(tmp_path / "out")
    assert written == {**spec, "strategy": strategy_data(read_strategy(STRATEGIES / "hg.yaml", 1e-5))}
    assert written["strategy"] != spec["strategy"]
    recipe = (tmp_path / "out" / "model.yaml").read_text()
    assert f"# model class: {CLASS}: add model.class_path" in recipe
    assert yaml.safe_load(recipe)["model"]["strategy"] == written["strategy"]


def test_a_refusal_advises_from_the_checkpoint_spec(checkpoint, tmp_path):
    """The advice builds each preset's target from the spec read; from ``spec_of`` every target but the
    model's own strategy failed to build, and the advice named ``baseline`` alone."""
    from scalevec_lit.errors import UserError
    from scalevec_lit.hub.convert import convert_checkpoint

    folder, _ = checkpoint
    with pytest.raises(UserError) as err:
        convert_checkpoint(folder, STRATEGIES / "unified.yaml", tmp_path / "out")
    head = "choose a strategy that the conversion keeps exactly for this model (checked for every preset in " \
           "recipes/strategy/): "
    advice = str(err.value).split(head, 1)[1].split(";", 1)[0].split(", ")
    assert {"baseline", "hg", "no_scale", "unit_offset"} <= set(advice) and "unified" not in advice
    assert not (tmp_path / "out").exists()


def test_export_native_writes_the_checkpoint_spec(checkpoint, tmp_path):
    from scalevec_lit.export import export

    folder, spec = checkpoint
    export(folder, tmp_path / "out", format="native")
    assert _written(tmp_path / "out") == spec


def test_write_native_without_a_spec_takes_the_model_own(tmp_path):
    """A model built in memory (``import`` of a Hugging Face folder) has no checkpoint spec: ``spec_of``."""
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER
    from scalevec_lit.hub.convert import write_native
    from scalevec_lit.model.spec import spec_of

    model = Transformer(tiny_config(**CFG)).eval()
    write_native(model, tmp_path / "out", tokenizer=DEFAULT_TOKENIZER, command="import")
    assert _written(tmp_path / "out") == json.loads(json.dumps(spec_of(model)))
