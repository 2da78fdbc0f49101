"""``inspect --out DIR`` writes through the output-folder rule of prepare/export/import/convert
(``scalevec_lit/outdir.py``): a folder holding files inspect did not write (a user's ``scales.csv``) or
prepared data is refused, byte for byte unchanged, before the checkpoint is read; an earlier output of
inspect is replaced only with ``--overwrite``, the user's other files beside it staying; a damaged manifest
is called damaged."""
from __future__ import annotations

import json

from test_generate import write_ckpt
from test_inspect import native, run_main

MANIFEST = ".scalevec_manifest.json"


def _refused(argv, message):
    code, out, err = run_main(argv)
    assert (code, out) == (2, ""), err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_users_files_and_prepared_data_are_refused_and_kept(tmp_path):
    ckpt = str(tmp_path / "never-read.ckpt")  # the refusal comes before the checkpoint is read
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "scales.csv").write_text("my,own\n")
    for extra in ([], ["--overwrite"]):
        _refused([ckpt, "--out", str(mine), *extra], f"--out: {str(mine)!r}: holds files that inspect did not "
                 "write (scales.csv); choose a new or empty folder")
    assert [p.name for p in mine.iterdir()] == ["scales.csv"] and (mine / "scales.csv").read_text() == "my,own\n"
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text("{}")
    (data / MANIFEST).write_text(json.dumps({"command": "prepare", "files": ["meta.json", "train", "val"]}))
    _refused([ckpt, "--out", str(data), "--overwrite"], f"--out: {str(data)!r}: holds the output of prepare, which "
             "inspect does not replace (.scalevec_manifest.json, meta.json)")
    assert sorted(p.name for p in data.iterdir()) == [MANIFEST, "meta.json"]
    (data / MANIFEST).write_text("{not json")
    _refused([ckpt, "--out", str(data)], f"--out: {str(data)!r}: its manifest {MANIFEST} is damaged (JSONDecodeError")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "mine"]  # no temporary sibling left


def test_a_second_run_replaces_its_own_output_only_with_overwrite(tmp_path):
    spec, model = native("baseline", False, {})
    ckpt = str(write_ckpt(model, spec, tmp_path / "a.ckpt"))
    other = str(write_ckpt(native("baseline", False, {}, seed=2)[1], spec, tmp_path / "b.ckpt"))
    out = tmp_path / "report"
    code, text, err = run_main([ckpt, "--out", str(out)])
    assert code == 0, err
    first = sorted(p.name for p in out.iterdir())
    assert first == sorted([MANIFEST, "scales.csv", "scales.json", "profile_input.png", "heatmap_input.png"])
    assert json.loads((out / MANIFEST).read_text())["command"] == "inspect"
    csv = (out / "scales.csv").read_bytes()
    _refused([ckpt, "--out", str(out)], f"--out: {str(out)!r} exists and is not an empty folder: it already holds the "
             "output of inspect (heatmap_input.png, profile_input.png, scales.csv, scales.json); pass --overwrite")
    assert (out / "scales.csv").read_bytes() == csv
    (out / "notes.txt").write_text("mine")  # the user's file beside inspect's output stays
    code, text, err = run_main([ckpt, "--compare", other, "--out", str(out), "--overwrite"])
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST, "notes.txt", "compare.csv", "compare.json", "profile_input.png", "heatmap_input_A.png",
         "heatmap_input_B.png", "heatmap_input_delta.png"])
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "b.ckpt", "report"]
