"""Callback arguments (issue 32, item 6): a bad ``SharpnessMonitor`` / ``DownstreamEval`` argument is the class's own
one line on the command line (not jsonargparse's Union text around it), and jsonargparse's refusal of a type or an
unknown argument names the class and the argument first; ``DownstreamEval`` checks its task names
at set-up; a ``SharpnessMonitor`` resumed with other arguments finds its state, keeps its held-out batch unless
``batch_size`` changed, and says in one line what it keeps and what it drops.
"""
from __future__ import annotations

from types import SimpleNamespace

import lightning
import pytest
import torch
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.trainer import call

from helpers import ROOT, main_in_process, smoke_args
from scalevec_lit.callbacks import SharpnessMonitor


def callbacks_yaml(tmp_path, class_path: str, init_args: str):
    cfg = tmp_path / "cb.yaml"
    cfg.write_text(f"trainer:\n  callbacks:\n    - class_path: {class_path}\n      init_args: {init_args}\n")
    return str(cfg)


@pytest.mark.parametrize("class_path, init_args, line", [
    ("scalevec_lit.callbacks.SharpnessMonitor", "{tol: 0.0}",
     "error: SharpnessMonitor.tol: 0.0: must be a number > 0; set e.g. tol: 1.0e-3"),
    ("scalevec_lit.callbacks.SharpnessMonitor", "{top_k: 3, iterations: 2}",
     "error: SharpnessMonitor.iterations: 2: must be a whole number >= top_k (3); set e.g. iterations: 20"),
    ("scalevec_lit.callbacks.DownstreamEval", "{tasks: [hellaswag], every_n_steps: 0}",
     "error: DownstreamEval.every_n_steps: 0: must be a whole number of at least 1; set e.g. every_n_steps: 8"),
], ids=["sharpness-tol", "sharpness-iterations", "downstream-every"])
def test_a_bad_callback_argument_is_the_classs_own_line(prepared_data, tmp_path, capfd, monkeypatch, class_path,
                                                        init_args, line):
    monkeypatch.chdir(tmp_path)
    cfg = callbacks_yaml(tmp_path, class_path, init_args)
    code, text = main_in_process(capfd, smoke_args(prepared_data, tmp_path, 1, "--config", cfg))
    errors = [t for t in text.splitlines() if t.startswith("error: ")]
    assert code == 2 and errors == [line], text[-2000:]
    assert "Union" not in text and "Given value" not in text


@pytest.mark.parametrize("init_args, line", [
    ("{every_n_steps: abc}", "error: trainer.callbacks: SharpnessMonitor.every_n_steps: Expected a <class 'int'>. Got "
     "value: abc; see its arguments: python -m scalevec_lit fit --trainer.callbacks.help "
     "scalevec_lit.callbacks.SharpnessMonitor"),
    ("{every_n_step: 2}", "error: trainer.callbacks: SharpnessMonitor.every_n_step: not an argument of "
     "SharpnessMonitor; did you mean 'every_n_steps'?"),
], ids=["type", "unknown"])
def test_jsonargparse_s_refusal_of_an_argument_names_the_class_and_argument_first(prepared_data, tmp_path, capfd,
                                                                                  monkeypatch, init_args, line):
    monkeypatch.chdir(tmp_path)
    cfg = callbacks_yaml(tmp_path, "scalevec_lit.callbacks.SharpnessMonitor", init_args)
    code, text = main_in_process(capfd, smoke_args(prepared_data, tmp_path, 1, "--config", cfg))
    errors = [t for t in text.splitlines() if t.startswith("error: ")]
    assert code == 2 and errors == [line], text[-2000:]


# -- DownstreamEval: the task names at set-up -------------------------------------------------------------------
def test_downstream_eval_checks_its_tasks_at_setup():
    pytest.importorskip("lm_eval", reason="lm-eval is in the test extra (pip install -e '.[test]')")
    from scalevec_lit.callbacks import DownstreamEval
    from scalevec_lit.errors import UserError

    tasks = str(ROOT / "tests" / "data" / "evaluate_tasks")
    trainer = SimpleNamespace(strategy=None)
    # (a misspelled name is checked against lm-eval's whole index, ~30 s: test_downstream_eval.py's recipe test
    # meets it at set-up too; a missing task file is the same check without the index)
    bad = DownstreamEval(tasks="tiny_choice,my_tasks/missing.yaml", every_n_steps=1000, include_path=tasks)
    with pytest.raises(UserError) as err:
        bad.setup(trainer, None, "fit")  # set-up: before the first training step, not at step 1000
    assert str(err.value) == ("DownstreamEval.tasks: my_tasks/missing.yaml: no such task YAML file; give a task name "
                              "or the path of a task YAML file")
    good = DownstreamEval(tasks="tiny_choice", every_n_steps=1000, include_path=tasks)
    good.setup(trainer, None, "fit")
    assert good._manager is not None and good.tasks_index() is good._manager  # built once, reused at evaluation


