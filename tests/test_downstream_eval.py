"""``DownstreamEval``: lm-eval tasks in the training loop, offline, on the local tasks of tests/data/evaluate_tasks.

- logged as ``downstream/<task>/<metric>`` at its steps, equal to ``evaluate`` on the checkpoint of that step;
- resumed from a checkpoint, it evaluates at the same steps (and not again at the resumed step);
- under FSDP2 on 2 CPU processes with a rank that has no request (limit 1) the fit finishes and the metrics
  equal one process's;
- between its steps nothing is imported or built; bad arguments are one clear error;
- ``study report`` shows the downstream metrics beside the validation loss.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import ROOT, main_in_process, run_cli, scalars, smoke_args

pytest.importorskip("lm_eval", reason="lm-eval is in the test extra (pip install -e '.[test]')")
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
os.environ.update({k: os.environ.get(k, v) for k, v in OFFLINE.items()})
TASKS = ROOT / "tests" / "data" / "evaluate_tasks"
TINY = ["--model.config.seq_len=32", "--model.config.n_layer=2", "--model.config.n_embd=64", "--data.batch_size=4",
        "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=1"]
# Metrics of the same weights computed in another batching (ranks, batch size): float32 sums in another order.
# bits_per_byte is -Σ log p / bytes over ~80 tokens: each log-probability moves by ≤ ~1e-5 relative (64-channel
# fp32 matmuls, u32 = 6e-8, over ~10 chained layers: 64·10·u32 ≈ 4e-5 of |logit|), so the sum by ≤ 4e-5
# relative; a document dropped, doubled or scored in a wrong window moves it by > 1e-2.
REL = 1e-4


def callbacks_yaml(path: Path, tasks: str, every: int, limit: int) -> Path:
    path.write_text(
        "trainer:\n  callbacks:\n"
        "    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        f"      init_args: {{filename: 'step{{step:06d}}', auto_insert_metric_name: false, every_n_train_steps: {every},"
        " save_last: true, save_top_k: -1}\n"
        "    - class_path: scalevec_lit.callbacks.DownstreamEval\n"
        f"      init_args: {{tasks: [{tasks}], include_path: {TASKS}, every_n_steps: {every}, limit: {limit}}}\n"
    )
    return path


def downstream(logdir: Path) -> dict[str, dict[int, float]]:
    return {k: dict(v) for k, v in scalars(logdir).items() if k.startswith("downstream/")}


def evaluate_checkpoint(ckpt: Path, tasks: list[str], limit: int) -> dict[str, float]:
    """What ``evaluate`` computes on ``ckpt`` (one process, float32)."""
    from scalevec_lit.evaluate import ScaleVecLM, load_for_evaluation
    from scalevec_lit.evaluate.harness import metrics, run_tasks, task_manager

    model, tok, _ = load_for_evaluation(ckpt)
    out = run_tasks(ScaleVecLM(model, tok, batch_size=8), tasks, task_manager(tasks, [str(TASKS)]), limit=limit,
                    bootstrap_iters=0)
    return {f"downstream/{k}": v for k, v in metrics(out).items()}


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def assert_same(got: dict[str, float], want: dict[str, float]) -> None:
    assert sorted(got) == sorted(want)
    for tag, value in want.items():
        if "perplexity" in tag or "bits_per_byte" in tag:
            assert abs(got[tag] - value) <= REL * abs(value), (tag, got[tag], value)
        else:  # accuracies: counts of documents, equal (as TensorBoard stores them: float32)
            assert f32(got[tag]) == f32(value), (tag, got[tag], value)


def test_logged_at_its_steps_equal_to_evaluate_and_resumed_at_the_same_steps(prepared_data, tmp_path, capfd,
                                                                            monkeypatch):
    monkeypatch.chdir(ROOT)  # the task YAML names its data files relative to the repository root
    a, b = tmp_path / "a", tmp_path / "b"
    cfg = callbacks_yaml(tmp_path / "cb.yaml", "tiny_choice, tiny_rolling", every=2, limit=4)
    code, text = main_in_process(capfd, smoke_args(prepared_data, a, 4, "--config", str(cfg), *TINY))
    assert code == 0, text[-4000:]
    logged = downstream(a / "smoke" / "version_0")
    tags = {"downstream/tiny_choice/acc", "downstream/tiny_choice/acc_norm", "downstream/tiny_rolling/bits_per_byte",
            "downstream/tiny_rolling/byte_perplexity", "downstream/tiny_rolling/word_perplexity"}
    assert set(logged) == tags and all(sorted(s) == [2, 4] for s in logged.values())
    assert sorted(dict(scalars(a / "smoke" / "version_0")["train/loss"])) == [0, 1, 2, 3]  # beside the losses
    at4 = {tag: s[4] for tag, s in logged.items()}
    assert_same(at4, evaluate_checkpoint(a / "checkpoints" / "step000004.ckpt", ["tiny_choice", "tiny_rolling"], 4))

    code, text = main_in_process(capfd, smoke_args(prepared_data, b, 4, "--config", str(cfg), *TINY,
                                                   f"--ckpt_path={a / 'checkpoints' / 'step000002.ckpt'}"))
    assert code == 0, text[-4000:]
    resumed = downstream(b / "smoke" / "version_0")
    assert set(resumed) == tags and all(sorted(s) == [4] for s in resumed.values())  # step 2 is not evaluated again
    assert_same({tag: s[4] for tag, s in resumed.items()}, at4)
    state = next(v for k, v in torch.load(b / "checkpoints" / "step000004.ckpt", weights_only=False)["callbacks"].items()
                 if k.startswith("DownstreamEval"))
    assert state["last_step"] == 4 and sorted(state["history"]) == [2, 4]  # step 2's results came with the checkpoint
    as_logged = {k: f32(v) for k, v in state["history"][2].items()}  # TensorBoard stores float32
    assert as_logged == {tag[len("downstream/"):]: s[2] for tag, s in logged.items()}


@pytest.mark.slow
def test_fsdp2_two_processes_evaluate_their_shares(prepared_data, tmp_path, monkeypatch):
    """limit 1: one document per task, so rank 1 has no request of its own of any type (a multiple-choice, a
    generate_until and a perplexity task in one evaluation): the fit finishes (a wait would fail at the time
    limit) and the metrics logged equal one process's on the saved (distributed) checkpoint. Uneven shares and
    each request type alone: test_evaluate_ranks.py."""
    monkeypatch.chdir(ROOT)
    cfg = callbacks_yaml(tmp_path / "cb.yaml", "tiny_choice, tiny_gen, tiny_rolling", every=2, limit=1)
    timeout = 300
    try:
        res = run_cli(smoke_args(
            prepared_data, tmp_path, 2, "--config", str(cfg), *TINY, "--trainer.devices=2", "--trainer.accelerator=cpu",
            "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
            "--trainer.strategy.data_parallel_size=2", "--trainer.strategy.tensor_parallel_size=1",
            "--trainer.strategy.process_group_backend=gloo"), cwd=ROOT, env={"OMP_NUM_THREADS": "1"}, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the 2-process fit did not finish in {timeout} s (a rank waits on another): "
                    f"{(err.stderr or b'')[-4000:]!r}")
    assert res.returncode == 0, res.stderr[-4000:]
    ckpt = tmp_path / "checkpoints" / "step000002.ckpt"
    assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == 2
    logged = {tag: s[2] for tag, s in downstream(tmp_path / "smoke" / "version_0").items()}
    assert_same(logged, evaluate_checkpoint(ckpt, ["tiny_choice", "tiny_gen", "tiny_rolling"], 1))


class _Trainer:
    """What the callback reads of a trainer between its steps."""

    global_step, world_size, global_rank, loggers, strategy = 3, 1, 0, [], None


def test_nothing_is_imported_or_built_between_its_steps(monkeypatch):
    from scalevec_lit.callbacks import DownstreamEval

    cb = DownstreamEval(tasks="tiny_choice", every_n_steps=5, include_path=str(TASKS))
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # any import of lm-eval would now raise
    trainer = _Trainer()
    for step in (1, 2, 3, 4, 6, 9, 11):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, 0)
    assert cb._manager is None and cb.last_step is None and cb.history == {}
    trainer.global_step = 10  # an evaluation step: it starts building (here: fails on the missing lm-eval)
    with pytest.raises(ImportError):
        cb.on_train_batch_end(trainer, None, None, None, 0)
    from scalevec_lit.errors import UserError

    with pytest.raises(UserError, match=r"DownstreamEval: lm-eval: is not installed .*pip install -e '\.\[eval\]'"):
        cb.setup(trainer, None, "fit")  # a fit with the callback and no lm-eval stops before its first step
    cb.load_state_dict({"last_step": 10, "history": {10: {"tiny_choice/acc": 0.5}}})
    cb.on_train_batch_end(trainer, None, None, None, 0)  # evaluated at 10 before the checkpoint: not again
    assert cb.state_dict() == {"last_step": 10, "history": {10: {"tiny_choice/acc": 0.5}}}


@pytest.mark.parametrize("kwargs, parts", [
    ({"tasks": " , "}, ["DownstreamEval.tasks:", "names no task"]),
    ({"tasks": "a", "every_n_steps": 0}, ["DownstreamEval.every_n_steps: 0: must be a whole number of at least 1"]),
    ({"tasks": "a", "limit": 2.5}, ["DownstreamEval.limit: 2.5:", "limit: null to run every document"]),
    ({"tasks": "a", "limit": 0}, ["DownstreamEval.limit: 0:"]),
])
def test_bad_arguments_name_the_key(kwargs, parts):
    from scalevec_lit.callbacks import DownstreamEval
    from scalevec_lit.errors import UserError

    with pytest.raises(UserError) as err:
        DownstreamEval(**kwargs)
    for part in parts:
        assert part in str(err.value)


def test_a_recipe_with_an_unknown_task_stops_with_close_names(prepared_data, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = callbacks_yaml(tmp_path / "cb.yaml", "tiny_choise", every=1, limit=2)
    code, text = main_in_process(capfd, smoke_args(prepared_data, tmp_path, 1, "--config", str(cfg), *TINY))
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1, text[-3000:]
    assert "DownstreamEval.tasks: tiny_choise: is not a task lm-eval knows" in errors[0]
    assert "close names: tiny_choice" in errors[0]


def test_study_report_shows_downstream_metrics_beside_the_loss(tmp_path):
    import yaml
    from torch.utils.tensorboard import SummaryWriter

    from scalevec_lit.study import report as st_report
    from scalevec_lit.study.spec import DONE, Run, load_study, run_callbacks

    out = tmp_path / "s"
    runs = out / "runs"
    runs.mkdir(parents=True)
    spec = {"name": "ds", "base": [str(ROOT / "recipes" / "smoke.yaml")], "seeds": [1, 2],
            "variants": [{"name": "baseline"}, {"name": "unified"}],
            "callbacks": {"scalevec_lit.callbacks.DownstreamEval": {"tasks": ["tiny_choice"], "every_n_steps": 5}}}
    (runs / "study.yaml").write_text(yaml.safe_dump(spec))
    study = load_study(runs / "study.yaml")  # the study's callbacks key adds it to every run
    added = run_callbacks(study, study.variants[0])[-1]
    assert added == {"class_path": "scalevec_lit.callbacks.DownstreamEval",
                     "init_args": {"tasks": ["tiny_choice"], "every_n_steps": 5}}
    acc = {("baseline", 1): 0.25, ("baseline", 2): 0.35, ("unified", 1): 0.5, ("unified", 2): 0.6}
    for (variant, seed), a in acc.items():
        root = runs / Run(variant, None, seed).rel()
        root.mkdir(parents=True)
        done = {"variant": variant, "seed": seed, "lr": None, "endpoint": 3.0 - a, "final_val_loss": 3.0 - a,
                "final_step": 9, "last_train_step": 9, "val": [[9, 3.0 - a]], "finished": "t",
                "code": {"commit": "c" * 40, "dirty": False}}
        (root / DONE).write_text(json.dumps(done))
        with SummaryWriter(str(root / "tb")) as w:
            w.add_scalar("downstream/tiny_choice/acc", a - 0.1, 5)  # an earlier evaluation: not the one reported
            w.add_scalar("downstream/tiny_choice/acc", a, 10)
    report = st_report.write_report(out).read_text()
    assert "## Downstream tasks" in report
    assert "| variant | LR | val loss | tiny_choice/acc |" in report
    assert "| baseline | n/a | 2.7000 ± 0.0707 (2) | 0.3000 ± 0.0707 (2) @ 10 |" in report
    assert "| unified | n/a | 2.4500 ± 0.0707 (2) | 0.5500 ± 0.0707 (2) @ 10 |" in report


def test_the_example_recipe_adds_the_callback_to_the_smoke_recipe():
    """recipes/examples/downstream_eval.yaml appends to the recipe's callbacks (docs/evaluate.md's command)."""
    import yaml

    from helpers import SMOKE, print_config, recipe
    from scalevec_lit.callbacks import DownstreamEval

    example = recipe("examples", "downstream_eval.yaml")
    callbacks = yaml.safe_load(print_config("--config", SMOKE, "--config", example))["trainer"]["callbacks"]
    smoke = yaml.safe_load(Path(SMOKE).read_text())["trainer"]["callbacks"]
    assert [c["class_path"] for c in callbacks] == [c["class_path"] for c in smoke] + [
        "scalevec_lit.callbacks.DownstreamEval"]
    args = yaml.safe_load(Path(example).read_text())["trainer"]["callbacks+"][0]["init_args"]
    cb = DownstreamEval(**args)
    assert (cb.tasks, cb.every_n_steps, cb.limit) == (["tiny_choice"], 100, 10)
    assert (ROOT / cb.include_path[0] / "tiny_choice.yaml").is_file()
