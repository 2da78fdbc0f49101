"""Every argparse command (``export``, ``inspect``, ``generate``, ``import``, ``convert``, ``evaluate``, ``prepare``,
``recipes``) with a missing argument, an unknown option, a bad choice or a bad typed value: one line on stderr,
``error: <command>: <what is wrong>; usage: <its usage in one line>``, exit 2 (``errors.CommandLineParser``, as for
``study``: tests/test_study_usage.py), in place of argparse's usage block; ``--help`` is argparse's, unchanged.
In process; one subprocess for the real entry point."""
from __future__ import annotations

import runpy
import sys

import pytest

from helpers import ROOT, run_cli

P = "python -m scalevec_lit"

CASES = [
    (["export"], f"error: export: the arguments --ckpt and --out are missing; usage: {P} export [-h] --ckpt CKPT "
     "--out OUT [--format {hf,native}]"),
    (["export", "--ckpt", "a", "--out", "b", "--bogus"], f"error: export: --bogus: not an option it takes; usage: {P} "
     "export [-h] --ckpt CKPT"),
    (["export", "--ckpt", "a", "--out", "b", "--format", "onnx"], "error: export: --format: onnx: not one of 'hf', "
     f"'native'; usage: {P} export [-h]"),
    (["inspect"], f"error: inspect: the argument PATH is missing; usage: {P} inspect [-h] [--compare OTHER] "
     "[--out DIR] [--overwrite] PATH"),
    (["inspect", "m.ckpt", "--bogus"], f"error: inspect: --bogus: not an option it takes; usage: {P} inspect [-h]"),
    (["generate", "--ckpt", "m.ckpt"], f"error: generate: the argument --prompt is missing; usage: {P} generate [-h] "
     "--ckpt CKPT --prompt PROMPT"),
    (["generate", "--ckpt", "m.ckpt", "--prompt", "hi", "--bogus"], f"error: generate: --bogus: not an option it "
     f"takes; usage: {P} generate [-h]"),
    (["generate", "--ckpt", "m.ckpt", "--prompt", "hi", "--temperature", "hot"], "error: generate: --temperature: "
     f"invalid float value: 'hot'; usage: {P} generate [-h]"),
    (["import"], f"error: import: the arguments --hf and --out are missing; usage: {P} import [-h] --hf HF --out OUT "
     "[--strategy STRATEGY] [--allow-function-change] [--tokenizer TOKENIZER] [--overwrite]"),
    (["import", "--hf", "h", "--out", "o", "--bogus"], f"error: import: --bogus: not an option it takes; usage: {P} "
     "import [-h]"),
    (["convert", "--ckpt", "m.ckpt"], f"error: convert: the arguments --strategy and --out are missing; usage: {P} "
     "convert [-h] --ckpt CKPT --strategy STRATEGY --out OUT [--allow-function-change] [--tokenizer TOKENIZER] "
     "[--overwrite]"),
    (["convert", "--ckpt", "m", "--strategy", "s", "--out", "o", "--bogus", "1"], "error: convert: --bogus 1: not "
     f"arguments it takes; usage: {P} convert [-h]"),
    (["evaluate", "--tasks", "hellaswag"], f"error: evaluate: the argument --ckpt_path is missing; usage: {P} "
     "evaluate [-h] --ckpt_path CKPT_PATH --tasks TASKS"),
    (["evaluate", "--ckpt_path", "m", "--tasks", "t", "--bogus"], f"error: evaluate: --bogus: not an option it takes; "
     f"usage: {P} evaluate [-h]"),
    (["evaluate", "--ckpt_path", "m", "--tasks", "t", "--batch_size", "eight"], "error: evaluate: --batch_size: "
     f"invalid int value: 'eight'; usage: {P} evaluate [-h]"),
    # prepare and recipes have no required argument: a bad typed value, a bad choice, an unknown option
    (["prepare", "--val-fraction", "tenth"], "error: prepare: --val-fraction: invalid float value: 'tenth'; usage: "
     f"{P} prepare [-h]"),
    (["prepare", "--errors", "ignore"], "error: prepare: --errors: ignore: not one of 'skip', 'replace', 'strict'; "
     f"usage: {P} prepare [-h]"),
    (["prepare", "--bogus"], f"error: prepare: --bogus: not an option it takes; usage: {P} prepare [-h]"),
    (["recipes", "delete"], "error: recipes: action: delete: not one of 'list', 'show', 'copy'; usage: scalevec-lit "
     "recipes [-h] [--overwrite] [{list,show,copy}] [name] [dest]"),
    (["recipes", "--bogus"], "error: recipes: --bogus: not an option it takes; usage: scalevec-lit recipes [-h] "
     "[--overwrite] [{list,show,copy}] [name] [dest]"),
    (["recipes", "copy", "smoke", "my.yaml", "extra"], "error: recipes: extra: not an argument it takes; usage: "
     "scalevec-lit recipes [-h]"),
]


