"""A damaged output manifest is called damaged (``outdir.py``): the folder is refused, with the manifest named,
instead of looking like a folder of someone else's files; nothing in it changes."""
from __future__ import annotations

import pytest

from scalevec_lit.errors import UserError
from scalevec_lit.outdir import MANIFEST, OutputFolder


@pytest.mark.parametrize("text, reason", [
    ('{"command": "export", "files": ["model.safetensors"', "JSONDecodeError: "),
    ('{"command": 3, "files": "model.safetensors"}', "it does not list a command and its files"),
])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_damaged_manifest_is_named_and_the_folder_kept(tmp_path, text, reason, overwrite):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    (out / MANIFEST).write_text(text)
    with pytest.raises(UserError) as err:
        OutputFolder(out, command="export", overwrite=overwrite).begin()
    assert str(err.value).startswith(f"--out: {str(out)!r}: its manifest {MANIFEST} is damaged ({reason}")
    assert str(err.value).endswith(f"so which files here export wrote cannot be told; restore {MANIFEST} (e.g. from a "
                                   "backup), or move the files you want to keep out of the folder and delete it, or "
                                   "choose another folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert (out / "model.safetensors").read_bytes() == b"weights" and (out / MANIFEST).read_text() == text
