"""The study runner and report (``scalevec_lit.study``): a tiny 2 variants x 2 seeds study really runs,
skips completed runs, continues after being killed, and its report holds the table, verdicts and plots."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from scalevec_lit import study as st
from scalevec_lit.errors import UserError
from scalevec_lit.study import report as st_report

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tiny_study(tmp_path: Path, data_dir: Path) -> Path:
    spec = {
        "name": "tiny",
        "out": str(tmp_path / "study" / "runs"),
        "base": [str(ROOT / "recipes" / "smoke.yaml")],
        "args": [
            f"--data.data_dir={data_dir}", "--trainer.max_steps=6", "--trainer.val_check_interval=3",
            "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--data.batch_size=2",
            "--model.config.n_layer=1", "--model.config.n_embd=32", "--model.config.n_head=2",
            "--model.config.n_kv_head=1", "--model.config.seq_len=32", "--model.schedule.init_args.warmup_steps=1",
        ],
        "seeds": [1, 2],
        "callbacks": {
            "scalevec_lit.callbacks.SafeModelCheckpoint": {"every_n_train_steps": 3, "save_top_k": 1},
            "scalevec_lit.callbacks.ScaleVectorMonitor": {"every_n_steps": 2, "histogram_every_n_steps": 0,
                                                          "heatmap": False},
        },
        "variants": [
            {"name": "baseline", "configs": [str(ROOT / "recipes" / "strategy" / "baseline.yaml")]},
            {"name": "unified", "configs": [str(ROOT / "recipes" / "strategy" / "unified.yaml")],
             "decay": "decay_all"},
        ],
        "claims": [{"title": "unified beats baseline", "expect": {"unified": "lower"}}],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def study_cmd(path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scalevec_lit", "study", "run", str(path), *extra]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_study_runs_resumes_after_kill_skips_done_and_reports(prepared_data, tmp_path):
    path = tiny_study(tmp_path, prepared_data)
    runs = tmp_path / "study" / "runs"
    first = runs / "baseline" / "seed1"

    # 1. start the study one run at a time and kill it (the whole process group) once the first run is done
    proc = subprocess.Popen(study_cmd(path), cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 120
    while not (first / st.DONE).exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "first run did not finish in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_files = sorted(runs.glob(f"*/seed*/{st.DONE}"))
    assert done_files == [first / st.DONE]  # killed before the rest completed
    first_done = (first / st.DONE).read_text()
    first_mtime = (first / st.DONE).stat().st_mtime_ns

    # 2. the same command again: the completed run is skipped, the others run (2 at a time) and complete
    # (--allow-code-change: in a shared checkout someone may commit between the two calls; the guard itself
    # is tested in test_resume_refuses_another_commit)
    res = subprocess.run(study_cmd(path, "--parallel", "2", "--report", "--allow-code-change"), cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "4 runs, 1 complete, 3 to run" in res.stdout
    assert "baseline/seed1" not in res.stdout.split("to run", 1)[1]  # never started again
    assert (first / st.DONE).read_text() == first_done and (first / st.DONE).stat().st_mtime_ns == first_mtime
    losses, ends = {}, {}
    for variant in ("baseline", "unified"):
        for seed in (1, 2):
            root = runs / variant / f"seed{seed}"
            done = json.loads((root / st.DONE).read_text())
            assert done["final_step"] == 5 and done["variant"] == variant and done["seed"] == seed
            val = st.read_scalars(root, ("val/loss",))["val/loss"]
            assert [s for s, _ in val] == [2, 5]  # one value per validation, no duplicates
            assert done["final_val_loss"] == pytest.approx(val[-1][1])
            assert done["endpoint"] == pytest.approx((val[-1][1] + val[-2][1]) / 2)  # mean of the last two
            assert done["endpoint_steps"] == [2, 5] and done["last_train_step"] == 5
            assert len(done["code"]["commit"]) in (40, 7) or done["code"]["commit"] == "unknown"
            ends[variant, seed] = done["endpoint"]
            assert "--ckpt_path" not in done["command"]  # no run had a checkpoint when it started
            assert f"--seed_everything={seed}" in done["command"] and f"--data.seed={seed}" in done["command"]
            assert not (root / st.CKPT_DIR).exists()  # checkpoints are dropped once a run is complete
            losses[variant, seed] = done["final_val_loss"]
        # the decay preset reached the run: the resolved config Lightning saved names it
        saved = yaml.safe_load(next((runs / variant / "seed1").rglob("config.yaml")).read_text())
        presets = [c["init_args"]["preset"] for c in saved["trainer"]["callbacks"]
                   if c["class_path"].endswith("RoleWeightDecay")]
        assert presets == (["iwd"] if variant == "baseline" else ["decay_all"])
    assert losses["baseline", 1] != losses["baseline", 2]  # seeds differ (init and data order)

    # 3. the report: table with the runs' numbers, a claim verdict, and real PNG plots
    out = tmp_path / "study"
    report = (out / "report.md").read_text()
    for variant in ("baseline", "unified"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {variant} |"))
        assert f"1: {ends[variant, 1]:.4f}, 2: {ends[variant, 2]:.4f}" in row
    mean_diff = (ends["unified", 1] + ends["unified", 2] - ends["baseline", 1] - ends["baseline", 2]) / 2
    assert f"{mean_diff:+.4f}" in report
    assert "### unified beats baseline" in report and "**Verdict: " in report
    assert "last evaluation at the final step in every non-diverged run: **yes**" in report
    for png in ("val_loss.png", "paired.png", "scale_dynamics.png"):
        data = (out / png).read_bytes()
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # IHDR
        assert data[:8] == PNG_MAGIC and width >= 300 and height >= 300 and len(data) > 5_000, (png, width, height)
    assert "![scale dynamics](scale_dynamics.png)" in report

    # 4. everything done: a third call runs nothing
    res = subprocess.run(study_cmd(path), cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "4 complete, 0 to run" in res.stdout


def test_incomplete_run_with_checkpoint_resumes_from_last(tmp_path):
    study = st.Study(name="s", base=[str(ROOT / "recipes" / "smoke.yaml")], args=[], seeds=[1],
                     variants=[st.Variant("baseline")])
    root = tmp_path / "baseline" / "seed1"
    assert "--ckpt_path=last" not in st.fit_command(study, study.variants[0], 1, root)
    (root / st.CKPT_DIR).mkdir(parents=True)
    (root / st.CKPT_DIR / "last.ckpt").write_bytes(b"x")
    assert st.fit_command(study, study.variants[0], 1, root)[-1] == "--ckpt_path=last"


def test_callbacks_update_in_place_or_append():
    smoke = st.Study(name="s", base=[str(ROOT / "recipes" / "smoke.yaml")], args=[], seeds=[1],
                     variants=[st.Variant("a", decay="decay_none")],
                     callbacks={"scalevec_lit.callbacks.ScaleVectorMonitor": {"every_n_steps": 7}})
    cbs = st.run_callbacks(smoke, smoke.variants[0])
    paths = [c["class_path"] for c in cbs]
    assert paths.count(st.RWD) == 1 and paths.count("scalevec_lit.callbacks.ScaleVectorMonitor") == 1
    assert cbs[paths.index(st.RWD)]["init_args"]["preset"] == "decay_none"
    assert cbs[paths.index("scalevec_lit.callbacks.ScaleVectorMonitor")]["init_args"] == {"every_n_steps": 7}
    # dense_0.12b lists both with other settings: updated in place, the recipe's other init args kept
    gpu = st.Study(name="g", base=[str(ROOT / "recipes" / "dense_0.12b.yaml")], args=[], seeds=[1],
                   variants=[st.Variant("b")], callbacks=dict(smoke.callbacks))
    cbs = st.run_callbacks(gpu, gpu.variants[0])
    paths = [c["class_path"] for c in cbs]
    assert paths.count(st.RWD) == 1 and paths.count("scalevec_lit.callbacks.ScaleVectorMonitor") == 1
    assert cbs[paths.index("scalevec_lit.callbacks.ScaleVectorMonitor")]["init_args"] == {
        "every_n_steps": 7, "histogram_every_n_steps": 1000}
    assert cbs[paths.index(st.RWD)]["init_args"] == {"preset": "iwd"}
    # a recipe listing neither gets both appended, with the default decay preset
    bare = st.Study(name="b", base=[str(ROOT / "recipes" / "examples" / "parallel_block.yaml")], args=[], seeds=[1],
                    variants=[st.Variant("c")], callbacks=dict(smoke.callbacks))
    cbs = st.run_callbacks(bare, bare.variants[0])
    assert cbs[-2:] == [{"class_path": "scalevec_lit.callbacks.ScaleVectorMonitor", "init_args": {"every_n_steps": 7}},
                        {"class_path": st.RWD, "init_args": {"preset": "iwd"}}]


def test_study_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"variants": [{"name": "a"}], "baseline": "a",
                                   "claims": [{"title": "t", "expect": {"b": "lower"}}]}))
    with pytest.raises(UserError, match=r"claims\[0\].expect: b: not a variant of this study"):
        st.load_study(bad)
    bad.write_text(yaml.safe_dump({"variants": [{"name": "a"}], "sedes": [1]}))
    with pytest.raises(UserError, match="sedes: sedes: unknown key; did you mean `seeds`"):
        st.load_study(bad)
    bad.write_text(yaml.safe_dump({"variants": [{"name": "a"}]}))
    with pytest.raises(UserError, match="baseline: baseline: not a variant of this study"):
        st.load_study(bad)
    bad.write_text(yaml.safe_dump({"variants": [{"name": "baseline"}], "primary": "best"}))
    with pytest.raises(UserError, match="primary must be best_lr or pooled"):
        st.load_study(bad)


@pytest.mark.parametrize("name", ["claims_cpu", "claims_0.12b"])
def test_shipped_studies_cover_the_four_claims(name):
    study = st.load_study(ROOT / "recipes" / "ablation" / f"{name}.yaml")
    names = {v.name for v in study.variants}
    assert {"baseline", "no_scale", "hg", "dp", "dnp", "or", "er", "unified"} <= names
    decays = {v.decay for v in study.variants if any("qk_norm" in c for c in v.configs)}
    assert decays == {"iwd", "decay_all", "decay_none"}
    assert len(study.seeds) >= 3 and len(study.claims) == 4
    for v in study.variants:
        for c in [*study.base, *v.configs]:
            assert (ROOT / c).is_file(), c


# -- the report on synthetic runs (no training) -------------------------------------------------------------
def _fake_runs(runs_dir: Path, table: dict) -> None:
    for (variant, lr, seed), e in table.items():
        root = runs_dir / st.Run(variant, lr, seed).rel()
        root.mkdir(parents=True)
        done = {"variant": variant, "seed": seed, "lr": lr, "endpoint": e, "final_val_loss": e,
                "final_step": 199, "last_train_step": 199, "endpoint_steps": [149, 199], "train_tokens": 409600,
                "val": [[49, e + 1.0], [99, e + 0.5], [149, e + 0.1], [199, e]], "finished": "t",
                "wall_s_last_attempt": 60.0, "code": {"commit": "c" * 40, "dirty": False}}
        if e != e:
            done["diverged"] = "non-finite loss nan at step 7"
        (root / st.DONE).write_text(json.dumps(done))


def test_report_from_synthetic_grid(tmp_path):
    lrs = [0.001, 0.003, 0.01]
    base = {0.001: 3.00, 0.003: 2.90, 0.01: 2.95}
    table = {}
    for lr in lrs:
        for s in (1, 2, 3):
            table["baseline", lr, s] = base[lr] + 0.01 * s
            table["worse", lr, s] = base[lr] + 0.01 * s + 0.05 + 0.001 * s  # worse in every cell
    table["worse", 0.01, 3] = float("nan")  # one diverged run
    spec = {"name": "synthetic", "base": [], "seeds": [1, 2, 3], "lrs": lrs, "primary": "pooled",
            "preregistration": "hypothesis: worse is worse",
            "variants": [{"name": "baseline"}, {"name": "worse"}],
            "claims": [{"title": "worse is worse", "expect": {"worse": "higher"}}]}
    out = tmp_path / "synthetic"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "study.yaml").write_text(yaml.safe_dump(spec))
    _fake_runs(out / "runs", table)
    report = st_report.write_report(out).read_text()
    assert "> hypothesis: worse is worse" in report
    assert "| baseline | 0.003 ★ | 3 | 2.9200 ± 0.0100 |" in report
    assert "| worse | 0.01 | 3 |" in report and "3: diverged" in report
    # pooled over 3 LRs x 3 seeds = 9 pairs, all with the variant worse: sign test p = 2/512
    assert "| `worse` − `baseline` | pooled over 3 LRs × seeds | higher | sign | 9 |" in report
    assert "0.004 (9+/0−)" in report and "smallest possible two-sided sign-test p is 0.0039 with 9 pairs" in report and "**holds**" in report and "**Verdict: holds.**" in report
    # same-LR at 0.003: differences 0.051, 0.052, 0.053
    row = next(line for line in report.splitlines() if line.startswith("| same LR 0.003 |"))
    assert "| 3 | +0.0520 ± 0.0010 |" in row and "3+/0−" in row
    # the interval is named, and is the Student-t one: 0.052 ± t_{0.975, 2} · 0.001 / √3 = ± 0.00248
    assert "| Student-t 95% CI of the mean |" in report and "paired mean (Student-t 95% CI)" in report
    assert "| [+0.0495, +0.0545] |" in row and "bootstrap" not in report
    assert "Gap at the same LR (the reference's best, 0.003): +0.0520" in report
    for png in ("val_loss.png", "lr_sweep.png", "paired.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("name", ["claim1_lr_cpu", "dnp_cpu", "claim1_lr_0.12b", "dnp_0.12b", "iwd_cpu"])
def test_issue13_studies_are_well_formed(name):
    study = st.load_study(ROOT / "recipes" / "ablation" / f"{name}.yaml")
    assert study.preregistration and len(study.seeds) >= 2 and study.endpoint_evals == 2
    assert "--trainer.check_val_every_n_epoch=null" in study.args  # validation counted in global steps
    recipe = yaml.safe_load((ROOT / study.base[0]).read_text())["trainer"]
    arg = lambda key, default: next((a.split("=", 1)[1] for a in study.args if a.startswith(f"--trainer.{key}=")),
                                    default)
    steps, every = int(arg("max_steps", recipe["max_steps"])), int(arg("val_check_interval", recipe["val_check_interval"]))
    assert steps % every == 0  # the last evaluation is at the final step
    if name.endswith("_cpu"):
        assert arg("limit_val_batches", None) == "1.0"  # the full validation split
    for v in study.variants:
        for c in [*study.base, *v.configs]:
            assert (ROOT / c).is_file(), c
    if name.startswith("claim1_lr"):
        assert len(study.lrs) == 4 and {v.name for v in study.variants} == {"baseline", "no_scale"}
        assert study.primary == "pooled"
    elif name.startswith("dnp"):
        assert study.lr_from["study"] == name.replace("dnp", "claim1_lr")
        assert {"baseline", "unified", "unified_no_dnp"} <= {v.name for v in study.variants}
    else:  # claim 2: the three decay presets on the QK-norm model, decay raised so that it can matter
        assert {v.decay for v in study.variants} == {"iwd", "decay_all", "decay_none"}
        assert study.callbacks[st.RWD]["weight_decay"] == 1.0
    if name == "claim1_lr_cpu":
        assert study.lrs == [1e-3, 3e-3, 1e-2, 3e-2]


def test_data_option_reaches_the_runs_and_the_report(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "base": [str(ROOT / "recipes" / "smoke.yaml")],
                                    "args": ["--data.data_dir=elsewhere"], "variants": [{"name": "baseline"}]}))
    assert st.main(["run", str(path), "--out", str(tmp_path / "runs"), "--dry-run", "--data", "my/data"]) == 0
    cmd = capsys.readouterr().out.splitlines()[-1]
    assert "--data.data_dir=my/data" in cmd and "elsewhere" not in cmd
    from scalevec_lit.study import runner

    study = st.load_study(path)
    study.args = ["--data.data_dir=my/data"]
    runner._meta(study, tmp_path, 1, {"commit": "a" * 40, "dirty": False}, False)
    meta = json.loads((tmp_path / "study_meta.json").read_text())
    assert meta["data_dir"] == "my/data"
    from scalevec_lit.study.provenance import _data_line

    assert _data_line(study, meta).startswith("Data: `my/data`")
