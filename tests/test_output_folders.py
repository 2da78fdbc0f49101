"""The output folders of ``prepare``, ``export``, ``import`` and ``convert`` (``scalevec_lit/outdir.py``): an
output that overlaps an input is refused; a command replaces only the files its manifest lists; a failure
leaves the output byte-identical and no temporary sibling; an export in one format over one in another
leaves only the new format's files; a damaged import source is named, not reported as a bug.

Every case runs the command in-process (``helpers.check``: exit code, one ``error:`` paragraph, no traceback,
nothing outside ``world.path / "out"`` changed) and hashes the output folder before and after. The models
are tiny (2 layers, 64 wide) and written once per module; the prepare inputs are three short texts.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

import scalevec_lit.cli  # noqa: F401 - imports Lightning before any test captures stderr (see test_bad_input.py)
from helpers import ROOT, check, file_hashes, tiny_config
from scalevec_lit.outdir import MANIFEST

BASELINE = ROOT / "recipes" / "strategy" / "baseline.yaml"
HF_ONLY = {"config.json", "generation_config.json"}
NATIVE_ONLY = {"scalevec_spec.json"}
COMMON = {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", MANIFEST}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """A tiny baseline model as a native folder (what export and convert read) and as a transformers folder
    (what import reads), both with the embedded tokenizer (4096 tokens, as ``tiny_config``)."""
    from scalevec_lit.export import save_hf, save_native
    from scalevec_lit.model.spec import build_from_spec

    strategy = yaml.safe_load(BASELINE.read_text())["model"]["strategy"]
    spec = {"config": dataclasses.asdict(tiny_config()), "strategy": strategy,
            "block": {"class_path": "scalevec_lit.model.block.Block"}}
    model = build_from_spec(spec).eval()
    base = tmp_path_factory.mktemp("sources")
    save_native(model, base / "native")
    save_hf(model, base / "hf")
    return base


def leftovers(*folders: Path) -> list[Path]:
    """Temporary or replaced-files siblings left anywhere under ``folders``."""
    return [p for f in folders for pattern in (".*.tmp-*", ".*.old-*") for p in Path(f).rglob(pattern)]


def texts(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"t{i}.txt").write_text("\n\n".join(f"Line {j} of text {i}, with words." for j in range(80)))
    return folder


def prep(*args) -> list:
    return ["prepare", "--num-workers", "1", "--segment-chars", "200", "--val-fraction", "0.3", *map(str, args)]


def command(name: str, src: Path, out: Path, *extra) -> list:
    """``name`` reading ``src`` (a copy of a module source) and writing ``out``."""
    if name == "export":
        return ["export", "--ckpt", src, "--out", out, *extra]
    if name == "import":
        return ["import", "--hf", src, "--out", out, *extra]
    return ["convert", "--ckpt", src, "--strategy", BASELINE, "--out", out, *extra]


def source_copy(sources: Path, name: str, dest: Path) -> Path:
    shutil.copytree(sources / ("hf" if name == "import" else "native"), dest)
    return dest


# -- an output that overlaps an input -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["export", "import", "convert"])
@pytest.mark.parametrize("where", ["equal", "inside", "contains", "symlink"])
def test_output_overlapping_the_input_is_refused_even_with_overwrite(world, capfd, sources, name, where):
    box = world.path / "box"
    src = source_copy(sources, name, box / "model")
    out = {"equal": src, "inside": src / "sub", "contains": box, "symlink": world.path / "link"}[where]
    if where == "symlink":
        out.symlink_to(src, target_is_directory=True)
    words = {"equal": "is the input", "inside": "is inside the input", "contains": "contains the input",
             "symlink": "is the input"}[where]
    check(world, capfd, command(name, src, out, "--overwrite"), 2, f"--out: '{out}'", words,
          "choose an output folder outside the input")
    assert not (src / "sub").exists() and not leftovers(world.path)


# -- what a command owns ------------------------------------------------------------------------------------
def test_prepare_overwrite_refuses_the_users_own_train_and_meta(world, capfd):
    """A folder with a ``meta.json`` is not prepare's unless its manifest says so: nothing is deleted."""
    mine = world.path / "mine"
    (mine / "train").mkdir(parents=True)
    (mine / "train" / "notes.txt").write_text("my training notes")
    (mine / "meta.json").write_text('{"mine": true}')
    check(world, capfd, prep("--input", texts(world.path / "texts"), "--output", mine, "--overwrite"), 2,
          "holds files that prepare did not write (meta.json, train)", "never deletes")
    assert (mine / "train" / "notes.txt").read_text() == "my training notes"