def _run(capfd, args: list[str]) -> tuple[int, str, str]:
    from scalevec_lit.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capfd.readouterr()
    return code, out, err


@pytest.mark.parametrize("args, start", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_command_line_is_one_line(capfd, args, start):
    code, out, err = _run(capfd, args)
    assert (code, out) == (2, ""), err
    assert err.startswith(start) and err.endswith("\n") and err.count("\n") == 1 and err.count("usage:") == 1, err


@pytest.mark.parametrize("command", ["export", "inspect", "generate", "import", "convert", "evaluate", "prepare",
                                     "recipes"])
def test_help_is_argparses(capfd, command):
    code, out, err = _run(capfd, [command, "--help"])
    prog = "scalevec-lit recipes" if command == "recipes" else f"{P} {command}"
    assert (code, err) == (0, "")
    assert out.startswith(f"usage: {prog} [-h]") and "\noptions:\n  -h, --help" in out and "error:" not in out


def test_a_modules_main_raises_the_line_for_in_process_callers():
    """Called directly (not through ``scalevec_lit.cli.main``), a command's ``main`` raises the ``UserError`` the
    entry point prints (exit 2), not argparse's ``SystemExit`` after its usage block."""
    from scalevec_lit.errors import UserError
    from scalevec_lit.export import main

    with pytest.raises(UserError) as info:
        main(["--ckpt", "m.ckpt"])
    assert info.value.exit_code == 2
    assert str(info.value).startswith(f"export: the argument --out is missing; usage: {P} export [-h] --ckpt CKPT")


def test_python_m_recipe_lookup_is_guarded(capfd, monkeypatch):
    """``python -m scalevec_lit.recipe_lookup`` runs under ``run_guarded`` too: the line and exit 2, no traceback."""
    monkeypatch.setattr(sys, "argv", ["recipe_lookup", "show", "smoke", "--bogus"])
    monkeypatch.delitem(sys.modules, "scalevec_lit.recipe_lookup", raising=False)  # run as python -m would: fresh
    with pytest.raises(SystemExit) as info:
        runpy.run_module("scalevec_lit.recipe_lookup", run_name="__main__")
    out, err = capfd.readouterr()
    assert (info.value.code, out) == (2, "")
    assert err == ("error: recipes: --bogus: not an option it takes; usage: scalevec-lit recipes [-h] [--overwrite] "
                   "[{list,show,copy}] [name] [dest]\n")


def test_the_entry_point_prints_one_line_and_exits_2(tmp_path):
    """The real ``python -m scalevec_lit``: stderr is the one line, the process's exit code 2."""
    res = run_cli(["recipes", "show", "smoke", "--bogus"], cwd=tmp_path, timeout=120)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == ("error: recipes: --bogus: not an option it takes; usage: scalevec-lit recipes [-h] "
                          "[--overwrite] [{list,show,copy}] [name] [dest]\n")
