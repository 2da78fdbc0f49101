"""The shipped recipes by name (``scalevec_lit/recipe_lookup.py``): ``--config smoke``, a path winning over a
name, the ``recipes`` command (list, show, copy). In process, from a folder outside the repository."""
from __future__ import annotations

import pytest
import yaml

from helpers import ROOT, main_in_process

from scalevec_lit import recipe_lookup
from scalevec_lit.errors import UserError


@pytest.fixture()
def elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ folder here
    return tmp_path


def test_every_recipe_file_has_a_name():
    files = sorted(p.relative_to(ROOT / "recipes").with_suffix("").as_posix() for p in (ROOT / "recipes").rglob("*.yaml")
                   if not p.parent.name == "tasks")  # recipes/examples/tasks/: an lm-eval task, not a recipe
    names = recipe_lookup.recipe_names()
    assert sorted(names) == files and len(names) == len(set(names))
    assert names[:1] == ["dense_0.12b"] and names.index("smoke") < names.index("ablation/claims_cpu")  # top level first
    for name in ("smoke", "moe_smoke", "strategy/unified", "optim/muon_wsd", "examples/parallel_block",
                 "ablation/claims_cpu"):
        assert name in names


def test_a_name_in_any_spelling_finds_the_shipped_file(elsewhere):
    smoke = ROOT / "recipes" / "smoke.yaml"
    for spelling in ("smoke", "smoke.yaml", "recipes/smoke.yaml", "./recipes/smoke.yaml"):
        assert recipe_lookup.find_recipe(spelling) == smoke
    assert recipe_lookup.find_recipe("strategy/unified") == ROOT / "recipes" / "strategy" / "unified.yaml"
    for missing in ("smoke.yml", "smok", "../recipes/smoke", "/recipes/smoke", "strategy"):
        assert recipe_lookup.find_recipe(missing) is None


def test_config_names_become_paths_and_a_file_wins(elsewhere):
    argv = ["fit", "--config", "smoke", "-c", "strategy/unified", "--config=optim/muon_wsd", "--trainer.max_steps=3"]
    assert recipe_lookup.resolve_config_args(argv) == [
        "fit", "--config", str(ROOT / "recipes/smoke.yaml"), "-c", str(ROOT / "recipes/strategy/unified.yaml"),
        f"--config={ROOT / 'recipes/optim/muon_wsd.yaml'}", "--trainer.max_steps=3"]
    (elsewhere / "smoke").write_text("trainer: {max_steps: 7}\n")  # the user's own file of that name
    (elsewhere / "recipes").mkdir()
    (elsewhere / "recipes" / "smoke.yaml").write_text("trainer: {max_steps: 8}\n")
    inline = '{"trainer": {"max_steps": 9}}'
    kept = ["fit", "--config", "smoke", "--config", "recipes/smoke.yaml", "--config", inline]
    assert recipe_lookup.resolve_config_args(kept) == kept
    (elsewhere / "strategy" / "unified").mkdir(parents=True)  # a folder of that name is not a recipe file
    (elsewhere / "mine").mkdir()
    assert recipe_lookup.resolve_config_args(["fit", "--config", "strategy/unified", "--config", "mine"]) == [
        "fit", "--config", str(ROOT / "recipes/strategy/unified.yaml"), "--config", "mine"]
    # the command line LightningCLI reads itself is rewritten with it
    sys_argv = ["scalevec-lit", "fit", "--config", "strategy/hg"]
    resolved = recipe_lookup.resolve_config_args(sys_argv[1:], sys_argv)
    assert sys_argv[1:] == resolved == ["fit", "--config", str(ROOT / "recipes/strategy/hg.yaml")]


def test_an_unknown_name_is_one_line_with_the_close_names(elsewhere):
    with pytest.raises(UserError) as err:
        recipe_lookup.resolve_config_args(["fit", "--config", "strategy/unifed"])
    assert str(err.value) == (
        "--config: strategy/unifed: no such file, and no shipped recipe of that name; give the path of a YAML file "
        "or a recipe's name (did you mean strategy/unified (recipes/strategy/unified.yaml) or strategy/unit_offset "
        "(recipes/strategy/unit_offset.yaml)?); `scalevec-lit recipes` lists the shipped ones")


