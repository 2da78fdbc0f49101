"""Pre-registered secondary endpoints and power (``study/secondary.py``): the file's checks, the seeds a
design needs, the endpoint read from TensorBoard events, and the report's paired comparison."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from scalevec_lit import study as st
from scalevec_lit.errors import UserError
from scalevec_lit.study import report as st_report
from scalevec_lit.study import stats
from scalevec_lit.study.secondary import endpoints_of, power_line, seeds_needed
from scalevec_lit.study.spec import load_study

SPEC = {"name": "sec", "base": [], "seeds": [1, 2, 3, 4], "baseline": "iwd",
        "variants": [{"name": "iwd"}, {"name": "decay_none"}],
        "secondary": [{"tag": "sharpness/precond_lambda_max", "evals": 2, "name": "preconditioned sharpness",
                       "expect": {"decay_none": "higher"}}],
        "power": {"mde": 0.05, "pilot_sd": 0.02, "endpoint": "primary", "source": "study X"}}


def _write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_seeds_needed_is_the_first_n_whose_mde_fits():
    for sd, mde in [(0.02, 0.05), (0.023, 0.026), (1.0, 0.5)]:
        n = seeds_needed(sd, mde)
        assert stats.detectable(sd, n)["mde"] <= mde < stats.detectable(sd, n - 1)["mde"] if n > 2 else True
    assert seeds_needed(0.023, 0.026) == 9  # the claim-1 pilot: 8 seeds was the rough figure, 9 the exact one
    assert seeds_needed(1.0, 1e-3) is None


def test_study_file_checks(tmp_path):
    study = load_study(_write(tmp_path, SPEC))
    assert study.secondary[0]["reference"] == "iwd" and study.power["level"] == 0.8
    line = power_line(study)
    assert f"needs {seeds_needed(0.02, 0.05)} seeds; the study has 4: enough" in line and "(source: study X)" in line
    bad = [({"secondary": [{"tag": "x", "oops": 1}]}, r"secondary\[0\]\.oops: oops: unknown key"),
           ({"secondary": [{"tag": "x", "expect": {"nope": "lower"}}]}, "nope: not a variant of this study"),
           ({"secondary": [{"tag": "x", "expect": {"decay_none": "up"}}]}, "must be lower or higher"),
           ({"power": {"pilot_sd": 0.1}}, "power needs `mde`"),
           ({"power": {"mde": 0.1, "endpoint": "val/other"}}, "neither `primary` nor a secondary tag"),
           ({"power": {"mde": -1}}, "mde must be > 0")]
    for change, message in bad:
        with pytest.raises(UserError, match=message):
            load_study(_write(tmp_path, {**SPEC, **change}))
    few = load_study(_write(tmp_path, {**SPEC, "seeds": [1, 2], "power": {"mde": 0.01, "pilot_sd": 0.02}}))
    assert "NOT enough" in power_line(few)


def test_endpoint_read_from_events(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "tb"))
    for step, v in [(10, 5.0), (20, 7.0), (30, 9.0)]:
        w.add_scalar("sharpness/precond_lambda_max", v, step)
    w.close()
    study = load_study(_write(tmp_path, SPEC))
    got = endpoints_of(tmp_path, study)
    assert got == {"sharpness/precond_lambda_max": {"value": 8.0, "steps": [20, 30], "n": 2}}
    study.secondary[0]["log"] = True
    got = endpoints_of(tmp_path, study)["sharpness/precond_lambda_max"]
    assert got["value"] == pytest.approx((math.log(7.0) + math.log(9.0)) / 2, rel=1e-12)


def test_report_compares_secondary_endpoints_paired(tmp_path):
    out = tmp_path / "sec"
    runs = out / "runs"
    runs.mkdir(parents=True)
    (runs / "study.yaml").write_text(yaml.safe_dump(SPEC))
    sharp = {"iwd": [10.0, 11.0, 12.0, 13.0], "decay_none": [12.0, 13.5, 14.0, 15.5]}
    for v in ("iwd", "decay_none"):
        for i, seed in enumerate((1, 2, 3, 4)):
            root = runs / st.Run(v, None, seed).rel()
            root.mkdir(parents=True)
            e = 3.0 + 0.01 * seed
            (root / st.DONE).write_text(json.dumps({
                "variant": v, "seed": seed, "lr": None, "endpoint": e, "final_val_loss": e, "final_step": 9,
                "last_train_step": 9, "endpoint_steps": [4, 9], "val": [[4, e], [9, e]], "finished": "t",
                "wall_s_last_attempt": 1.0, "code": {"commit": "c" * 40, "dirty": False},
                "secondary": {"sharpness/precond_lambda_max": {"value": sharp[v][i], "steps": [8, 9], "n": 2}}}))
    text = st_report.write_report(out).read_text()
    assert "## Secondary endpoints (pre-registered)" in text
    assert "### `preconditioned sharpness`: mean of the last 2 values of `sharpness/precond_lambda_max`" in text
    p = stats.paired({s: v for s, v in zip((1, 2, 3, 4), sharp["decay_none"])},
                     {s: v for s, v in zip((1, 2, 3, 4), sharp["iwd"])})
    assert p["mean"] == pytest.approx(2.25) and p["p_t"] < 0.05
    section = text.split("## Secondary endpoints")[1]
    row = next(line for line in section.splitlines() if line.startswith("| decay_none |"))
    assert f"{p['mean']:+.4g}" in row and "**holds** (expected higher)" in row
    assert "| iwd (reference) | 4 | 11.5 ±" in section


@pytest.mark.parametrize("name,seeds", [("claim1_power_cpu", 12), ("claim1_power_0.12b", 4)])
def test_shipped_power_studies_have_the_seeds_they_preregister(name, seeds):
    root = Path(__file__).resolve().parents[1]
    study = load_study(root / "recipes" / "ablation" / f"{name}.yaml")
    assert len(study.seeds) == seeds and len(study.lrs) == 1 and study.primary == "best_lr"
    assert {v.name for v in study.variants} == {"baseline", "no_scale"} and study.preregistration
    need = seeds_needed(study.power["pilot_sd"], study.power["mde"], study.alpha, study.power["level"])
    assert need <= len(study.seeds) and power_line(study).endswith(": enough.")
    for v in study.variants:
        for c in [*study.base, *v.configs]:
            assert (root / c).is_file(), c


@pytest.mark.parametrize("name", ["iwd_sharpness_cpu", "iwd_sharpness_0.12b"])
def test_shipped_sharpness_studies_measure_what_they_preregister(name):
    """Study D: the three decay presets on the QK-norm model, SharpnessMonitor on the subsets whose tags the
    secondary endpoints read, enough seeds for the pre-registered MDE at the stated pilot std."""
    from callbacks.sharpness import SUBSETS, SharpnessMonitor, subset_prefix  # noqa: F401 (the real class)

    root = Path(__file__).resolve().parents[1]
    study = load_study(root / "recipes" / "ablation" / f"{name}.yaml")
    assert {v.decay for v in study.variants} == {"iwd", "decay_all", "decay_none"}
    assert all(any("qk_norm" in c for c in v.configs) for v in study.variants)
    args = study.callbacks["scalevec_lit.callbacks.SharpnessMonitor"]
    SharpnessMonitor(**args)  # the arguments are the callback's own
    tags = {f"{subset_prefix(s)}/{k}" for s in args["params"] for k in ("lambda_max", "precond_lambda_max")}
    assert {s["tag"] for s in study.secondary} <= tags and study.power["endpoint"] in tags
    assert all(s["log"] and s["expect"] == {"qk_decay_none": "higher"} for s in study.secondary)
    assert power_line(study).endswith(": enough.") and study.preregistration
