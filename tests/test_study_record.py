"""A study's record, and what it holds a study to: the report's data fingerprints, ``endpoints.json`` (which
``lr_from`` reads once the source study's runs are gone), and the refusals to continue a study at another commit
or on data prepared again with other content."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from scalevec_lit import study as st
from scalevec_lit.errors import UserError
from scalevec_lit.study import report as st_report
from test_study import _fake_runs


def test_the_report_names_the_data_by_its_fingerprint(tmp_path):
    """Which preparation the runs read: the report's Data line gives the fingerprint of each split (the same
    after a preparation from the same inputs, ``test_prepare_order.py``)."""
    from scalevec_lit.data.integrity import fingerprint
    from scalevec_lit.data.prepare import prepare
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER

    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("\n\n".join(f"Paragraph {i} of the text." for i in range(200)))
    meta = prepare(texts, DEFAULT_TOKENIZER, tmp_path / "data", num_workers=1, val_fraction=0.3, segment_chars=200,
                   chunk_tokens=256)
    out = tmp_path / "s"
    (out / "runs").mkdir(parents=True)
    spec = {"name": "s", "base": [], "seeds": [1], "args": [f"--data.data_dir={tmp_path / 'data'}"],
            "variants": [{"name": "baseline"}]}
    (out / "runs" / "study.yaml").write_text(yaml.safe_dump(spec))
    _fake_runs(out / "runs", {("baseline", None, 1): 3.0})
    line = next(x for x in st_report.write_report(out).read_text().splitlines() if x.startswith("- Data: "))
    train, val = (fingerprint(str(tmp_path / "data"), meta, split)[:16] for split in ("train", "val"))
    assert f"tokenizer sha256 {meta['tokenizer_sha256']}, data fingerprint train {train}, val {val} (" in line, line


def test_lr_from_takes_the_best_lr_of_another_study(tmp_path):
    results = tmp_path / "results"
    _fake_runs(results / "a" / "runs", {("baseline", 0.001, 1): 3.0, ("baseline", 0.003, 1): 2.8,
                                        ("baseline", 0.01, 1): float("nan"), ("other", 0.01, 1): 1.0})
    study = st.Study(name="b", base=[], args=[], seeds=[1], variants=[st.Variant("baseline"), st.Variant("x")],
                     lr_from={"study": "a", "variant": "baseline"})
    st.resolve_lr_from(study, results / "b" / "runs")
    assert study.lrs == [0.003] and study.lr_from["resolved_lr"] == 0.003
    assert [r.rel().as_posix() for r in study.runs()] == ["baseline/lr0.003/seed1", "x/lr0.003/seed1"]
    cmd = st.fit_command(study, study.variants[0], 1, tmp_path / "r", 0.003)
    assert "--model.optimizer.init_args.lr=0.003" in cmd
    missing = st.Study(name="c", base=[], args=[], seeds=[1], variants=[st.Variant("baseline")],
                       lr_from={"study": "nope"})
    with pytest.raises(UserError, match="no complete runs"):
        st.resolve_lr_from(missing, results / "c" / "runs")


def test_lr_from_reads_the_committed_endpoints_when_the_source_runs_are_gone(tmp_path):
    """A study's runs folder stays on the machine (or scratch disk) that ran it; its report writes
    ``endpoints.json`` beside ``report.md``, and ``lr_from`` resolves from that once the runs are gone."""
    results = tmp_path / "results"
    table = {("baseline", 0.001, 1): 3.0, ("baseline", 0.003, 1): 2.8, ("baseline", 0.003, 2): 2.9,
             ("baseline", 0.001, 2): 2.95, ("baseline", 0.01, 1): float("nan"), ("other", 0.01, 1): 1.0}
    _fake_runs(results / "a" / "runs", table)
    st_report.write_report(results / "a")
    new_study = lambda: st.Study(name="b", base=[], args=[], seeds=[1], variants=[st.Variant("baseline")],
                                 lr_from={"study": "a", "variant": "baseline"})
    from_runs = new_study()
    st.resolve_lr_from(from_runs, results / "b" / "runs")
    shutil.rmtree(results / "a" / "runs")  # only report.md, its figures and endpoints.json remain
    record = json.loads((results / "a" / "endpoints.json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"endpoints.json is not plain JSON: {c}"))
    assert {(r["variant"], r["lr"], r["seed"]): r["endpoint"] for r in record["runs"]} == {
        k: (None if v != v else v) for k, v in table.items()}
    from_record = new_study()
    st.resolve_lr_from(from_record, results / "b" / "runs")
    assert from_record.lrs == from_runs.lrs == [0.003]
    assert from_record.lr_from["source"].endswith("a/endpoints.json")
    assert from_runs.lr_from["source"].endswith("a/runs")
    nan_free = lambda e: {k: [x for x in v if x == x] for k, v in e.items()}
    assert nan_free(from_record.lr_from["endpoints"]) == nan_free(from_runs.lr_from["endpoints"])
    (results / "a" / "endpoints.json").unlink()
    with pytest.raises(UserError, match=r"looked in .*a/runs and in .*a/endpoints.json, which `study report` writes"):
        st.resolve_lr_from(new_study(), results / "b" / "runs")


def test_resume_refuses_another_commit(tmp_path):
    from scalevec_lit.study import runner

    study = st.Study(name="s", base=[], args=[], seeds=[1], variants=[st.Variant("baseline")])
    runner._meta(study, tmp_path, 1, {"commit": "a" * 40, "dirty": False}, False)
    runner._meta(study, tmp_path, 1, {"commit": "a" * 40, "dirty": False}, False)  # same commit: fine
    with pytest.raises(UserError, match="made at commit a+"):
        runner._meta(study, tmp_path, 1, {"commit": "b" * 40, "dirty": False}, False)
    runner._meta(study, tmp_path, 1, {"commit": "b" * 40, "dirty": False}, True)  # explicitly allowed
    meta = json.loads((tmp_path / "study_meta.json").read_text())
    assert meta["code"]["commit"] == "a" * 40 and len(meta["sessions"]) == 3


def test_a_study_refuses_to_continue_on_data_prepared_again_with_other_content(tmp_path):
    """The runner records the data's fingerprints at its first start; a later start on a folder prepared again
    with other content (a new machine whose preparation differs) is refused with one line, the same content
    prepared again is not, and ``--allow-data-change`` goes on."""
    from scalevec_lit.data.prepare import prepare
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER
    from scalevec_lit.study import runner

    def prepared(words: str) -> None:
        texts = tmp_path / f"texts-{words}"
        texts.mkdir(exist_ok=True)
        (texts / "a.txt").write_text("\n\n".join(f"Paragraph {i} of {words}." for i in range(200)))
        prepare(texts, DEFAULT_TOKENIZER, tmp_path / "data", num_workers=1, val_fraction=0.3, segment_chars=200,
                chunk_tokens=256, overwrite=True)

    study = st.Study(name="s", base=[], args=[f"--data.data_dir={tmp_path / 'data'}"], seeds=[1],
                     variants=[st.Variant("baseline")])
    code = {"commit": "a" * 40, "dirty": False}
    prepared("the first text")
    runner._meta(study, tmp_path, 1, code, False)
    first = json.loads((tmp_path / "study_meta.json").read_text())["data"]["fingerprints"]
    prepared("the first text")  # the same inputs again: the same fingerprints
    runner._meta(study, tmp_path, 1, code, False)
    prepared("another text")
    with pytest.raises(UserError) as refused:
        runner._meta(study, tmp_path, 1, code, False)
    text = str(refused.value)
    assert text.startswith(f"study: {tmp_path}: {tmp_path / 'data'}: the runs in this folder read other data: it has "
                           f"been prepared again with other content since (train {first['train'][:16]} then, "), text
    assert text.endswith("; prepare the same inputs again with the same tokenizer (prepare gives the same chunks "
                         "each time), or pass --allow-data-change"), text
    runner._meta(study, tmp_path, 1, code, False, allow_data_change=True)
    meta = json.loads((tmp_path / "study_meta.json").read_text())
    assert meta["data"]["fingerprints"] == first  # the first start's record stays the study's
    assert [s["data"]["fingerprints"] == first for s in meta["sessions"]] == [True, True, False]
