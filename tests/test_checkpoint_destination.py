"""Where checkpoints go: a URL (``s3://...``) as the run's folder, the checkpoint callback's ``dirpath``, a
logger's ``save_dir`` (where fsspec has no file system for it) or ``--ckpt_path`` is refused with one line
before anything is written (it made a local folder ``s3:/...`` and stopped at the first save with
``internal: ImportError: Install s3fs``); a checkpoint folder this process cannot create or write is one line
naming the setting (it was ``error: [Errno 2] No such file or directory: '...'``)."""
from __future__ import annotations

import errno
import os

import pytest

from helpers import main_in_process, smoke_args
from scalevec_lit.errors import UserError
from scalevec_lit.runlock import LOCK, acquire_folder

FIX = ("give a folder on a file system every node can write (a shared disk on a cluster), and copy the checkpoints "
       "to the bucket from there; the data can stay in the bucket (--data.data_dir s3://...)")
WHY = "a URL: checkpoints, the run's lock and its logs are written to a file system folder, not to a bucket"


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("extra, key, url", [
    (("--trainer.default_root_dir=s3://ckpt/run",), "trainer.default_root_dir", "s3://ckpt/run"),
    (("--trainer.logger.init_args.save_dir=s3://ckpt/logs",), "trainer.logger: TensorBoardLogger.save_dir",
     "s3://ckpt/logs"),
])
def test_a_url_for_the_run_s_folders_is_one_line_and_writes_nothing(prepared_data, tmp_path, monkeypatch, capfd,
                                                                      extra, key, url):
    monkeypatch.chdir(tmp_path)
    args = [a for a in smoke_args(prepared_data, tmp_path / "run", 2) if "default_root_dir" not in a
            and "save_dir" not in a]
    code, out = main_in_process(capfd, [*args, *extra])
    assert code == 2, out
    assert _error_lines(out) == [f"error: {key}: {url}: {WHY}; {FIX}"]
    assert sorted(os.listdir(tmp_path)) == []  # no local folder called s3:, no run folder


def test_a_url_as_the_checkpoint_callback_s_dirpath_is_refused(prepared_data, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cb.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {dirpath: 's3://ckpt/x', every_n_train_steps: 2}\n")
    code, out = main_in_process(capfd, [*smoke_args(prepared_data, tmp_path / "run", 2), "--config", "cb.yaml"])
    assert code == 2, out
    assert _error_lines(out) == [f"error: trainer.callbacks: SafeModelCheckpoint.dirpath: s3://ckpt/x: {WHY}; {FIX}"]
    assert sorted(os.listdir(tmp_path)) == ["cb.yaml"]


def test_a_url_as_the_checkpoint_to_resume_is_refused(prepared_data, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    code, out = main_in_process(capfd, [*smoke_args(prepared_data, tmp_path / "run", 2),
                                        "--ckpt_path=s3://ckpt/run/last.ckpt"])
    assert code == 2, out
    assert _error_lines(out) == ["error: --ckpt_path: 's3://ckpt/run/last.ckpt': a URL: checkpoints are read from a "
                                 "file system, not from a bucket; copy it to a local or shared folder and give that "
                                 "path"]


def test_a_checkpoint_folder_that_cannot_be_made_is_one_line_naming_the_setting(prepared_data, tmp_path, capfd):
    (tmp_path / "afile").write_text("")
    root = tmp_path / "afile" / "sub"
    code, out = main_in_process(capfd, smoke_args(prepared_data, root, 2))
    assert code == 2, out
    assert _error_lines(out) == [f"error: trainer.default_root_dir: {root / 'checkpoints'}: cannot create the "
                                 f"checkpoint folder (Not a directory: {root / 'checkpoints'}); set "
                                 "trainer.default_root_dir to a folder this process can create and write"]


def test_a_checkpoint_folder_that_cannot_be_written_names_the_callback_s_dirpath(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(LOCK):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(UserError) as info:
        acquire_folder(tmp_path, given_as="SafeModelCheckpoint's dirpath")
    assert str(info.value) == (f"SafeModelCheckpoint's dirpath: {tmp_path}: cannot write into the checkpoint folder "
                               f"(Read-only file system: {tmp_path / LOCK}); set SafeModelCheckpoint's dirpath to a "
                               "folder this process can write")
