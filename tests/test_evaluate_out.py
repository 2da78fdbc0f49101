"""``evaluate --out FILE`` (and its ``--log_samples`` files) written through the output rule of the other
commands (``scalevec_lit/outfile.py``): a file it did not write is refused and kept byte for byte, before the
model is read; an earlier output of evaluate is replaced only with ``--overwrite``, removing exactly the files
its manifest lists; a damaged manifest is called damaged."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from helpers import ROOT, main_in_process

pytest.importorskip("lm_eval", reason="lm-eval is in the test extra (pip install -e '.[test]')")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from test_evaluate import TASKS, spec_for, trained_like, write_ckpt  # noqa: E402

MANIFEST = ".results.json.scalevec_manifest.json"
pytestmark = [pytest.mark.usefixtures("one_thread")]


@pytest.fixture()
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the task YAML names its data relative to the working folder


def _evaluate(capfd, ckpt, out, *extra):
    return main_in_process(capfd, ["evaluate", "--ckpt_path", ckpt, "--tasks", "tiny_choice", "--include_path",
                                   TASKS, "--limit", "2", "--bootstrap_iters", "0", "--out", out, *extra])


def _error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in text, text[-3000:]
    return lines[0]


def test_a_file_evaluate_did_not_write_is_refused_and_kept(tmp_path, capfd, at_root):
    ckpt = tmp_path / "missing.ckpt"  # never read: the refusal comes first
    out = tmp_path / "results.json"
    shutil.copy(ROOT / "README.md", out)
    for extra in ([], ["--overwrite"]):
        code, text = _evaluate(capfd, ckpt, out, *extra)
        assert code == 2
        assert f"error: --out: {str(out)!r}: is a file that evaluate did not write; choose a new file" in _error(text)
        assert out.read_bytes() == (ROOT / "README.md").read_bytes()
    out.unlink()
    user = tmp_path / "results_samples_tiny_choice.jsonl"  # the user's file where a samples file would go
    user.write_text("mine\n")
    code, text = _evaluate(capfd, ckpt, out, "--log_samples")
    assert code == 2 and "a file beside it, results_samples_tiny_choice.jsonl, was not written by evaluate" in \
        _error(text)
    assert user.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results_samples_tiny_choice.jsonl"]  # nothing left
    stale = tmp_path / ".fresh.json.tmp-999999999"  # left by a killed run (no such process)
    stale.mkdir()
    code, text = _evaluate(capfd, ckpt, tmp_path / "fresh.json")  # passes the checks, then the model is missing
    assert code == 2 and f"warning: {stale}: left by an interrupted evaluate writing {tmp_path / 'fresh.json'} " \
        "(process 999999999 is gone); delete it" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == [stale.name, "results_samples_tiny_choice.jsonl"]


def test_a_second_run_replaces_its_own_output_only_with_overwrite(tmp_path, capfd, at_root):
    spec = spec_for("baseline", moe=False)
    ckpt = write_ckpt(trained_like(spec), spec, tmp_path / "m.ckpt")
    folder = tmp_path / "eval"
    out = folder / "results.json"
    code, text = _evaluate(capfd, ckpt, out, "--log_samples")
    assert code == 0, text[-3000:]
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, "results.json", "results_samples_tiny_choice.jsonl"]
    assert json.loads((folder / MANIFEST).read_text())["files"] == ["results.json", "results_samples_tiny_choice.jsonl"]
    first = out.read_bytes()
    (folder / "notes.txt").write_text("mine")

    code, text = _evaluate(capfd, ckpt, out)  # again, without --overwrite: refused, nothing changed
    assert code == 2
    assert f"error: --out: {str(out)!r} exists: it holds an earlier output of evaluate (results.json, " \
           "results_samples_tiny_choice.jsonl); pass --overwrite" in _error(text)
    assert out.read_bytes() == first

    code, text = _evaluate(capfd, ckpt, out, "--overwrite")  # no --log_samples now: the old samples go
    assert code == 0, text[-3000:]
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, "notes.txt", "results.json"]
    assert (folder / "notes.txt").read_text() == "mine"
    assert json.loads(out.read_text())["results"] == json.loads(first)["results"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]

    (folder / MANIFEST).write_text("{not json")
    code, text = _evaluate(capfd, ckpt, out, "--overwrite")
    assert code == 2 and f"its manifest {folder / MANIFEST} is damaged (JSONDecodeError" in _error(text)
    assert (folder / MANIFEST).read_text() == "{not json" and out.exists()
