"""The pieces that the folder rule (``OutputFolder``) and the file rule (``OutputFile``) share, in
``scalevec_lit/outdir.py``, tested directly for the edges that only one of the two reaches: a taken temporary
name, which stale siblings are named, a parent that may not be written to, the parent folders removed again,
and entries moved in all or nothing."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalevec_lit import outdir
from scalevec_lit.outdir import discard, free_sibling, make_temporary, move_in, warn_stale

PID = os.getpid()


def test_a_taken_sibling_name_gets_the_next_number(tmp_path):
    out = tmp_path / "results.json"
    assert free_sibling(out, "tmp") == tmp_path / f".results.json.tmp-{PID}"
    (tmp_path / f".results.json.tmp-{PID}").write_text("a file")
    (tmp_path / f".results.json.tmp-{PID}-2").symlink_to(tmp_path / "nowhere")  # a dangling link takes it too
    assert free_sibling(out, "tmp") == tmp_path / f".results.json.tmp-{PID}-3"
    assert free_sibling(out, "old") == tmp_path / f".results.json.old-{PID}"


def test_only_the_siblings_of_a_process_that_is_gone_are_named(tmp_path, capfd):
    out = tmp_path / "model"
    for name in [".model.tmp-999999999", ".model.old-999999998-2", f".model.tmp-{PID}", ".model.tmp-x1",
                 ".other.tmp-999999999", ".model.tmp-999999997", ".model.old-99999999999999999999"]:
        (tmp_path / name).mkdir()
    (tmp_path / ".model.tmp-999999997" / "part").write_text("half")
    warn_stale(out, "export writing here")
    lines = sorted(capfd.readouterr().err.splitlines())
    gone = [(".model.old-99999999999999999999", 99999999999999999999), (".model.old-999999998-2", 999999998),
            (".model.tmp-999999997", 999999997), (".model.tmp-999999999", 999999999)]  # past any pid; gone
    assert lines == sorted(f"warning: {tmp_path / name}: left by an interrupted export writing here (process {pid} "
                           "is gone); delete it" for name, pid in gone)
    assert len(list(tmp_path.iterdir())) == 7  # named, never deleted


def test_the_parent_folders_made_are_removed_again_up_to_one_in_use(tmp_path):
    out = tmp_path / "a" / "b" / "c" / "results.json"
    created: list = []
    tmp = make_temporary(out, created, "evaluate")
    assert created == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    assert tmp == tmp_path / "a" / "b" / "c" / f".results.json.tmp-{PID}" and tmp.is_dir()
    (tmp / "results.json").write_text("{}")
    (tmp_path / "a" / "notes.txt").write_text("written meanwhile")
    discard(tmp, created)
    assert created == [] and not (tmp_path / "a" / "b").exists()
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["notes.txt"]  # not empty: kept, and so is tmp_path


def test_a_parent_that_may_not_be_written_to(tmp_path, monkeypatch):
    """An existing folder takes the temporary folder inside; a file (the file rule) gets the error, with the
    parent folders already made recorded for ``discard``."""
    real_mkdir = Path.mkdir

    def refused(path, *args, **kwargs):
        if ".tmp-" in path.name and not path.name.startswith(".scalevec"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refused)
    folder = tmp_path / "model"
    folder.mkdir()
    assert make_temporary(folder, [], "export") == folder / f".scalevec.tmp-{PID}"
    created: list = []
    with pytest.raises(PermissionError):
        make_temporary(tmp_path / "new" / "results.json", created, "evaluate")
    assert created == [tmp_path / "new"]
    discard(None, created)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def _entries(folder) -> dict:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_entries_are_moved_in_all_or_nothing(tmp_path, monkeypatch):
    dest, tmp, trash = tmp_path / "dest", tmp_path / "tmp", tmp_path / "trash"
    dest.mkdir(), tmp.mkdir()
    for name, text in [("a", "old a"), ("b", "old b"), ("mine", "the user's")]:
        (dest / name).write_text(text)
    for name in ("a", "c"):
        (tmp / name).write_text(f"new {name}")
    real_rename = os.rename

    def fail_on_c(src, dst):
        if str(src).endswith("c") and str(dst).startswith(str(dest)):
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(outdir.os, "rename", fail_on_c)  # after a and b went to the trash and the new a came in
    with pytest.raises(OSError, match="No space left"):
        move_in(tmp, dest, ["a", "b"], ["a", "c"], trash)
    assert _entries(dest) == {"a": "old a", "b": "old b", "mine": "the user's"}
    assert _entries(tmp) == {"a": "new a", "c": "new c"} and not trash.exists()
    monkeypatch.setattr(outdir.os, "rename", real_rename)
    move_in(tmp, dest, ["a", "b"], ["a", "c"], trash)
    assert _entries(dest) == {"a": "new a", "c": "new c", "mine": "the user's"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]  # tmp and trash removed
    tmp.mkdir()
    (tmp / "d").write_text("new d")
    move_in(tmp, dest, [], ["d"], tmp_path / "no" / "trash")  # nothing to replace: no trash folder is made
    assert _entries(dest)["d"] == "new d" and sorted(p.name for p in tmp_path.iterdir()) == ["dest"]
