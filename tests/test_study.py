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
    res = subprocess.run(study_cmd(path, "--parallel", "2", "--report"), cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "4 runs, 1 complete, 3 to run" in res.stdout
    assert "baseline/seed1" not in res.stdout.split("to run", 1)[1]  # never started again
    assert (first / st.DONE).read_text() == first_done and (first / st.DONE).stat().st_mtime_ns == first_mtime
    losses = {}
    for variant in ("baseline", "unified"):
        for seed in (1, 2):
            root = runs / variant / f"seed{seed}"
            done = json.loads((root / st.DONE).read_text())
            assert done["final_step"] == 5 and done["variant"] == variant and done["seed"] == seed
            val = st.read_scalars(root, ("val/loss",))["val/loss"]
            assert [s for s, _ in val] == [2, 5]  # one value per validation, no duplicates
            assert done["final_val_loss"] == pytest.approx(val[-1][1])
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
        assert f"{losses[variant, 1]:.4f}, {losses[variant, 2]:.4f}" in row
    mean_diff = (losses["unified", 1] + losses["unified", 2] - losses["baseline", 1] - losses["baseline", 2]) / 2
    assert f"{mean_diff:+.4f}" in report
    assert "### unified beats baseline" in report and "**Verdict: " in report
    for png in ("val_loss.png", "terminal_loss.png", "scale_dynamics.png"):
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


def test_separation_rule_and_verdicts():
    ref = st.Row("ref", {1: 3.00, 2: 3.02, 3: 3.01}, 3.01, 0.01)
    clear = st.Row("a", {1: 2.90, 2: 2.92, 3: 2.91}, 2.91, 0.01)
    c = st.compare(clear, ref)
    assert c["diff"] == pytest.approx(-0.10) and c["separable"]
    assert c["paired_mean"] == pytest.approx(-0.10) and c["paired_std"] == pytest.approx(0.0, abs=1e-9)
    assert st.verdict(c, "lower") == "holds" and st.verdict(c, "higher") == "does not hold"
    noisy = st.Row("b", {1: 2.98, 2: 3.02, 3: 2.97}, 2.99, 0.0265)
    c = st.compare(noisy, ref)  # |−0.02| < 2 × sqrt((0.0265² + 0.01²)/2) ≈ 0.040
    assert not c["separable"] and st.verdict(c, "lower").startswith("not separable")
    assert st._overall(["holds", "holds"]) == "holds"
    assert st._overall(["holds", "does not hold"]).startswith("mixed")


def test_study_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"variants": [{"name": "a"}], "claims": [{"title": "t", "expect": {"b": "lower"}}]}))
    with pytest.raises(SystemExit, match="unknown variant 'b'"):
        st.load_study(bad)
    bad.write_text(yaml.safe_dump({"variants": [{"name": "a"}], "sedes": [1]}))
    with pytest.raises(SystemExit, match="unknown keys"):
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