def test_prepare_reads_the_manifest_of_older_versions(world, capfd):
    """A folder prepared before the shared manifest (``.prepare_manifest.json``) is replaced with --overwrite;
    the user's file beside it stays, and the old manifest gives way to the new one."""
    src, out = texts(world.path / "texts"), world.path / "out" / "prep"
    check(world, capfd, prep("--input", src, "--output", out), 0, "prepared")
    (out / MANIFEST).rename(out / ".prepare_manifest.json")
    (out / ".prepare_manifest.json").write_text(json.dumps({"writes": ["train", "val", "meta.json",
                                                                       ".prepare_manifest.json"]}))
    (out / "README.txt").write_text("the user's notes")
    check(world, capfd, prep("--input", src, "--output", out), 2, "already holds prepared data", "--overwrite")
    check(world, capfd, prep("--input", src, "--output", out, "--overwrite"), 0, "prepared")
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, "README.txt", "meta.json", "train", "val"])
    assert json.loads((out / MANIFEST).read_text())["files"] == ["meta.json", "train", "val"]


@pytest.mark.parametrize("holder", ["user", "prepare"])
def test_model_commands_refuse_a_folder_they_do_not_own_even_with_overwrite(world, capfd, sources, holder):
    out = world.path / "out" / "folder"
    if holder == "user":
        out.mkdir(parents=True)
        (out / "config.json").write_text('{"mine": true}')
    else:  # prepared data is not a model folder
        check(world, capfd, prep("--input", texts(world.path / "texts"), "--output", out), 0, "prepared")
    before = file_hashes(out)
    check(world, capfd, command("export", sources / "native", out, "--overwrite"), 2,
          "holds files that export did not write" if holder == "user" else
          "holds the output of prepare, which export does not replace")
    assert file_hashes(out) == before and not leftovers(world.path)


def test_a_new_file_never_replaces_a_file_the_command_did_not_write(world, capfd, sources):
    """A native export, then the user's own ``config.json`` beside it: an hf export would have to replace it."""
    out = world.path / "out" / "model"
    check(world, capfd, command("export", sources / "native", out, "--format", "native"), 0, "exported")
    (out / "config.json").write_text('{"mine": true}')
    before = file_hashes(out)
    check(world, capfd, command("export", sources / "native", out, "--overwrite"), 2,
          "holds config.json, which export did not write and would have to replace")
    assert file_hashes(out) == before and not leftovers(world.path)


