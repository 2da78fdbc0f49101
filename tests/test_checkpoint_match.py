"""``checkpoint/match.py``: what resume checks of the checkpoint dict Lightning loaded, read once by
``check_resume`` (its record, after the model it holds is found to be this run's), and ``model/`` free of any
checkpoint error (the comparison lives in the checkpoint package)."""
from __future__ import annotations

import ast

import pytest

from helpers import ROOT, tiny_config


def _spec(**overrides):
    from scalevec_lit.model.spec import model_spec
    from scalevec_lit.model.block import Block
    from scalevec_lit.scale.strategy import ScaleStrategy

    return model_spec(tiny_config(**overrides), ScaleStrategy(), Block)


def test_check_resume_returns_the_record_of_a_checkpoint_of_this_model():
    from scalevec_lit.checkpoint import check_resume

    record = {"spec": _spec(), "tokens_seen": 640, "skipped_steps": 1, "tokenizer": {"path": "t.json"}}
    got = check_resume({"state_dict": {}, "scalevec": record}, _spec(), "a.ckpt")
    assert got == record and got is not record  # a copy: the caller's changes leave Lightning's dict as loaded
    assert check_resume({"state_dict": {}}, _spec(), "old.ckpt") == {}  # no record (not written by CausalLM)


def test_check_resume_refuses_a_checkpoint_of_another_model_with_exit_2():
    from scalevec_lit.checkpoint import check_resume
    from scalevec_lit.checkpoint.verify import MismatchedCheckpointError
    from scalevec_lit.errors import exit_code_for

    saved = _spec(n_layer=1)
    saved["model"] = {"class_path": "pkg.Other", "init_args": {"k": 2}}
    with pytest.raises(MismatchedCheckpointError) as caught:
        check_resume({"scalevec": {"spec": saved}}, _spec(), "runs/x/last.ckpt")
    assert str(caught.value) == (
        "checkpoint runs/x/last.ckpt was written by another model: model: checkpoint pkg.Other {'k': 2}, this run "
        "scalevec_lit.model.transformer.Transformer (a CausalLM subclass overriding build_model is chosen with "
        "model.class_path); config.n_layer: checkpoint 1, this run 2. Resume with the recipe that wrote it "
        "(config.yaml in its run folder) or start afresh")
    assert exit_code_for(caught.value) == 2


def test_the_model_package_imports_no_checkpoint_code():
    found = []
    for f in sorted((ROOT / "scalevec_lit" / "model").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and ("verify" in (node.module or "")
                                                     or "checkpoint" in (node.module or "")
                                                     or any("Checkpoint" in a.name for a in node.names)):
                found.append(f"{f.name}:{node.lineno}")
    assert found == []
