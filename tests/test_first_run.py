"""A clean first run (issue 35, issue 45): the smoke fit prints only the run folder, the parameter groups and
decay table, the library's one parameter count, the progress bar and validation; ``prepare`` only its progress
bars and its summary; a CSV-logger fit and a 2-process fit the same as the smoke fit, plus what is true of
them. Lightning's and litdata's misleading lines are gone at their cause (``scalevec_lit/known_warnings.py``,
``scalevec_lit/data/prepare.py``), and a user's own warnings still show."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest

from helpers import ROOT

from scalevec_lit import known_warnings


def fit_lines(folder: str, files: str, steps: int, params: str) -> list[str]:
    """Every line a short smoke fit may print (stdout and stderr, progress-bar redraws split at "\\r"):
    ``files`` is what its loggers write in the run ``folder``; ``params``, the model's parameter count."""
    return [
        r"Seed set to 42",
        rf"run folder: {folder} \({files}, config\.yaml and checkpoints/; resume it with the same command and "
        r"--ckpt_path last\)",
        r"(GPU|TPU|HPU) available: .*",  # which accelerators this machine has and uses: true and short
        r"(\S+: )?(GPU|TPU) available but not used\. .*",  # on a machine with one: true, and how to use it
        r"optimizer parameter groups:",
        r"group +optimizer +tensors +params +lr +weight_decay",
        r"(matrix|embedding|head|scale) +AdamW +\d+ +[\d,]+ +0\.003 +[\d.]+",
        rf"note: model\.schedule\.warmup_steps: 30 is longer than this run \({steps} steps\); warming up over "
        rf"{steps} steps instead",
        r"RoleWeightDecay \(preset iwd\): weight decay per parameter group",
        r"group +tensors +params +weight_decay +applied by",
        r"(matrix|embedding|head|scale input \w+ scale) +\d+ +[\d,]+ +[\d.]+ +(optimizer|RoleWeightDecay)",
        rf"Transformer: parameters: {params}",
        r"(Sanity Checking|Training|step|Validation)( DataLoader 0)?: .*",  # the progress bars
        rf"`Trainer\.fit` stopped: `max_steps={steps}` reached\.",
    ]


EXPECTED = fit_lines("runs/smoke/version_0", "TensorBoard events", 4,
                     r"1,836,160 total, 1,152 in scale vectors \(0\.0627%\)")
TINY = ["--model.config.n_layer=2", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2"]  # 1.4M parameters, 2 steps, one validation
TINY_PARAMS = r"1,442,432 total, 640 in scale vectors \(0\.0444%\)"
CSV_LOGGER = """trainer:
  logger:
    class_path: lightning.pytorch.loggers.CSVLogger
    init_args: {save_dir: runs, name: csv}
"""  # as docs/monitoring.md shows it, given after the recipe as loggers.yaml
# the lines Lightning prints when it starts 2 processes: true, and what a distributed run's user looks for
TWO_PROCESSES = [
    r"\[rank: 1\] Seed set to 42",
    r"Initializing distributed: GLOBAL_RANK: [01], MEMBER: [12]/2",
    r"-{100}",
    r"distributed_backend=gloo",
    r"All distributed processes registered\. Starting with 2 processes",
]
PREPARE = [
    r"prepare: tokenizing (train|val): +\d+%\|.*\| \d+/12 \[.*\]",  # the progress bars, one per split
    r"prepare: read 12 of 12 text file\(s\)",
    r"prepared out: 485,838 train / 26,313 val tokens, vocab 4096",
]
# the user's callback below warns with Lightning's own texts from its own module: those must still show
USER_WARNINGS = [
    r".*my_warnings\.py:\d+: UserWarning: Your `IterableDataset` has `__len__` defined \(mine\)",
    r".*my_warnings\.py:\d+: FutureWarning: `isinstance\(treespec, LeafSpec\)` is deprecated \(mine\)",
]
USER_SOURCE = r"warnings\.warn\(.*\(mine\).*\)"  # Python shows the line that warned
USER_CALLBACK = '''
import warnings
from lightning.pytorch.callbacks import Callback


class Warns(Callback):
    def on_train_start(self, trainer, pl_module):
        warnings.warn("Your `IterableDataset` has `__len__` defined (mine)")
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated (mine)", FutureWarning)
'''


def unexpected_lines(text: str, allowed: list[str]) -> list[str]:
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)  # the progress bars' cursor moves
    pieces = [p.strip() for line in text.splitlines() for p in line.split("\r")]
    return [p for p in pieces if p and not any(re.fullmatch(a, p) for a in allowed)]