def test_export_over_an_export_in_another_format_leaves_only_the_new_format(world, capfd, sources, monkeypatch):
    """hf, then native, then hf, then convert's native + model.yaml: each time only the new files, and the
    user's file beside them stays."""
    from scalevec_lit.export import load_native

    out = world.path / "out" / "model"
    check(world, capfd, command("export", sources / "native", out), 0, "exported")
    (out / "NOTES.md").write_text("the user's notes")
    check(world, capfd, command("export", sources / "native", out, "--format", "native"), 2,
          "already holds the output of export", "--overwrite")
    check(world, capfd, command("export", sources / "native", out, "--format", "native", "--overwrite"), 0, "exported")
    assert {p.name for p in out.iterdir()} == COMMON | NATIVE_ONLY | {"NOTES.md"}
    load_native(out)
    check(world, capfd, command("export", sources / "native", out, "--overwrite"), 0, "exported")
    assert {p.name for p in out.iterdir()} == COMMON | HF_ONLY | {"NOTES.md"}
    assert json.loads((out / MANIFEST).read_text())["command"] == "export"
    real_mkdir = Path.mkdir

    def no_sibling(path, *args, **kwargs):  # a parent folder the user may not write to (tests run as root)
        if path.name.startswith(f".{out.name}.tmp-"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", no_sibling)  # the temporary folder goes inside --out instead
    check(world, capfd, command("convert", sources / "native", out, "--overwrite"), 0, "wrote")
    assert {p.name for p in out.iterdir()} == COMMON | NATIVE_ONLY | {"model.yaml", "NOTES.md"}
    assert (out / "NOTES.md").read_text() == "the user's notes" and not leftovers(world.path)


# -- a failure leaves the output as it was ------------------------------------------------------------------
def _fail_on_tokenizer(monkeypatch, error: BaseException) -> None:
    """The tokenizer files are written after the weights: fail there, with the weights already written."""
    import scalevec_lit.export.write as write

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(write, "write_tokenizer", broken)


@pytest.mark.parametrize("name", ["export", "import", "convert"])
@pytest.mark.parametrize("error, code, words", [(OSError(28, "No space left on device"), 1, "No space left"),
                                                (KeyboardInterrupt(), 130, "")])
def test_a_model_command_that_fails_leaves_the_output_as_it_was(world, capfd, sources, monkeypatch, name, error,
                                                                code, words):
    """An hf export is there; the command (writing the native format) fails after writing the weights."""
    src = source_copy(sources, name, world.path / "src")
    out = world.path / "out" / "model"
    check(world, capfd, command("export", sources / "native", out), 0, "exported")
    (out / "NOTES.md").write_text("the user's notes")
    before = file_hashes(out)
    _fail_on_tokenizer(monkeypatch, error)
    native = ("--format", "native") if name == "export" else ()
    check(world, capfd, command(name, src, out, "--overwrite", *native), code, words)
    assert file_hashes(out) == before and not leftovers(world.path)
    check(world, capfd, command(name, src, world.path / "out" / "new" / "deeper" / "model", *native), code, words)
    assert not (world.path / "out" / "new").exists() and not leftovers(world.path)


@pytest.mark.parametrize("error, code, words", [(OSError(28, "No space left on device"), 1, "No space left"),
                                                (KeyboardInterrupt(), 130, "")])
def test_a_prepare_that_fails_midway_leaves_the_output_as_it_was(world, capfd, monkeypatch, error, code, words):
    """The train split is written, then writing the val split fails: an earlier output stays as it was, with
    the skipped files printed before the error; a new output is not created (nor its parent folders), so the
    next prepare there is not told that it "already holds prepared data"."""
    import litdata

    src, out = texts(world.path / "texts"), world.path / "out" / "prep"
    (src / "image.txt").write_bytes(bytes(range(256)) * 40)
    check(world, capfd, prep("--input", src, "--output", out), 0, "prepared")
    (out / "README.txt").write_text("the user's notes")
    before = file_hashes(out)
    real = litdata.optimize

    def optimize(**kwargs):
        if kwargs["output_dir"].endswith("val"):
            raise error
        return real(**kwargs)

    monkeypatch.setattr(litdata, "optimize", optimize)
    text = check(world, capfd, prep("--input", src, "--output", out, "--overwrite"), code, words)
    assert file_hashes(out) == before and not leftovers(world.path)
    assert "prepare:   skipped 1 binary file(s): image.txt" in text
    fresh = world.path / "out" / "new" / "prep"
    text = check(world, capfd, prep("--input", src, "--output", fresh), code, words)
    assert text.index("prepare:   skipped 1 binary file(s): image.txt") < text.index("error: ")
    assert not (world.path / "out" / "new").exists() and not leftovers(world.path)
    monkeypatch.setattr(litdata, "optimize", real)  # nothing there that the next prepare calls prepared data
    check(world, capfd, prep("--input", src, "--output", fresh), 0, "prepared")


def test_a_temporary_folder_of_a_killed_command_is_named(world, capfd, sources):
    out = world.path / "out" / "model"
    stale = out.parent / f".{out.name}.tmp-999999999"  # above any pid_max: no such process
    (stale / "part").mkdir(parents=True)
    check(world, capfd, command("export", sources / "native", out), 0, "exported",
          f"warning: {stale}: left by an interrupted export")
    assert stale.is_dir()  # named, not deleted: a command removes only what its manifest lists


# -- a damaged import source --------------------------------------------------------------------------------
@pytest.mark.parametrize("damaged", ["model.safetensors", "config.json"])
def test_import_of_a_truncated_file_names_it(world, capfd, sources, damaged):
    src = source_copy(sources, "import", world.path / "hf")
    data = (src / damaged).read_bytes()
    (src / damaged).write_bytes(data[: len(data) // 2])
    text = check(world, capfd, command("import", src, world.path / "out" / "model"), 1, f"error: {src / damaged}:",
                 "truncated or damaged", "copy it again")
    assert "internal" not in text and not (world.path / "out").exists()
    assert os.listdir(world.path) == ["hf"]


def test_import_of_a_config_without_a_required_key_names_it(world, capfd, sources):
    src = source_copy(sources, "import", world.path / "hf")
    config = json.loads((src / "config.json").read_text())
    del config["hidden_size"]
    (src / "config.json").write_text(json.dumps(config))
    text = check(world, capfd, command("import", src, world.path / "out" / "model"), 2,
                 f"error: {src / 'config.json'}: no 'hidden_size': a key every checkpoint of its architecture has is "
                 "missing")
    assert "internal" not in text and not (world.path / "out").exists()
