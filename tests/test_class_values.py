"""A wrong value of a class-typed or choice-typed key of ``fit`` (``callbacks/_cli_values.py``, through
``ScaleVecArgumentParser.error``) is one line naming the key, the value, what the key accepts and one example of
the fix, in place of jsonargparse's text (``Parser key "model.optimizer": - Expected a path but foo either not
accessible or invalid - Expected a dot import path string: foo``); an argument refused inside a valid class keeps
the class, the argument and the reason. In process, with ``--print_plan`` (nothing is built)."""
from __future__ import annotations

import pytest

import scalevec_lit.train_cli  # noqa: F401 - Lightning imported before capfd captures (see test_bad_input.py)
from helpers import ROOT, SMOKE, main_in_process

TORCH_OPTIMIZERS = ("a class name (this library's MuonAdamW; also Adadelta, Adafactor, Adagrad, Adam, Adamax, AdamW, "
                    "ASGD, LBFGS, Muon, NAdam, RAdam, RMSprop, …) or the dotted import path")
SCHEDULES = ("a class name (this library's Schedule, Constant, WarmupCosine, WSD) or the dotted import path of a "
             "subclass of scalevec_lit.lit.Schedule")
PRESETS = ("baseline, dnp, dp, er, hg, no_scale, or, qk_norm, sandwich, unified, unified_dnp_vup, unified_no_dnp, "
           "unified_wide_qk, unit_offset")

