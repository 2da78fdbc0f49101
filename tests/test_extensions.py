"""User-style extensions kept outside the library (``tests/extensions/``, its own package) through every command.

Two extensions, each chosen from YAML: ``temperature`` (a ``CausalLM`` subclass whose ``build_model`` returns a
``Transformer`` subclass with one parameter and one constructor argument more, ``model.class_path``) and
``residual`` (a ``Block`` subclass with ``init_args``, ``model.block``). For each: fit prints the count of the
model built; the ``.ckpt``, its native export and its same-strategy conversion rebuild that model (same logits
as the trained model in memory, float32); resume and ``init_from`` work with the recipe and refuse another
model by name; a class that cannot be imported is refused by name with the fix. Then the Python ``generate()``
guard for a block with its own attention. Runs in-process (the package is on ``sys.path``) except the one
command that must not see the package.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from extension_runs import fit_args, fitted
from helpers import ROOT, main_in_process, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")

EXT = ROOT / "tests" / "extensions"
RECIPES = {"temperature": EXT / "temperature.yaml", "residual": EXT / "residual_block.yaml"}
MODEL_CLASS = {"temperature": "extensions.models.TemperatureTransformer",
               "residual": "scalevec_lit.model.transformer.Transformer"}
BLOCK_CLASS = {"temperature": "scalevec_lit.model.block.Block", "residual": "extensions.blocks.ResidualScaleBlock"}


def _trained(name: str, prepared_data: Path, tmp_path_factory) -> dict:
    """The 2-step fit of an extension, shared with the extension suite (``tests/extension_runs.py``, once per
    session): the trained model in memory, its .ckpt, the printed lines."""
    return fitted(name, prepared_data, tmp_path_factory)


@pytest.fixture(params=sorted(RECIPES))
def trained(request, prepared_data, tmp_path_factory):
    return _trained(request.param, prepared_data, tmp_path_factory)


def batch(model) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))


@torch.no_grad()
def assert_same_model(loaded, trained) -> None:
    assert type(loaded) is type(trained)
    assert {k: v.shape for k, v in loaded.state_dict().items()} == {k: v.shape for k, v in trained.state_dict().items()}
    idx = batch(trained)
    torch.testing.assert_close(loaded.eval()(idx), trained(idx), rtol=1e-6, atol=0)


def test_fit_prints_the_count_of_the_model_built(trained):
    from scalevec_lit.model.transformer import count_parameters

    model = trained["model"]
    assert f"{type(model).__name__}: {count_parameters(model).summary()}" in trained["lines"]
    stock = count_parameters(model.config, model.strategy).total
    assert count_parameters(model).total == stock + (1 if trained["name"] == "temperature" else 0)


def test_ckpt_records_the_model_class_and_block_init_args(trained):
    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=False)
    spec = ckpt["scalevec"]["spec"]
    assert spec["model"]["class_path"] == MODEL_CLASS[trained["name"]]
    assert spec["block"]["class_path"] == BLOCK_CLASS[trained["name"]]
    if trained["name"] == "temperature":
        assert spec["model"]["init_args"] == {"temperature_init": 2.0}
    else:
        assert spec["block"]["init_args"] == {"residual_scale": 0.5}


def test_ckpt_native_export_and_generate_rebuild_the_trained_model(trained, tmp_path):
    from scalevec_lit.export import export, load_model
    from scalevec_lit.generate import generate, load_for_generation

    model = trained["model"]
    assert_same_model(load_model(trained["ckpt"])[0], model)
    export(trained["ckpt"], tmp_path / "native", format="native")
    assert_same_model(load_model(tmp_path / "native")[0], model)
    prompt = batch(model)[:, :8]
    expected = generate(model, prompt, 6)
    for source in (trained["ckpt"], tmp_path / "native"):
        loaded, _, _ = load_for_generation(str(source))
        assert_same_model(loaded, model)
        assert torch.equal(generate(loaded, prompt, 6), expected)


def test_convert_to_the_same_strategy_keeps_the_model(trained, tmp_path):
    import yaml

    from scalevec_lit.export import load_model
    from scalevec_lit.hub.convert import convert_checkpoint

    done = convert_checkpoint(trained["ckpt"], ROOT / "recipes" / "strategy" / "baseline.yaml", tmp_path / "conv")
    assert not done.report.changes
    assert_same_model(load_model(tmp_path / "conv")[0], trained["model"])
    recipe = yaml.safe_load((tmp_path / "conv" / "model.yaml").read_text())["model"]
    if trained["name"] == "residual":
        assert recipe["block"] == {"class_path": BLOCK_CLASS["residual"], "init_args": {"residual_scale": 0.5}}
    else:
        assert f"# model class: {MODEL_CLASS['temperature']}" in (tmp_path / "conv" / "model.yaml").read_text()


def test_resume_with_the_recipe_and_refused_without_it(trained, capfd):
    from scalevec_lit.cli import main

    name, root, data = trained["name"], trained["root"], trained["data"]
    code, out = main_in_process(capfd, fit_args(data, root, 3, "--ckpt_path", "last"))  # the plain recipe
    assert code == 2  # a sound checkpoint that does not fit the recipe (docs/troubleshooting.md's table)
    if name == "temperature":
        assert (f"was written by another model: model: checkpoint {MODEL_CLASS[name]} {{'temperature_init': 2.0}}, "
                "this run scalevec_lit.model.transformer.Transformer") in out
    else:
        assert f"block: checkpoint {{'class_path': '{BLOCK_CLASS[name]}', 'init_args': {{'residual_scale': 0.5}}}}" in out
    assert "another version of the model code" not in out
    cli = main(fit_args(data, root / "resumed", 3, "--config", str(RECIPES[name]), "--ckpt_path", str(trained["ckpt"])))
    assert cli.trainer.global_step == 3 and type(cli.model.model) is type(trained["model"])
    validate = ["validate", *fit_args(data, root / "validated", 1, "--config", str(RECIPES[name]))[1:]]
    cli = main([*validate, "--ckpt_path", str(trained["ckpt"])])  # validate/test read the checkpoint the same way
    assert type(cli.model.model) is type(trained["model"]) and cli.trainer.callback_metrics["val/loss"] > 0


def test_init_from_with_the_recipe_and_refused_without_it(trained, tmp_path, capfd):
    from scalevec_lit.cli import main

    name, data = trained["name"], trained["data"]
    code, out = main_in_process(capfd, fit_args(data, tmp_path / "plain", 1, f"--model.init_from={trained['ckpt']}"))
    assert code == 2
    if name == "temperature":
        assert (f"error: model.init_from: {trained['ckpt']}: the checkpoint holds a {MODEL_CLASS[name]} "
                "{'temperature_init': 2.0} model, the recipe builds a scalevec_lit.model.transformer.Transformer; "
                "choose the CausalLM subclass") in out
    else:
        assert f"model.block: checkpoint {BLOCK_CLASS[name]}, recipe scalevec_lit.model.block.Block" in out
        code, out = main_in_process(capfd, fit_args(
            data, tmp_path / "other", 1, "--config", str(RECIPES[name]), "--model.block.init_args.residual_scale=0.25",
            f"--model.init_from={trained['ckpt']}"))
        assert code == 2 and "model.block.init_args.residual_scale: checkpoint 0.5, recipe 0.25" in out
    cli = main(fit_args(data, tmp_path / "ok", 1, "--config", str(RECIPES[name]), f"--model.init_from={trained['ckpt']}"))
    assert cli.trainer.global_step == 1 and type(cli.model.model) is type(trained["model"])


@pytest.mark.slow
def test_a_class_that_cannot_be_imported_is_named_with_the_fix(prepared_data, tmp_path_factory, tmp_path, capfd):
    trained = _trained("temperature", prepared_data, tmp_path_factory)
    # a process without the package on PYTHONPATH: export refuses, names the class and the fix, writes nothing
    res = run_cli(["export", "--ckpt", str(trained["ckpt"]), "--format", "native", "--out", str(tmp_path / "x")],
                  cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert ("error: --ckpt: the checkpoint's model cannot be rebuilt: the class extensions.models."
            "TemperatureTransformer cannot be imported (ModuleNotFoundError: No module named 'extensions'); make its "
            "package importable (install it, or add the folder that holds 'extensions' to PYTHONPATH)") in res.stderr
    assert not (tmp_path / "x").exists()
    # a class renamed since the checkpoint was written: generate names it
    from scalevec_lit.export import export

    export(trained["ckpt"], tmp_path / "native", format="native")
    spec_file = tmp_path / "native" / "scalevec_spec.json"
    spec = json.loads(spec_file.read_text())
    spec["model"]["class_path"] = "extensions.models.RenamedTemperature"
    spec_file.write_text(json.dumps(spec))
    code, out = main_in_process(capfd, ["generate", "--ckpt", tmp_path / "native", "--prompt", "ROMEO:"])
    assert code == 2
    assert ("the class extensions.models.RenamedTemperature cannot be imported (AttributeError: module "
            "'extensions.models' has no attribute 'RenamedTemperature')") in out


def test_model_class_path_must_be_an_importable_causallm_subclass(prepared_data, tmp_path, capfd):
    args = fit_args(prepared_data, tmp_path, 1)
    code, out = main_in_process(capfd, [*args, "--model.class_path", "extensions.models.Missing"])
    assert code == 2 and out.startswith("error: model.class_path: extensions.models.Missing: cannot be imported")
    code, out = main_in_process(capfd, [*args, "--model.class_path=extensions.blocks.ResidualScaleBlock"])
    assert code == 2 and ("error: model.class_path: extensions.blocks.ResidualScaleBlock: is not a subclass of "
                          "scalevec_lit.lit.module.CausalLM") in out
    nested = tmp_path / "nested.yaml"
    nested.write_text("model:\n  class_path: extensions.models.TemperatureLM\n  init_args:\n    temperature_init: 3\n")
    code, out = main_in_process(capfd, [*args, "--config", nested])
    assert code == 2 and "error: model.init_args: " in out and "move the keys under model.init_args up one level" in out
    assert not (tmp_path / "checkpoints").exists()


def test_fit_refuses_a_model_its_checkpoints_would_not_rebuild():
    from extensions.models import TemperatureTransformer

    from helpers import tiny_config
    from scalevec_lit.errors import UserError
    from scalevec_lit.model.spec import check_rebuildable, spec_of

    model = TemperatureTransformer(tiny_config(), temperature_init=2.0)
    check_rebuildable(model, spec_of(model))
    model.init_args = {}  # the constructor argument is not recorded
    with pytest.raises(UserError, match=r"^model: extensions.models.TemperatureTransformer: its constructor takes "
                                        r"temperature_init, which a checkpoint would not record; set self.init_args"):
        check_rebuildable(model, spec_of(model))


# -- the Python generate(): a model that cannot decode with the cache runs without it, or is refused by name
@pytest.mark.parametrize("what", ["block", "model"])
def test_python_generate_without_a_usable_cache(what):
    from extensions.blocks import PlainAttentionBlock
    from extensions.models import ForwardOnlyTemperature

    from helpers import tiny_config
    from scalevec_lit.generate import Sampling, generate
    from scalevec_lit.model import Transformer

    config = tiny_config(vocab_size=64)
    model = (Transformer(config, block=PlainAttentionBlock) if what == "block" else
             ForwardOnlyTemperature(config, temperature_init=0.5)).eval()
    prompt = batch(model)[:, :6]
    sampling = Sampling(temperature=1.0)
    reference = generate(model, prompt, 8, sampling, generator=torch.Generator().manual_seed(0), use_cache=False)
    assert torch.equal(generate(model, prompt, 8, sampling, generator=torch.Generator().manual_seed(0)), reference)
    named = "PlainAttentionBlock) has no CausalSelfAttention" if what == "block" else \
        "ForwardOnlyTemperature overrides forward but not forward_cached"
    with pytest.raises(ValueError, match=re.escape(named)):
        generate(model, prompt, 8, use_cache=True)
    with pytest.raises(ValueError, match=re.escape(named)):
        model.forward_cached(prompt, model.new_cache())


def _sharded_model(rank: int, world: int) -> None:
    from extensions.models import TemperatureTransformer
    from torch.distributed.fsdp import fully_shard

    from helpers import tiny_config
    from scalevec_lit.model.spec import check_rebuildable, spec_of
    from scalevec_lit.model.transformer import count_parameters

    model = TemperatureTransformer(tiny_config(), temperature_init=2.0)
    full = count_parameters(model)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)  # the class becomes a generated FSDPTemperatureTransformer
    assert sum(p.to_local().numel() for p in model.parameters()) < full.total
    assert count_parameters(model) == full  # DTensors count their global size
    spec = spec_of(model)
    assert spec["model"] == {"class_path": "extensions.models.TemperatureTransformer",
                             "init_args": {"temperature_init": 2.0}}
    check_rebuildable(model, spec)


@pytest.mark.slow
def test_fsdp2_sharded_model_is_counted_and_recorded_as_its_own_class():
    from helpers import spawn_gloo

    spawn_gloo(_sharded_model, 2)
