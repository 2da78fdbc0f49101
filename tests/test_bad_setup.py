"""A setup that is not right, answered with one line that names the thing and a fix that works (issue 45):

- a broken install of a dependency (a ``torchvision`` that does not match ``torch`` fails while Lightning is
  imported) names the package, who imports it and the fix, never "a bug in scalevec_lit";
- a logger ``save_dir`` that cannot be created gets the line ``trainer.default_root_dir`` gets, exit 2;
- a folder of text files given as ``data.data_dir`` names a ``prepare`` command that works as printed;
- the lines that send a user to prepare the embedded corpus name a command that exists in a clone and in an
  installed package (``python -m scalevec_lit prepare``, not ``make prepare``).
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from importlib.metadata import version

import pytest

import scalevec_lit.cli  # noqa: F401  (Lightning's log handlers bind to the session's stderr, not to one test's capture)
from helpers import ROOT, SMOKE, check, fit, run_cli


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


# -- a broken dependency -----------------------------------------------------------------------------------------
@pytest.mark.slow  # a CLI subprocess
def test_a_broken_torchvision_is_named_with_who_imports_it_and_the_fix(tmp_path):
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)  # what a torchvision built for another torch raises when it is imported
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    res = run_cli(["fit", "--config", SMOKE, f"--trainer.default_root_dir={tmp_path / 'run'}"], cwd=tmp_path,
                  env={"PYTHONPATH": f"{fake.parent}:{ROOT}"})
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert _errors(res.stderr) == [
        "error: torchvision: RuntimeError: operator torchvision::nms does not exist: importing the installed package "
        "torchvision fails (imported by lightning_utilities, via lightning): a broken or mismatched install of that "
        "package, not a bug in scalevec_lit; pip uninstall -y torchvision (nothing here needs it: litdata uses it "
        f"only for images), or install the torchvision build that matches torch {version('torch')} (the pair "
        "pytorch.org lists)"], res.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_a_dependency_that_is_not_installed_is_missing_exit_2(capfd):
    from scalevec_lit.errors import report

    # this library's code imports a package whose own import needs a package that is not installed
    package = compile("import nosuchdep_missing_pkg\n", "nosuchdep_importer/__init__.py", "exec")
    ours = compile("exec(package, {'__name__': 'nosuchdep_importer'})\n", "scalevec_lit/x.py", "exec")
    with pytest.raises(ModuleNotFoundError) as info:
        exec(ours, {"__name__": "scalevec_lit.x", "package": package})
    capfd.readouterr()
    assert report(info.value) == 2
    assert capfd.readouterr().err == (
        "error: nosuchdep_missing_pkg: ModuleNotFoundError: No module named 'nosuchdep_missing_pkg': "
        "nosuchdep_missing_pkg is not installed (imported by nosuchdep_importer): the installed packages are "
        "incomplete, not a bug in scalevec_lit; pip install nosuchdep_missing_pkg\n")


# -- a logger folder that cannot be created ------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_a_logger_save_dir_that_cannot_be_created_is_one_line_exit_2(world, capfd, where):
    (world.path / "afile").write_text("")
    save_dir = world.path / "afile" / "logs" if where == "under a file" else world.path / "afile"
    key = "trainer.logger.init_args.save_dir"
    check(world, capfd, fit(world, f"--{key}={save_dir}"), 2,
          f"error: {key}: {save_dir}: cannot create the log folder (Not a directory: {world.path / 'afile'}); set "
          f"{key} to a folder this process can create and write")
    assert not (world.path / "out").exists()


# -- a folder of text, and the embedded corpus ------------------------------------------------------------------
@pytest.mark.slow  # prepare runs as printed, in a subprocess
def test_a_text_folder_as_data_dir_names_a_prepare_command_that_works(world, capfd):
    texts = world.path / "mytexts"
    texts.mkdir()
    play = (ROOT / "scalevec_lit" / "data" / "corpus" / "shakespeare").glob("*.txt")
    (texts / "play.txt").write_text(next(iter(sorted(play))).read_text())
    out = f"{texts}-prepared"
    text = check(world, capfd, fit(world, f"--data.data_dir={texts}"), 2,
                 f"error: data.data_dir: '{texts}' has no meta.json: a folder of text files, not prepared data; prepare "
                 f"it into a folder of its own: `python -m scalevec_lit prepare --input {texts} --output {out}`, then "
                 f"use --data.data_dir={out}")
    command = shlex.split(re.search(r"`(python -m scalevec_lit prepare [^`]*)`", _errors(text)[0]).group(1))
    res = subprocess.run([sys.executable, *command[1:]], cwd=world.path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in texts.iterdir()) == ["play.txt"]  # the text folder as it was
    world.freeze()  # the prepared folder is an input of the fit now
    check(world, capfd, fit(world, f"--data.data_dir={out}"), 0)
    assert (world.path / "out" / "checkpoints" / "last.ckpt").is_file()


def test_a_missing_shakespeare_folder_names_the_prepare_command(world, capfd):
    where = world.path / "elsewhere" / "shakespeare"
    check(world, capfd, fit(world, f"--data.data_dir={where}"), 2,
          f"error: data.data_dir: '{where}' does not exist; run `python -m scalevec_lit prepare --output {where}` (the "
          "embedded corpus)")


@pytest.mark.slow  # the embedded corpus prepared twice (~5 s)
def test_the_first_run_line_names_a_command_that_does_the_same(tmp_path, monkeypatch, capfd):
    from scalevec_lit.data.datamodule import prepare_default_if_missing
    from scalevec_lit.data.prepare import DEFAULT_OUTPUT

    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert prepare_default_if_missing(DEFAULT_OUTPUT)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("data.data_dir:")]
    assert lines == [f"data.data_dir: {DEFAULT_OUTPUT} is not prepared yet: preparing the embedded Shakespeare corpus "
                     "there (once; `python -m scalevec_lit prepare` does the same)"]
    command = shlex.split(re.search(r"`([^`]*)`", lines[0]).group(1))
    (tmp_path / "b").mkdir()
    res = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path / "b", capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / DEFAULT_OUTPUT / "meta.json").read_text()) for d in ("a", "b"))
    assert (a["tokens"], a["chunks"]) == (b["tokens"], b["chunks"])