# -- SharpnessMonitor: resumed with other arguments -------------------------------------------------------------
class Loader:
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def val_dataloader(self):
        return iter([torch.arange(self.rows * 5).view(self.rows, 5)])  # one batch of ``rows`` rows


def trainer_with(*callbacks, rows: int = 8):
    trainer = SimpleNamespace(callbacks=list(callbacks), strategy=None, lightning_module=None,
                              profiler=PassThroughProfiler(), datamodule=Loader(rows))
    for cb in callbacks:
        if isinstance(cb, SharpnessMonitor):
            cb.setup(trainer, None, "fit")
    return trainer


def saved_checkpoint(monitor: SharpnessMonitor, step: int = 4) -> dict:
    trainer = trainer_with(monitor)
    monitor.held_out_batch(trainer)
    monitor._last_step = step
    return {"callbacks": {monitor.state_key: monitor.state_dict()}, "pytorch-lightning_version": lightning.__version__}


def restore(trainer, checkpoint: dict) -> None:
    """What Lightning does with a checkpoint's callback states on resume."""
    call._call_callbacks_on_load_checkpoint(trainer, checkpoint)
    call._call_callbacks_load_state_dict(trainer, checkpoint)


def test_the_state_key_is_the_position_not_the_arguments():
    a, b = SharpnessMonitor(every_n_steps=2), SharpnessMonitor(every_n_steps=3, params=["scales"])
    trainer_with(a, b)
    assert (a.state_key, b.state_key) == ("SharpnessMonitor", "SharpnessMonitor[1]")
    c = SharpnessMonitor(every_n_steps=7, batch_size=2)
    trainer_with(c)
    assert c.state_key == "SharpnessMonitor"


def test_resumed_with_other_arguments_keeps_the_batch_and_says_so(capsys, recwarn):
    checkpoint = saved_checkpoint(SharpnessMonitor(every_n_steps=2, batch_size=2, params=["all"]))
    kept = checkpoint["callbacks"]["SharpnessMonitor"]["batch"]
    capsys.readouterr()
    resumed = SharpnessMonitor(every_n_steps=3, batch_size=2, params=["all", "scales"])
    restore(trainer_with(resumed), checkpoint)
    assert torch.equal(resumed.batch, kept) and resumed._last_step == 4
    assert not [w for w in recwarn if "Be aware" in str(w.message)]  # Lightning found the state
    assert capsys.readouterr().err.splitlines() == [
        "warning: SharpnessMonitor: resumed with other arguments (every_n_steps 2 → 3, params ['all'] → ['all', "
        "'scales']): keeps its last measured step (step 4) and the saved held-out batch (2 rows); the new arguments "
        "apply from its next measurement"]
    same = SharpnessMonitor(every_n_steps=2, batch_size=2, params=["all"])
    restore(trainer_with(same), checkpoint)
    assert torch.equal(same.batch, kept) and capsys.readouterr().err == ""  # nothing changed: nothing said


def test_a_changed_batch_size_drops_the_batch_and_draws_a_new_one(capsys):
    checkpoint = saved_checkpoint(SharpnessMonitor(every_n_steps=2, batch_size=2))
    capsys.readouterr()
    resumed = SharpnessMonitor(every_n_steps=2, batch_size=4)
    trainer = trainer_with(resumed)
    restore(trainer, checkpoint)
    assert resumed.batch is None and resumed._last_step == 4
    assert capsys.readouterr().err.splitlines() == [
        "warning: SharpnessMonitor: resumed with other arguments (batch_size 2 → 4): keeps its last measured step "
        "(step 4); drops the saved held-out batch (2 rows) and draws a new one (4 rows) at its next measurement, so "
        "values before and after the resume are on different batches"]
    assert resumed.held_out_batch(trainer).shape == (4, 5)


def test_a_state_saved_under_the_former_key_is_found(capsys):
    """Checkpoints written before the key changed: the state under ``SharpnessMonitor{...}``, without arguments."""
    old = SharpnessMonitor(every_n_steps=2, batch_size=2)
    checkpoint = saved_checkpoint(old)
    state = checkpoint["callbacks"].pop("SharpnessMonitor")
    del state["config"]
    checkpoint["callbacks"]["SharpnessMonitor{'every_n_steps': 2, 'params': ('all',)}"] = state
    capsys.readouterr()
    same_rows = SharpnessMonitor(every_n_steps=5, batch_size=2)
    restore(trainer_with(same_rows), checkpoint)
    assert torch.equal(same_rows.batch, state["batch"]) and same_rows._last_step == 4
    assert capsys.readouterr().err == ""  # no arguments saved: only the batch's rows can be compared
    other_rows = SharpnessMonitor(every_n_steps=2, batch_size=3)
    restore(trainer_with(other_rows), checkpoint)
    assert other_rows.batch is None
    assert "(batch_size 2 rows → 3): keeps its last measured step (step 4); drops the saved held-out batch (2 rows)" in \
        capsys.readouterr().err