CASES = [
    ("--model.optimizer=foo", "model.optimizer: foo: not a class name the parser knows for this key; give "
     f"{TORCH_OPTIMIZERS} of a subclass of torch.optim.Optimizer, e.g. --model.optimizer=torch.optim.AdamW"),
    ("--model.schedule=Cosine", "model.schedule: Cosine: not a class name the parser knows for this key; did you "
     f"mean 'WarmupCosine'? give {SCHEDULES}, e.g. --model.schedule=WarmupCosine"),
    ("--model.optimizer=torch.optim.Adamm", "model.optimizer: torch.optim.Adamm: module torch.optim has no attribute "
     "'Adamm'; did you mean torch.optim.Adam or torch.optim.RAdam? e.g. --model.optimizer=torch.optim.Adam"),
    ("--model.optimizer=nosuchpkg.Opt", "model.optimizer: nosuchpkg.Opt: cannot be imported (ModuleNotFoundError: No "
     "module named 'nosuchpkg'); check the spelling, or make its package importable (install it, or add the folder "
     "that holds 'nosuchpkg' to PYTHONPATH); e.g. --model.optimizer=torch.optim.AdamW"),
    ("--model.optimizer=foo.AdamW", "model.optimizer: foo.AdamW: cannot be imported (ModuleNotFoundError: No module "
     "named 'foo'); check the spelling, or make its package importable (install it, or add the folder that holds "
     "'foo' to PYTHONPATH); e.g. --model.optimizer=AdamW"),
    ("--model.schedule=torch.nn.Linear", "model.schedule: torch.nn.Linear: is a class derived from torch.nn.Module: "
     f"the key needs a subclass of scalevec_lit.lit.Schedule; give {SCHEDULES.split(' or the')[0]} or the dotted "
     "import path of another subclass, e.g. --model.schedule=WarmupCosine"),
    ("--model.optimizer=torch.optim", "model.optimizer: torch.optim: is a module, not a class: the key needs a "
     f"subclass of torch.optim.Optimizer; give {TORCH_OPTIMIZERS} of another subclass, e.g. "
     "--model.optimizer=torch.optim.AdamW"),
    ("--trainer.callbacks+=scalevec_lit.callbacks.Sharpness", "trainer.callbacks: scalevec_lit.callbacks.Sharpness: "
     "module scalevec_lit.callbacks has no attribute 'Sharpness'; did you mean scalevec_lit.callbacks.SharpnessMonitor?"
     " e.g. --trainer.callbacks+=scalevec_lit.callbacks.SharpnessMonitor"),
    ("--model.nonfinite=foo", "model.nonfinite: foo: not one of skip, stop, raise; e.g. --model.nonfinite=stop"),
    ("--trainer.precision=bf16-mix", "trainer.precision: bf16-mix: not one of 64, 32, 16, transformer-engine, "
     "transformer-engine-float16, 16-true, 16-mixed, bf16-true, bf16-mixed, 32-true, 64-true, bf16; did you mean "
     "'bf16-mixed' or '16-mixed'? e.g. --trainer.precision=bf16-mixed"),
    ("--model.strategy=dnp", "model.strategy: dnp: a strategy preset is a recipe of its own: add it with --config "
     "strategy/dnp (after the base recipe), or set its keys one by one (--model.strategy.placement.q=dual_norm) or "
     "give a YAML file of them (--model.strategy=FILE.yaml)"),
    ("--model.strategy=foo", "model.strategy: foo: not a file; set its keys one by one "
     "(--model.strategy.placement.q=dual_norm) or give a YAML file of them (--model.strategy=FILE.yaml), or add a "
     f"preset with --config strategy/NAME ({PRESETS})"),
    ("--data=foo", "data: foo: not a file; set its keys one by one (--data.batch_size=16) or give a YAML file of them "
     "(--data=FILE.yaml)"),
    ("--model.optimizer=Muon", "model.optimizer: torch.optim.Muon: updates only 2-D parameters, and the model also "
     "has vectors (the scale vectors, biases) for it; use this library's MuonAdamW (Muon for the hidden matrices, "
     "AdamW for the rest): --config recipes/optim/muon_wsd.yaml after the model recipe, or --model.optimizer=MuonAdamW"),
    # an argument refused inside a valid class: the class, the argument and the reason are kept
    ("--trainer.callbacks+=ScaleVectorMonitor --trainer.callbacks.every_n_steps=abc", "trainer.callbacks: ScaleVectorMonitor.every_n_steps: Expected a <class "
     "'int'>. Got value: abc; see its arguments: python -m scalevec_lit fit --trainer.callbacks.help "
     "scalevec_lit.callbacks.ScaleVectorMonitor"),
    ("--model.parallel.mixed_precision=fp8", "model.parallel: ParallelOptions.mixed_precision: fp8: not one of fp32, "
     "bf16; see its arguments: python -m scalevec_lit fit --model.parallel.help scalevec_lit.lit.ParallelOptions"),
    ("--model.optimizer.init_args.lrr=3", "model.optimizer: AdamW.lrr: not an argument of AdamW; did you mean 'lr'?"),
    ("--model.optimizer.init_args.lr=abc", "model.optimizer: AdamW.lr: abc: expected a number or torch.Tensor; see "
     "its arguments: python -m scalevec_lit fit --model.optimizer.help torch.optim.AdamW"),
    ("--trainer.callbacks+=SafeModelCheckpoint --trainer.callbacks.every_n_train_steps=abc", "trainer.callbacks: "
     "SafeModelCheckpoint.every_n_train_steps: abc: expected an integer (or null); see its arguments: python -m "
     "scalevec_lit fit --trainer.callbacks.help scalevec_lit.callbacks.SafeModelCheckpoint"),
    ("--model.optimizer=", "model.optimizer: (empty): no value given; e.g. --model.optimizer=torch.optim.AdamW"),
    ("--model.strategy={placement: {q: dnpp}}", "model.strategy.placement.q: dnpp: not one of input, output, dual, "
     "dual_norm; e.g. --model.strategy.placement.q=input"),
    ("--model.schedule={class_path: WarmupCosine, init_args: {warmup: 3}}", "model.schedule: WarmupCosine.warmup: not "
     "an argument of WarmupCosine; did you mean 'warmup_steps'?"),
    # a key of plain types, a group of keys
    ("--model.config.n_layer=four", "model.config.n_layer: four: expected an integer; e.g. --model.config.n_layer=4"),
    ("--model.compile=maybe", "model.compile: maybe: expected true or false; e.g. --model.compile=false"),
    ("--model.param_groups=foo", "model.param_groups: foo: expected a mapping ({key: value}) (or null); e.g. "
     "--model.param_groups='{scale: {weight_decay: 0.0}}'"),
    ("--model.strategy.placement=foo", "model.strategy.placement: foo: not a file; set its keys one by one "
     "(--model.strategy.placement.q=input) or give a YAML file of them (--model.strategy.placement=FILE.yaml)"),
]


@pytest.mark.parametrize("option, line", CASES, ids=[c[0] for c in CASES])
def test_a_wrong_value_is_one_line(capfd, option, line):
    options = [option] if "{" in option else option.split(" ")  # a mapping is one value
    code, text = main_in_process(capfd, ["fit", "--config", SMOKE, *options, "--print_plan"])
    assert (code, text.strip()) == (2, f"error: {line}")


