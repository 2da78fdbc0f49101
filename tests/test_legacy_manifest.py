"""A prepared folder from an older version: its manifest ``.prepare_manifest.json`` (before
``.scalevec_manifest.json``) without a ``"writes"`` list, which those versions read as listing ``train``,
``val``, ``meta.json`` and itself. It is read as such, not called damaged: training reads the folder, prepare
without ``--overwrite`` says it holds prepared data, with ``--overwrite`` replaces exactly those entries and
keeps the user's other files. A manifest that is really damaged is still called so."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from scalevec_lit.data.prepare import prepare
from scalevec_lit.errors import UserError
from scalevec_lit.outdir import MANIFEST

LEGACY = ".prepare_manifest.json"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path]:
    """``(text folder, a folder prepared from it today)``."""
    tmp = tmp_path_factory.mktemp("legacy")
    text = tmp / "text"
    text.mkdir()
    (text / "a.txt").write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog. " * 4
                                            for i in range(60)))
    prepare(text, output_dir=tmp / "today", chunk_tokens=512, num_workers=1)
    return text, tmp / "today"


def _old(made, tmp_path: Path, manifest) -> Path:
    """The folder as an older version left it: its legacy manifest (``manifest``: JSON, or text as is), a file
    of the user's beside the data."""
    old = tmp_path / "old"
    shutil.copytree(made[1], old)
    (old / MANIFEST).unlink()
    (old / LEGACY).write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    (old / "notes.txt").write_text("mine")
    return old


def _prepare(made, out: Path, overwrite: bool) -> str:
    with pytest.raises(UserError) as info:
        prepare(made[0], output_dir=out, chunk_tokens=512, num_workers=1, overwrite=overwrite)
    return str(info.value)


@pytest.mark.parametrize("manifest", [{"note": "written by scalevec_lit prepare"}, {}],
                         ids=["note-only", "empty"])
def test_an_old_manifest_without_writes_is_prepare_s(made, tmp_path, manifest):
    from scalevec_lit.data.datamodule import TokenDataModule

    old = _old(made, tmp_path, manifest)
    batches = [next(iter(TokenDataModule(str(d), seq_len=32, batch_size=4, shuffle=False).train_dataloader()))
               for d in (old, made[1])]
    assert torch.equal(*batches)  # training reads it: the manifest is not read there

    assert _prepare(made, old, overwrite=False) == (
        f"--output: {str(old)!r} exists and is not an empty folder: it already holds prepared data (meta.json, "
        f"train, val); pass --overwrite to replace it (only the files its manifest {MANIFEST} lists are removed) "
        "or choose another folder")
    prepare(made[0], output_dir=old, chunk_tokens=512, num_workers=1, overwrite=True)
    assert sorted(p.name for p in old.iterdir()) == [MANIFEST, "meta.json", "notes.txt", "train", "val"]
    assert (old / "notes.txt").read_text() == "mine"
    assert json.loads((old / MANIFEST).read_text())["files"] == ["meta.json", "train", "val"]
    assert (old / "meta.json").read_bytes() == (made[1] / "meta.json").read_bytes()


def test_an_old_manifest_with_writes_lists_those(made, tmp_path):
    old = _old(made, tmp_path, {"writes": ["train", "val", "meta.json", LEGACY]})
    prepare(made[0], output_dir=old, chunk_tokens=512, num_workers=1, overwrite=True)
    assert sorted(p.name for p in old.iterdir()) == [MANIFEST, "meta.json", "notes.txt", "train", "val"]


@pytest.mark.parametrize("where, text, reason", [
    (LEGACY, "{not json", "JSONDecodeError: Expecting property name enclosed in double quotes"),
    (LEGACY, json.dumps({"writes": "train"}), "it does not list a command and its files"),
    (MANIFEST, json.dumps({"command": "prepare"}), "it does not list a command and its files"),
], ids=["legacy-not-json", "legacy-writes-not-a-list", "today-without-files"])
def test_a_damaged_manifest_is_still_called_damaged(made, tmp_path, where, text, reason):
    old = _old(made, tmp_path, text)
    if where == MANIFEST:  # today's manifest without its list of files (the legacy one is not read then)
        (old / LEGACY).unlink()
        (old / MANIFEST).write_text(text)
    before = sorted(p.name for p in old.iterdir())
    message = _prepare(made, old, overwrite=True)
    assert message.startswith(f"--output: {str(old)!r}: its manifest {where} is damaged ({reason}"), message
    assert f"which files here prepare wrote cannot be told; restore {where} (e.g. from a backup)" in message
    assert sorted(p.name for p in old.iterdir()) == before