def test_fit_takes_recipe_names_and_names_the_run_after_them(elsewhere, capfd):
    code, text = main_in_process(capfd, ["fit", "--config", "smoke", "--config", "strategy/unified",
                                         "--print_config"])
    assert code == 0, text[-2000:]
    config = yaml.safe_load(text)
    shipped = yaml.safe_load((ROOT / "recipes/strategy/unified.yaml").read_text())
    for key in ("branch_specific", "placement", "magnitude_before_norm"):
        assert config["model"]["strategy"][key] == shipped["model"]["strategy"][key]
    assert config["trainer"]["max_steps"] == 300 and config["trainer"]["logger"]["init_args"]["name"] == "smoke"
    from scalevec_lit.lit.runfolder import family

    assert str(family(config | {"config": [ROOT / "recipes/smoke.yaml", ROOT / "recipes/strategy/unified.yaml"]})) \
        == "runs/smoke/unified"
    # a file of the same name in the working folder wins
    (elsewhere / "smoke").write_text((ROOT / "recipes/smoke.yaml").read_text().replace("max_steps: 300", "max_steps: 7"))
    code, text = main_in_process(capfd, ["fit", "--config", "smoke", "--print_config"])
    assert code == 0 and yaml.safe_load(text)["trainer"]["max_steps"] == 7


def test_the_recipes_command_lists_shows_and_copies(elsewhere, capfd):
    code, text = main_in_process(capfd, ["recipes"])
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("  ")]
    assert code == 0 and listed == recipe_lookup.recipe_names()
    assert "  smoke " in text and "The embedded default run" in text
    code, text = main_in_process(capfd, ["recipes", "show", "strategy/unified"])
    assert code == 0 and text == (ROOT / "recipes/strategy/unified.yaml").read_text()

    code, text = main_in_process(capfd, ["recipes", "copy", "smoke", "mine.yaml"])
    assert code == 0 and (elsewhere / "mine.yaml").read_bytes() == (ROOT / "recipes/smoke.yaml").read_bytes()
    assert "wrote mine.yaml (a copy of the shipped recipe smoke)" in text
    (elsewhere / "mine.yaml").write_text("edited\n")
    code, text = main_in_process(capfd, ["recipes", "copy", "smoke", "mine.yaml"])
    assert code == 2 and (elsewhere / "mine.yaml").read_text() == "edited\n"  # nothing lost
    assert "recipes copy: mine.yaml: exists and would be replaced; pass --overwrite to replace it" in text
    code, text = main_in_process(capfd, ["recipes", "copy", "smoke", "mine.yaml", "--overwrite"])
    assert code == 0 and (elsewhere / "mine.yaml").read_bytes() == (ROOT / "recipes/smoke.yaml").read_bytes()
    (elsewhere / "mine").mkdir()
    code, text = main_in_process(capfd, ["recipes", "copy", "strategy/unified", "mine"])
    assert code == 0 and (elsewhere / "mine/unified.yaml").read_bytes() == \
        (ROOT / "recipes/strategy/unified.yaml").read_bytes()
    code, text = main_in_process(capfd, ["recipes", "copy", "smoek", "x.yaml"])
    assert code == 2 and "recipe: smoek: no shipped recipe of that name; did you mean smoke" in text
    assert not (elsewhere / "x.yaml").exists()
    code, text = main_in_process(capfd, ["recipes", "copy", "smoke"])
    assert code == 2 and "recipes copy: smoke: needs a destination" in text


def test_a_shipped_study_runs_by_name_with_the_recipes_it_names(elsewhere):
    from scalevec_lit.study.spec import _base_callbacks, load_study

    study = load_study("ablation/claims_cpu")  # no such file here: the shipped study
    assert study.name == "claims_cpu" and study.base == ["recipes/smoke.yaml"]
    smoke = yaml.safe_load((ROOT / "recipes/smoke.yaml").read_text())
    assert _base_callbacks(study) == smoke["trainer"]["callbacks"]  # read from the shipped smoke recipe
    configs = ["fit", *[a for c in [*study.base, *study.variants[0].configs] for a in ("--config", c)]]
    assert recipe_lookup.resolve_config_args(configs) == [
        "fit", "--config", str(ROOT / "recipes/smoke.yaml"), "--config", str(ROOT / "recipes/strategy/baseline.yaml")]


