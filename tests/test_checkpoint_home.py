"""``scalevec_lit/checkpoint/`` is the one home of what a checkpoint holds: the package's files and the
benchmarks take the reader and the rebuild from it (never from ``export``), a checkpoint is read into one
``CheckpointContents``, and ``convert`` carries the spec it read instead of deriving it from the live model."""
from __future__ import annotations

import ast
import json

import torch

from helpers import ROOT, tiny_config

#: the names of what a checkpoint holds; a file outside ``scalevec_lit/checkpoint/`` takes them from there
READER_NAMES = {"NATIVE_SPEC", "CheckpointContents", "load_model", "model_from_state", "read_checkpoint",
                "read_checkpoint_extra", "read_contents"}


def _imports(path):
    """``(line, absolute module, names)`` of every ``from … import`` of ``path`` (those inside functions too)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = tuple(p for p in package if p != "__init__")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ((node.module,) if node.module else ()))
            else:
                module = node.module or ""
            yield node.lineno, module, {a.name for a in node.names}


def test_the_reader_is_taken_from_the_checkpoint_package_only():
    home = ROOT / "scalevec_lit" / "checkpoint"
    files = [f for d in ("scalevec_lit", "callbacks", "benchmarks") for f in sorted((ROOT / d).rglob("*.py"))
             if home not in f.parents]
    assert any(f.name == "generate.py" for f in files)  # the scan reads the commands
    found = []
    for f in files:
        for line, module, names in _imports(f):
            where = f"{f.relative_to(ROOT).as_posix()}:{line}: from {module} import {', '.join(sorted(names))}"
            if module.endswith("export.checkpoint") or (
                    names & READER_NAMES and not module.startswith("scalevec_lit.checkpoint")):
                found.append(where)
    assert found == []


def _native_folder(tmp_path):
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER
    from scalevec_lit.export import save_native
    from scalevec_lit.model import Transformer

    torch.manual_seed(0)
    model = Transformer(tiny_config(n_layer=1)).eval()
    save_native(model, tmp_path / "native", tokenizer=DEFAULT_TOKENIZER)
    return model, tmp_path / "native"


def test_a_native_folder_is_read_into_one_contents(tmp_path):
    from scalevec_lit.checkpoint import CheckpointContents, model_from_state, read_contents

    model, folder = _native_folder(tmp_path)
    read = read_contents(folder)
    assert isinstance(read, CheckpointContents)
    assert (read.path, read.kind, read.tokenizer, read.extra) == (folder, "native folder", None, {})
    assert read.spec == json.loads((folder / "scalevec_spec.json").read_text())
    rebuilt = model_from_state(read.spec, read.state).state_dict()
    assert list(rebuilt) == list(model.state_dict())
    assert [k for k, v in model.state_dict().items() if not torch.equal(v, rebuilt[k])] == []


def test_convert_carries_the_spec_it_read(tmp_path, monkeypatch):
    import scalevec_lit.hub.convert as convert

    _, folder = _native_folder(tmp_path)
    read_models, asked = [], []
    rebuild, spec_of = convert.model_from_state, convert.spec_of
    monkeypatch.setattr(convert, "model_from_state", lambda *a: read_models.append(rebuild(*a)) or read_models[-1])
    monkeypatch.setattr(convert, "spec_of", lambda m: asked.append(m) or spec_of(m))
    done = convert.convert_checkpoint(folder, str(ROOT / "recipes" / "strategy" / "unit_offset.yaml"),
                                      tmp_path / "out")
    assert len(read_models) == 1 and (done.out / "scalevec_spec.json").is_file()
    assert asked == []  # neither the model read nor the converted one: the spec read is carried and written