@pytest.mark.parametrize("module,source,reason,fix", [
    ("brokenopt", "import no_such_dependency_zz\n\n\nclass Opt:\n    pass\n",
     "ModuleNotFoundError: No module named 'no_such_dependency_zz'", "install what that module imports, or fix the "
     "module"),
    # jsonargparse lets a module's own error (not an ImportError) through the parse: a bug report before
    ("raisingopt", "raise RuntimeError('no GPU driver here')\n", "RuntimeError: no GPU driver here", "fix the module"),
], ids=["its-import-fails", "it-raises"])
def test_a_module_that_fails_to_import_is_named(capfd, tmp_path, monkeypatch, module, source, reason, fix):
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, text = main_in_process(capfd, ["fit", "--config", SMOKE, f"--model.optimizer={module}.Opt", "--print_plan"])
    assert (code, text.strip()) == (2, f"error: model.optimizer: {module}.Opt: importing its module {module} failed "
                                       f"({reason}); {fix}; e.g. --model.optimizer=torch.optim.AdamW")


RECIPES = [
    ("trainer:\n  callbacks:\n    - class_path: nosuchpkg.CB\n", "trainer.callbacks: nosuchpkg.CB: cannot be imported "
     "(ModuleNotFoundError: No module named 'nosuchpkg'); check the spelling, or make its package importable (install "
     "it, or add the folder that holds 'nosuchpkg' to PYTHONPATH); e.g. "
     "--trainer.callbacks+=scalevec_lit.callbacks.ScaleVectorMonitor"),
    ("model:\n  schedule:\n    class_path: torch.nn.Linear\n", "model.schedule: torch.nn.Linear: is a class derived "
     f"from torch.nn.Module: the key needs a subclass of scalevec_lit.lit.Schedule; give {SCHEDULES.split(' or the')[0]}"
     " or the dotted import path of another subclass, e.g. --model.schedule=WarmupCosine"),
    ("model:\n  optimizer:\n    class_path: torch.optim.Adamm\n    init_args: {lr: 0.1}\n", "model.optimizer: "
     "torch.optim.Adamm: module torch.optim has no attribute 'Adamm'; did you mean torch.optim.Adam or "
     "torch.optim.RAdam? e.g. --model.optimizer=torch.optim.Adam"),
    ("model:\n  strategy: dnp\n", "model.strategy: dnp: a strategy preset is a recipe of its own: add it with --config "
     "strategy/dnp (after the base recipe), or set its keys one by one (--model.strategy.placement.q=dual_norm) or "
     "give a YAML file of them (--model.strategy=FILE.yaml)"),
]


@pytest.mark.parametrize("text, line", RECIPES, ids=[r[0].split(":")[-2].split()[-1] for r in RECIPES])
def test_a_wrong_value_in_a_recipe_is_the_same_line(capfd, tmp_path, text, line):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    code, out = main_in_process(capfd, ["fit", "--config", SMOKE, "--config", recipe, "--print_plan"])
    assert (code, out.strip()) == (2, f"error: {line}")


def test_a_recipe_given_to_a_group_says_to_use_config(capfd):
    """``--model.strategy=recipes/strategy/dnp.yaml``: the preset's keys are read under model.strategy twice."""
    preset = ROOT / "recipes" / "strategy" / "dnp.yaml"
    code, out = main_in_process(capfd, ["fit", "--config", SMOKE, f"--model.strategy={preset}", "--print_plan"])
    assert (code, out.strip()) == (2, "error: --model.strategy: the file given to it is a whole recipe, not "
                                      "model.strategy's own keys (read as model.strategy.model.strategy.vector."
                                      "class_path); give it with --config FILE (after the base recipe), or give "
                                      "--model.strategy a file of model.strategy's keys only")


def test_classes_made_at_run_time_are_not_listed(capfd):
    """After a fit in the same process, Lightning's ``LightningOptimizer`` has made ``LightningAdamW``, a subclass
    of AdamW with no import path: the list of optimizers stays what a fresh process prints (the suite met it)."""
    import torch

    made = type("LightningAdamW", (torch.optim.AdamW,), {"__module__": "lightning.pytorch.core.optimizer"})
    code, text = main_in_process(capfd, ["fit", "--config", SMOKE, "--model.optimizer=foo", "--print_plan"])
    assert (code, text.strip()) == (2, f"error: {CASES[0][1]}") and made.__subclasses__() == []