def test_the_downstream_example_reads_its_shipped_task_from_any_folder(elsewhere):
    """examples/downstream_eval names its task folder as recipes/examples/tasks: shipped beside it, found from a
    folder without it, and the task's documents are read from beside its YAML (not from the working folder)."""
    from lm_eval.tasks import get_task_dict

    from scalevec_lit.callbacks import DownstreamEval
    from scalevec_lit.evaluate.harness import task_manager

    assert "examples/downstream_eval" in recipe_lookup.recipe_names()
    assert not [n for n in recipe_lookup.recipe_names() if n.startswith("examples/tasks")]  # data, not recipes
    args = yaml.safe_load(recipe_lookup.find_recipe("examples/downstream_eval").read_text())
    cb = DownstreamEval(**args["trainer"]["callbacks+"][0]["init_args"])
    folders = [recipe_lookup.shipped_folder(f) for f in cb.include_path]
    assert folders == [str(ROOT / "recipes/examples/tasks")]
    assert recipe_lookup.shipped_folder("recipes/nothing") == "recipes/nothing"
    (elsewhere / "recipes/examples/tasks").mkdir(parents=True)  # a folder of that path here wins
    assert recipe_lookup.shipped_folder("recipes/examples/tasks") == "recipes/examples/tasks"
    task = get_task_dict(cb.tasks, task_manager(cb.tasks, folders))["tiny_choice"]
    docs = list(task.test_docs())
    lines = (ROOT / "recipes/examples/tasks/tiny_choice.jsonl").read_text().splitlines()
    assert len(docs) == len(lines) == 10 and docs[0]["query"] == yaml.safe_load(lines[0])["query"]


def test_every_option_that_takes_a_recipe_takes_a_name_and_a_path_alike(elsewhere, capfd):
    """One rule for names (``recipe_lookup.recipe_file``): ``--config``, ``import --strategy``, ``convert --strategy``
    and a study file (and the recipes it names) each take a shipped recipe's name in every spelling and a file
    path, from a folder without ``recipes/``; an unknown name is the same one line for each, naming its option."""
    from test_import import save, tiny_hf

    from scalevec_lit.study.spec import load_study

    hg = ROOT / "recipes" / "strategy" / "hg.yaml"
    hf = save(tiny_hf("LlamaForCausalLM", vocab=4096), elsewhere / "hf", tokenizer=True)
    for i, spelling in enumerate(("strategy/hg", "strategy/hg.yaml", "recipes/strategy/hg.yaml", str(hg))):
        assert recipe_lookup.resolve_config_args(["fit", "--config", spelling]) == ["fit", "--config", str(hg)]
        code, text = main_in_process(capfd, ["import", "--hf", str(hf), "--out", f"imported{i}", "--strategy", spelling])
        assert code == 0, text[-3000:]
        assert f"converted to {spelling}" in text
        code, text = main_in_process(capfd, ["convert", "--ckpt", f"imported{i}", "--strategy", spelling,
                                             "--out", f"converted{i}"])
        assert code == 0, text[-3000:]
        study = elsewhere / f"study{i}.yaml"
        study.write_text(f"name: names\nout: runs\nbase: [{spelling.replace('strategy/hg', 'smoke')}]\nseeds: [1]\n"
                         f"baseline: hg\nvariants:\n  - {{name: hg, configs: [{spelling}]}}\n")
        assert load_study(study).variants[0].configs == [spelling]
    for argv in (["import", "--hf", str(hf), "--out", "x"], ["convert", "--ckpt", "imported0", "--out", "y"]):
        code, text = main_in_process(capfd, [*argv, "--strategy", "strategy/hgg"])
        assert code == 2 and ("--strategy: strategy/hgg: no such file, and no shipped recipe of that name; give the "
                              "path of a YAML file or a recipe's name (did you mean strategy/hg (recipes/strategy/hg.yaml)")\
            in text, text[-2000:]
        assert not (elsewhere / argv[-1]).exists()
