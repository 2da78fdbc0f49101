"""The regime line of a study report: ``Regime: N tokens per parameter, E epochs over the training text``,
computed from what the runs record (parameters printed by ``fit``, tokens trained, the data's meta.json)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from scalevec_lit import study as st
from scalevec_lit.study import regime
from scalevec_lit.study import report as st_report


def test_regime_line_numbers_and_format():
    # the smoke studies: 200 steps x 16 x 128 tokens, 1,838,208 parameters, 485,838 training tokens
    assert regime.regime_line(409_600, 1_838_208, 485_838) == (
        "Regime: 0.22 tokens per parameter, 0.84 epochs over the training text")
    assert regime.regime_line(6_180_000, 300_000, 13_200_000) == (
        "Regime: 20.6 tokens per parameter, 0.47 epochs over the training text")
    assert regime.regime_line(250_000_000, 1_000_000, 10_000_000) == (
        "Regime: 250 tokens per parameter, 25.0 epochs over the training text")
    assert regime.regime_line(409_600, None, None) == "Regime: n/a tokens per parameter, n/a epochs over the training text"


def test_params_and_tokens_read_from_a_run(tmp_path):
    (tmp_path / "log.txt").write_text("=== start\nTransformer: parameters: 1,000 total, 12 in scale vectors\n"
                                      "=== resume\nTransformer: parameters: 1,838,208 total, 4,224 in scale vectors "
                                      "(0.2298%)\n")
    assert regime.params_from_log(tmp_path) == 1_838_208
    assert regime.params_from_log(tmp_path / "none") is None
    # train/tokens logged every 10 steps: at 0-based step 189, 190 steps of 2,048 tokens; the run trained 200 steps
    assert regime.trained_tokens([(179, 368_640.0), (189, 389_120.0)], 199) == 409_600
    assert regime.trained_tokens([(199, 409_600.0)], 199) == 409_600 and regime.trained_tokens([], 5) is None


def test_report_states_the_regime_from_the_runs(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text(json.dumps({"tokens": {"train": 100_000, "val": 5_000}}))
    out = tmp_path / "s"
    runs = out / "runs"
    runs.mkdir(parents=True)
    (runs / "study.yaml").write_text(yaml.safe_dump({"name": "s", "args": [f"--data.data_dir={data}"],
                                                     "seeds": [1, 2], "variants": [{"name": "baseline"},
                                                                                   {"name": "no_scale"}]}))
    for variant, params in (("baseline", 10_000), ("no_scale", 9_000)):
        for seed in (1, 2):
            root = runs / variant / f"seed{seed}"
            root.mkdir(parents=True)
            (root / st.DONE).write_text(json.dumps({
                "variant": variant, "seed": seed, "lr": None, "endpoint": 5.0 + seed, "final_val_loss": 5.0,
                "final_step": 99, "last_train_step": 99, "endpoint_steps": [49, 99], "train_tokens": 250_000,
                "trained_tokens": 250_000, "params": params, "val": [[49, 6.0], [99, 5.0]]}))
    report = st_report.write_report(out).read_text()
    assert "\nRegime: 25.0 tokens per parameter, 2.5 epochs over the training text.\n" in report
    assert ("250,000 tokens trained per run (steps × global batch × sequence length); 10,000 parameters of "
            "`baseline` (variants: 9,000–10,000); 100,000 training tokens in" in report)


def test_every_committed_report_states_its_regime():
    import re

    reports = sorted((Path(__file__).resolve().parents[1] / "results").glob("*/report.md"))
    assert len(reports) >= 6
    for path in reports:
        found = [line for line in path.read_text().splitlines() if line.startswith("Regime: ")]
        assert len(found) == 1 and re.fullmatch(
            r"Regime: [\d.,]+ tokens per parameter, [\d.,]+ epochs over the training text\.", found[0]), path
