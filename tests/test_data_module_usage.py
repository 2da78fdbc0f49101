"""The documented ``python -m scalevec_lit.data.*`` modules (``tokenizer``, ``build_corpus``,
``prepare_heldout``: docs/train.md, docs/studies.md) answer a bad command line, and a missing input, with one
``error:`` line and exit 2, as every ``scalevec_lit`` command does; no usage block, no traceback."""
from __future__ import annotations

import runpy
import sys

import pytest

P = "python -m scalevec_lit.data."
CASES = [
    (["tokenizer"], f"error: {P}tokenizer: no command given; choose train; usage: {P}tokenizer [-h] {{train}} ...\n"),
    (["tokenizer", "train", "in"], f"error: {P}tokenizer train: the argument output is missing; usage: "),
    (["tokenizer", "train", "a", "b", "--vocab-size", "many"], f"error: {P}tokenizer train: --vocab-size: invalid "
     "int value: 'many'; usage: "),
    (["build_corpus", "--bogus"], f"error: {P}build_corpus: --bogus: not an option it takes; usage: "),
    (["prepare_heldout", "--train", "t"], f"error: {P}prepare_heldout: the arguments --val, --tokenizer and --output "
     "are missing; usage: "),
]


def _run(capfd, monkeypatch, module: str, args: list[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", [module, *args])
    monkeypatch.delitem(sys.modules, f"scalevec_lit.data.{module}", raising=False)  # fresh, as python -m runs it
    with pytest.raises(SystemExit) as info:
        runpy.run_module(f"scalevec_lit.data.{module}", run_name="__main__")
    out, err = capfd.readouterr()
    return info.value.code, out, err


@pytest.mark.parametrize("args, start", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_command_line_is_one_line(capfd, monkeypatch, args, start):
    code, out, err = _run(capfd, monkeypatch, args[0], args[1:])
    assert (code, out) == (2, ""), err
    assert err.startswith(start) and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_missing_input_folder_is_one_line(capfd, monkeypatch, tmp_path):
    code, out, err = _run(capfd, monkeypatch, "tokenizer", ["train", str(tmp_path / "none"), str(tmp_path / "t.json")])
    assert code != 0 and out == ""
    assert err == f"error: input: {str(tmp_path / 'none')!r} is not a folder; give a folder of .txt files\n", err


def test_a_folder_of_latin1_text_names_the_file_and_the_fix(capfd, monkeypatch, tmp_path):
    (tmp_path / "in").mkdir()
    bad = tmp_path / "in" / "notes.txt"
    bad.write_bytes("café naïve résumé\n".encode("latin-1") * 20)
    code, out, err = _run(capfd, monkeypatch, "tokenizer", ["train", str(tmp_path / "in"), str(tmp_path / "t.json")])
    assert (code, out) == (2, "")
    assert err == (f"error: input: {bad}: 80 bytes are not valid UTF-8 (the only text file of "
                   f"{str(tmp_path / 'in')!r}: nothing to train on; the tokenizer reads UTF-8 text only); convert it to "
                   f"UTF-8 (e.g. iconv -f latin-1 -t utf-8 {bad} > {bad}.utf8 && mv {bad}.utf8 {bad}), or give a "
                   "folder of UTF-8 text\n"), err
    assert not (tmp_path / "t.json").exists()


def test_a_latin1_file_beside_utf8_text_is_skipped_with_a_note(capfd, monkeypatch, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_bytes("café naïve résumé\n".encode("latin-1") * 20)
    (tmp_path / "in" / "good.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    from scalevec_lit.data.tokenizer import main

    main(["train", str(tmp_path / "in"), str(tmp_path / "t.json"), "--vocab-size", "300"])
    err = capfd.readouterr().err
    assert (tmp_path / "t.json").is_file(), err
    assert [ln for ln in err.splitlines() if ln.startswith(("note:", "error:"))] == [
        "note: tokenizer train: skipped 1 file(s) that are not valid text in the encoding: notes.txt (80 bad bytes) "
        "(the tokenizer reads UTF-8 text only)"]
