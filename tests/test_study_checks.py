"""A study file is checked in full when it is read (``study/checks.py``): each mistake is one ``UserError``
(exit 2) naming the file, the key, the value and the fix, before any run."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scalevec_lit import study as st
from scalevec_lit.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"name": "s", "base": [str(ROOT / "recipes" / "smoke.yaml")], "seeds": [1, 2], "lrs": ["1e-3", 3.0e-3],
        "variants": [{"name": "baseline", "configs": [str(ROOT / "recipes" / "strategy" / "baseline.yaml")]},
                     {"name": "unified", "decay": "decay_all", "lrs": [0.01]}],
        "claims": [{"title": "t", "expect": {"unified": "lower"}}]}


def _load(tmp_path: Path, **changes):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**GOOD, **changes}, sort_keys=False))
    return st.load_study(path), path


def test_a_good_file_reads_as_before(tmp_path):
    study, _ = _load(tmp_path)
    assert study.seeds == [1, 2] and study.lrs == [1e-3, 3e-3] and study.variants[1].lrs == [0.01]
    assert [r.label() for r in study.runs()][:3] == ["baseline@lr=0.001/seed1", "baseline@lr=0.003/seed1",
                                                     "unified@lr=0.01/seed1"]
    assert study.out == "results/s/runs" and study.endpoint_evals == 2 and study.variants[1].decay == "decay_all"


@pytest.mark.parametrize("changes, message", [
    ({"seeds": [1, "two"]}, "seeds[1]: two: not an integer seed; write the seeds as integers, e.g. seeds: [1, 2, 3]"),
    ({"seeds": [1, 1]}, "seeds: [1, 1]: must list at least one seed, each once"),
    ({"seeds": 3}, "seeds: 3: must be a list; write it as [1, 2, 3]"),
    ({"lrs": [0.001, "fast"]}, "lrs[1]: fast: not a number; write learning rates as numbers"),
    ({"lrs": [-0.001]}, "lrs[0]: -0.001: must be a finite number above 0"),
    ({"args": ["trainer.max_steps=5"]}, "args[0]: trainer.max_steps=5: not a command-line option of fit; write "
                                        "each as --<key>=<value>"),
    ({"base": ["recipes/smokey.yaml"]}, "base[0]: recipes/smokey.yaml: no such file"),
    ({"variants": [{"name": "baseline", "config": ["x.yaml"]}]}, "variants[0].config: config: unknown key; did "
                                                                 "you mean `configs`?"),
    ({"variants": [{"name": "baseline"}, {"name": "baseline"}]}, "variants: baseline: two variants with this name"),
    ({"variants": [{"name": "baseline", "lrs": ["x"]}]}, "variants[baseline].lrs[0]: x: not a number"),
    ({"claims": [{"title": "t", "expect": {"unified": "less"}}]}, "claims[0].expect.unified: less: must be lower "
                                                                  "or higher"),
    ({"claims": [{"title": "t", "expect": {"unifed": "lower"}}]}, "claims[0].expect: unifed: not a variant of this "
                                                                  "study; did you mean 'unified'?"),
    ({"endpoint_evals": 0}, "endpoint_evals: 0: must be an integer of at least 1"),
    ({"alpha": "five percent"}, "alpha: five percent: not a number"),
    ({"callbacks": ["scalevec_lit.callbacks.SharpnessMonitor"]}, "callbacks: ['scalevec_lit.callbacks."
                                                                 "SharpnessMonitor']: must map class paths"),
    ({"keep_checkpoints": "yes please"}, "keep_checkpoints: yes please: must be true or false"),
    ({"dynamics": ["nope"]}, "dynamics: nope: not a variant of this study"),
])
def test_each_mistake_names_file_key_value_and_fix(tmp_path, changes, message):
    with pytest.raises(UserError) as err:
        _load(tmp_path, **changes)
    assert str(err.value).startswith(f"{tmp_path / 's.yaml'}: {message}"), str(err.value)
    assert err.value.exit_code == 2


def test_unreadable_or_broken_yaml(tmp_path):
    with pytest.raises(UserError, match="nope.yaml: \\(the file\\): .*cannot be read"):
        st.load_study(tmp_path / "nope.yaml")
    broken = tmp_path / "b.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(UserError, match="b.yaml: \\(the file\\): YAML: .*; correct the YAML syntax there"):
        st.load_study(broken)
    broken.write_text("- just\n- a list\n")
    with pytest.raises(UserError, match="a study file is a YAML mapping"):
        st.load_study(broken)


def test_callback_arguments_are_built_before_the_runs(tmp_path):
    """What the subprocess of ``check_callbacks`` does for each callback of the grid, in process."""
    from scalevec_lit.study.callback_check import _check_one, _where

    sharp = "scalevec_lit.callbacks.SharpnessMonitor"
    typo = _check_one({"variant": "baseline", "class_path": sharp, "init_args": {"every_n_step": 5}})
    assert (typo["arg"], typo["problem"], typo["fix"]) == ("every_n_step", "not an argument of SharpnessMonitor",
                                                          "did you mean 'every_n_steps'?")
    wrong = _check_one({"variant": "baseline", "class_path": sharp, "init_args": {"iterations": "many"}})
    assert wrong["arg"] == "iterations" and wrong["value"] == "many" and "SharpnessMonitor.iterations" in wrong["problem"]
    preset = _check_one({"variant": "unified", "class_path": st.RWD, "init_args": {"preset": "iwdd"}})
    assert preset["problem"].startswith("RoleWeightDecay.preset: 'iwdd' is not one of iwd, decay_all")
    assert preset["fix"] == "pick one of them"
    assert _check_one({"variant": "baseline", "class_path": "scalevec_lit.callbacks.Nope", "init_args": {}})[
        "problem"].startswith("no such callback class")
    assert _check_one({"variant": "baseline", "class_path": sharp, "init_args": {"every_n_steps": 5}}) is None
    study, _ = _load(tmp_path, callbacks={sharp: {"every_n_step": 5}})
    assert _where(study, study.variants[1], st.RWD, "preset") == "variants[unified].decay"
    assert _where(study, study.variants[0], st.RWD, "preset") == "decay"
    assert _where(study, study.variants[0], sharp, "every_n_step") == f"callbacks.{sharp}.every_n_step"