def run_holding(argv: list[str], cwd, allowed: list[str], **env) -> str:
    """Run ``python -m scalevec_lit <argv>`` in ``cwd``; assert it exits 0 and prints only ``allowed`` lines."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "WORLD_SIZE", "LOCAL_RANK")},
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "COLUMNS": "100", **env}
    proc = subprocess.run([sys.executable, "-m", "scalevec_lit", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    unexpected = unexpected_lines(text, allowed)
    assert unexpected == [], "unexpected lines:\n" + "\n".join(map(repr, unexpected))
    return text


@pytest.mark.slow
def test_the_smoke_fit_prints_only_what_is_true_and_useful(tmp_path, prepared_data):
    (tmp_path / "my_warnings.py").write_text(USER_CALLBACK)
    argv = ["fit", "--config", "smoke", "--trainer.max_steps=4", "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=2", f"--data.data_dir={prepared_data}",
            "--trainer.callbacks+=my_warnings.Warns"]
    text = run_holding(argv, tmp_path, EXPECTED + USER_WARNINGS + [USER_SOURCE], PYTHONPATH=str(tmp_path))
    for user in USER_WARNINGS:  # a user's own warnings still show, even with Lightning's texts
        assert any(re.fullmatch(user, p.strip()) for p in text.splitlines()), (user, text[-3000:])
    assert text.count("Transformer: parameters:") == 1 and "FLOPs" not in text  # one count, the library's
    assert re.search(r"Validation DataLoader 0: 100%", text)  # validation ran and showed
    assert (tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt").is_file()


@pytest.mark.slow
def test_prepare_prints_only_its_progress_and_summary(tmp_path):
    text = run_holding(["prepare", "--output", "out"], tmp_path, PREPARE)
    finished = re.findall(r"prepare: tokenizing (\w+): 100%\|.*\| 12/12", text)
    assert list(dict.fromkeys(finished)) == ["train", "val"]  # each bar reached its end, train first
    assert (tmp_path / "out" / "meta.json").is_file() and sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.slow
def test_a_csv_logger_fit_names_its_files_and_warns_of_no_deletion(tmp_path, prepared_data):
    (tmp_path / "loggers.yaml").write_text(CSV_LOGGER)
    argv = ["fit", "--config", "smoke", "--config", "loggers.yaml", f"--data.data_dir={prepared_data}", *TINY]
    run_holding(argv, tmp_path, fit_lines("runs/csv/loggers/version_0", "metrics.csv", 2, TINY_PARAMS))
    folder = tmp_path / "runs/csv/loggers/version_0"  # where docs/monitoring.md says the CSV files go
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", "config.yaml", "figures", "metrics.csv"]
    assert "val/loss" in (folder / "metrics.csv").read_text().splitlines()[0]


@pytest.mark.slow
def test_a_two_process_fit_prints_only_what_is_true(tmp_path, prepared_data):
    argv = ["fit", "--config", "smoke", f"--data.data_dir={prepared_data}", *TINY, "--trainer.devices=2",
            "--trainer.accelerator=cpu", "--trainer.strategy=ddp"]
    text = run_holding(argv, tmp_path, fit_lines("runs/smoke/version_0", "TensorBoard events", 2, TINY_PARAMS)
                       + TWO_PROCESSES)
    assert text.count("All distributed processes registered") == 1
    assert (tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt").is_file()


def test_the_checkpoint_folder_warning_ignores_only_the_run_lock(tmp_path):
    """The cause of ``Checkpoint directory ... exists and is not empty`` on a new run: the lock file."""
    from lightning.fabric.utilities.cloud_io import get_filesystem

    from scalevec_lit.callbacks import SafeModelCheckpoint
    from scalevec_lit.runlock import LOCK

    cb = SafeModelCheckpoint(dirpath=tmp_path)
    cb._fs = get_filesystem(str(tmp_path))
    check = cb._ModelCheckpoint__warn_if_dir_not_empty  # what ModelCheckpoint.setup calls at fit start
    (tmp_path / LOCK).write_text("{}")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check(str(tmp_path))
    assert [str(w.message) for w in seen] == []
    (tmp_path / "last.ckpt").write_bytes(b"")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check(str(tmp_path))
    assert [str(w.message) for w in seen] == [f"Checkpoint directory {tmp_path} exists and is not empty."]


@pytest.mark.parametrize("resume_from, warned", [
    (None, True), ("last", False), ("{folder}/last.ckpt", False), ("{folder}/../other/step000010.ckpt", True),
    ("{folder}/step000010.ckpt/", False), ("s3://bucket/last.ckpt", True)])
def test_a_resume_in_its_own_folder_is_not_warned_about(tmp_path, resume_from, warned):
    from lightning.fabric.utilities.cloud_io import get_filesystem

    from scalevec_lit.callbacks import SafeModelCheckpoint

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "last.ckpt").write_bytes(b"")
    cb = SafeModelCheckpoint(dirpath=folder)
    cb._fs = get_filesystem(str(folder))
    cb.resume_from = resume_from and resume_from.format(folder=folder)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cb._ModelCheckpoint__warn_if_dir_not_empty(str(folder))
    assert [str(w.message) for w in seen] == ([f"Checkpoint directory {folder} exists and is not empty."] if warned
                                              else [])


def test_each_filter_matches_lightnings_message_from_lightnings_module_only():
    def shown(message: str, category, module: str) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            known_warnings.filter_lightning_internals()
            known_warnings.filter_litdata_length()
            warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)
        return [str(w.message) for w in seen]

    leaf = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)` instead."
    length = "Your `IterableDataset` has `__len__` defined. In combination with multi-process data loading"
    assert shown(leaf, FutureWarning, "lightning.pytorch.utilities._pytree") == []
    assert shown(length, UserWarning, "lightning.pytorch.utilities.data") == []
    assert shown(leaf, FutureWarning, "my_module") == [leaf]
    assert shown(length, UserWarning, "my_module") == [length]
    assert shown("another message", FutureWarning, "lightning.pytorch.utilities._pytree") == ["another message"]


def test_the_litlogger_tip_is_dropped_and_other_lightning_info_kept(caplog):
    import logging

    import scalevec_lit.lit  # noqa: F401  (installs the filter)
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    with caplog.at_level(logging.INFO):
        rank_zero_info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"
                       "(https://pypi.org/project/litlogger/) to enable LitLogger, which logs metrics")
        rank_zero_info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]


def test_the_sync_dist_advice_and_the_csv_deletion_are_dropped_for_the_librarys_own_only():
    def shown(message: str, module: str) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            known_warnings.filter_lightning_internals()
            known_warnings.filter_csv_log_dir("runs/csv/loggers/version_0")
            warnings.warn_explicit(message, UserWarning, f"{module.replace('.', '/')}.py", 1, module=module)
        return [str(w.message) for w in seen]

    result = "lightning.pytorch.trainer.connectors.logger_connector.result"
    advice = ("It is recommended to use `self.log({!r}, ..., sync_dist=True)` when logging on epoch level in "
              "distributed setting to accumulate the metric across devices.").format
    for name in ("val/loss", "val/ppl", "val/wiki/loss", "val/wiki/ppl"):  # MeanMetric: already over every rank
        assert shown(advice(name), result) == []
    assert shown(advice("val/acc"), result) == [advice("val/acc")]  # a user's own metric
    assert shown(advice("val/loss"), "my_module") == [advice("val/loss")]
    csv = "lightning.fabric.loggers.csv_logs"
    deleted = ("Experiment logs directory {} exists and is not empty. Previous log files in this directory will be "
               "deleted when the new ones are saved!").format
    assert shown(deleted("runs/csv/loggers/version_0"), csv) == []
    for other in ("runs/csv/loggers/version_01", "logs/mine/version_0"):  # another folder: still warned about
        assert shown(deleted(other), csv) == [deleted(other)]


@pytest.mark.parametrize("logger, files", [
    ({"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs"}},
     "TensorBoard events, config.yaml and checkpoints/"),
    ({"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}},
     "metrics.csv, config.yaml and checkpoints/"),
    ([{"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"save_dir": "runs"}},
      {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}}],
     "metrics.csv, config.yaml and checkpoints/"),
    ({"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"save_dir": "runs"}},
     "config.yaml and checkpoints/"),  # W&B writes in runs/wandb, not in the run folder
    (False, "config.yaml and checkpoints/"),
    (None, "TensorBoard events in lightning_logs/, config.yaml and checkpoints/"),  # Lightning's default logger
])
def test_the_start_line_names_what_the_loggers_write_there(tmp_path, monkeypatch, capsys, logger, files):
    from scalevec_lit.lit.runfolder import ENV, resolve_run_folder

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV, raising=False)
    resolve_run_folder({"config": ["smoke.yaml"], "trainer": {"logger": logger}}, "validate")
    assert capsys.readouterr().out == f"run folder: runs/smoke/version_0 ({files})\n"
