"""Every public module or name that moved since 0.1.0 still imports from its old path for one release (0.2.0,
removed in 0.3.0): the old path gives the very same objects as the new one and warns, in one line, where they
went. Nothing in the package imports an old path, and CHANGELOG.md lists each one under "Deprecated".

The old paths and their homes were found in the history (``git log --diff-filter=DR`` on ``*.py``, and each
module's ``__all__`` / each package's public names at every commit compared with today's).
"""
from __future__ import annotations

import ast
import importlib
import re
import sys

import pytest

from helpers import ROOT

#: old module -> [(new module, [names])], in the order the warning names them
MOVED = {
    "scalevec_lit.export.checkpoint": [("scalevec_lit.checkpoint", [
        "NATIVE_SPEC", "load_model", "model_from_state", "read_checkpoint", "read_checkpoint_extra"])],
    "scalevec_lit.export.hf_names": [("scalevec_lit.arch.names", ["Ref", "native_tensor", "site_of"])],
    "scalevec_lit.export.arch": [("scalevec_lit.arch", [
        "HFArchitecture", "ModelFacts", "NATIVE_HINT", "Refusals", "architecture", "architectures", "facts_of",
        "head_norm_weight", "register", "unregister"])],
    "scalevec_lit.export.arch.base": [("scalevec_lit.arch.base", ["UNSUPPORTED", "HFArchitecture", "refuse"])],
    "scalevec_lit.export.arch.llama": [("scalevec_lit.arch.llama", ["Llama"])],
    "scalevec_lit.export.arch.qwen3": [("scalevec_lit.arch.qwen3", ["Qwen3"])],
    "scalevec_lit.export.arch.qwen3_moe": [("scalevec_lit.arch.qwen3_moe", ["Qwen3Moe"])],
    "scalevec_lit.export.arch.mixtral": [("scalevec_lit.arch.mixtral", ["Mixtral"])],
    "scalevec_lit.export.arch.glm4_moe": [("scalevec_lit.arch.glm4_moe", ["Glm4Moe"])],
    "scalevec_lit.verify": [("scalevec_lit.checkpoint.verify", [
        "OUT_OF_ROOM", "CheckpointError", "MismatchedCheckpointError", "MissingCheckpointError", "checkpoint_files",
        "unreadable", "verify_checkpoint", "write_failure"])],
    "scalevec_lit.lit.checkpoint": [
        ("scalevec_lit.checkpoint.verify", ["CheckpointError", "unreadable", "verify_checkpoint"]),
        ("scalevec_lit.checkpoint.match", ["SHAPE_KEYS", "check_spec"]),
        ("scalevec_lit.callbacks.checkpoint", ["SafeCheckpointIO", "replace_directory"]),
    ],
}
#: names an alias cannot re-export (its package may not import their home: docs/development.md's layout table);
#: asking for them is an ImportError that names the new home
NAMED_ONLY = {"scalevec_lit.lit.checkpoint": {"SafeCheckpointIO", "replace_directory"}}
#: old module, name -> new module: a name that left a module that is still there (a module-level __getattr__)
MOVED_NAMES = {("scalevec_lit.callbacks.checkpoint", "STOP_SIGNALS"): "scalevec_lit.stopsignal"}


def expected_warning(old: str, homes: list[tuple[str, list[str]]]) -> str:
    parts = [f"{', '.join(names)} from {new}" for new, names in homes]
    where = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{old} is deprecated since 0.2.0 and will be removed in 0.3.0; import {where} instead"


def _fresh_import(old: str, monkeypatch):
    """Import ``old`` as a script would the first time (each alias package above it imported again too)."""
    parts = old.split(".")
    for i in range(len(parts), 1, -1):
        name = ".".join(parts[:i])
        if name in MOVED or name == old:
            monkeypatch.delitem(sys.modules, name, raising=False)
            parent = sys.modules.get(".".join(parts[:i - 1]))
            if parent is not None:
                monkeypatch.delattr(parent, parts[i - 1], raising=False)
    exec(compile(f"import {old}", __file__, "exec"), {})  # an import statement, as a script's
    return sys.modules[old]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_gives_the_same_objects_and_says_where_they_went(old, monkeypatch):
    homes = MOVED[old]
    with pytest.warns(DeprecationWarning) as caught:
        module = _fresh_import(old, monkeypatch)
    texts = [str(w.message) for w in caught if str(w.message).startswith(old + " is deprecated")]
    assert texts == [expected_warning(old, homes)]
    assert "\n" not in texts[0]
    assert caught[-1].filename == __file__  # the warning points at the line that imports the old path

    skipped = NAMED_ONLY.get(old, set())
    assert sorted(module.__all__) == sorted(n for _, names in homes for n in names if n not in skipped)
    for new, names in homes:
        home = importlib.import_module(new)
        for name in names:
            if name in skipped:
                with pytest.raises(ImportError, match=re.escape(f"import {name} from {new} instead")):
                    exec(f"from {old} import {name}", {})
                assert getattr(home, name) is not None
            else:
                assert getattr(module, name) is getattr(home, name), f"{old}.{name} is not {new}.{name}"


@pytest.mark.parametrize(("old", "name"), sorted(MOVED_NAMES))
def test_a_name_that_left_a_module_still_there_gives_the_same_object_and_warns(old, name):
    module = importlib.import_module(old)
    new = MOVED_NAMES[(old, name)]
    assert name not in module.__dict__
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(module, name)
    assert [str(w.message) for w in caught] == [
        f"{old}.{name} is deprecated since 0.2.0 and will be removed in 0.3.0; import {name} from {new} instead"]
    assert value is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        getattr(module, "NOT_A_NAME")


def _module_of(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "callbacks":
        parts = ["scalevec_lit", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_nothing_in_the_package_imports_an_old_path():
    """The library, the callbacks and the benchmarks import the new homes (an alias imports nothing but them)."""
    old = set(MOVED) | {f"{m}.{n}" for m, n in MOVED_NAMES}
    aliases = {ROOT / "scalevec_lit" / "verify.py", ROOT / "scalevec_lit" / "lit" / "checkpoint.py",
               ROOT / "scalevec_lit" / "export" / "checkpoint.py", ROOT / "scalevec_lit" / "export" / "hf_names.py",
               *(ROOT / "scalevec_lit" / "export" / "arch").glob("*.py")}
    found = []
    for folder in ("scalevec_lit", "callbacks", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in aliases:
                continue
            this = _module_of(path)
            package = this if path.name == "__init__.py" else this.rpartition(".")[0]
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                targets = []
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        up = package.split(".")[: len(package.split(".")) - node.level + 1]
                        base = ".".join(up + ([node.module] if node.module else []))
                    targets = [base] + [f"{base}.{a.name}" for a in node.names]
                for target in targets:
                    if target in old:
                        found.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: {target}")
    assert found == []


def test_the_version_is_0_2_0_everywhere_and_the_changelog_lists_every_old_path():
    import scalevec_lit

    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^version = "0\.2\.0"$', pyproject, re.M)
    assert scalevec_lit.__version__ == "0.2.0"
    assert '"scalevec_lit.export.arch"' in pyproject  # the alias package is in the wheel
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [0.2.0] - 2026-12-07" in changelog and "## [0.1.0] - 2026-12-02" in changelog
    deprecated = changelog.split("### Deprecated", 1)[1].split("\n### ", 1)[0]
    assert [m for m in sorted(MOVED) if f"`{m}`" not in deprecated] == []
    assert [f"{m}.{n}" for m, n in MOVED_NAMES if f"`{m}.{n}`" not in deprecated] == []
