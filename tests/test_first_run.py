"""A clean first run (issue 35): the smoke fit prints only the run folder, the parameter groups and decay
table, the library's one parameter count, the progress bar and validation. Lightning's misleading lines
are gone at their cause (``scalevec_lit/known_warnings.py``), and a user's own warnings still show."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest

from helpers import ROOT

from scalevec_lit import known_warnings

# every line a short smoke fit may print (stdout and stderr, progress-bar redraws split at "\r")
EXPECTED = [
    r"Seed set to 42",
    r"run folder: runs/smoke/version_0 \(TensorBoard events, config\.yaml and checkpoints/; resume it with the "
    r"same command and --ckpt_path last\)",
    r"(GPU|TPU|HPU) available: .*",  # which accelerators this machine has and uses: true and short
    r"(\S+: )?(GPU|TPU) available but not used\. .*",  # on a machine with one: true, and how to use it
    r"optimizer parameter groups:",
    r"group +optimizer +tensors +params +lr +weight_decay",
    r"(matrix|embedding|head|scale) +AdamW +\d+ +[\d,]+ +0\.003 +[\d.]+",
    r"note: model\.schedule\.warmup_steps: 30 is longer than this run \(4 steps\); warming up over 4 steps instead",
    r"RoleWeightDecay \(preset iwd\): weight decay per parameter group",
    r"group +tensors +params +weight_decay +applied by",
    r"(matrix|embedding|head|scale input \w+ scale) +\d+ +[\d,]+ +[\d.]+ +(optimizer|RoleWeightDecay)",
    r"Transformer: parameters: 1,836,160 total, 1,152 in scale vectors \(0\.0627%\)",
    r"(Sanity Checking|Training|step|Validation)( DataLoader 0)?: .*",  # the progress bars
    r"`Trainer\.fit` stopped: `max_steps=4` reached\.",
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


@pytest.mark.slow
def test_the_smoke_fit_prints_only_what_is_true_and_useful(tmp_path, prepared_data):
    (tmp_path / "my_warnings.py").write_text(USER_CALLBACK)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(tmp_path), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), COLUMNS="100")
    argv = [sys.executable, "-m", "scalevec_lit", "fit", "--config", "smoke", "--trainer.max_steps=4",
            "--trainer.val_check_interval=2", "--trainer.limit_val_batches=2", f"--data.data_dir={prepared_data}",
            "--trainer.callbacks+=my_warnings.Warns"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    unexpected = unexpected_lines(text, EXPECTED + USER_WARNINGS + [USER_SOURCE])
    assert unexpected == [], "unexpected lines:\n" + "\n".join(map(repr, unexpected))
    for user in USER_WARNINGS:  # a user's own warnings still show, even with Lightning's texts
        assert any(re.fullmatch(user, p.strip()) for p in text.splitlines()), (user, text[-3000:])
    assert text.count("Transformer: parameters:") == 1 and "FLOPs" not in text  # one count, the library's
    assert re.search(r"Validation DataLoader 0: 100%", text)  # validation ran and showed
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
