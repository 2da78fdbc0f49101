"""The regime line of a study report: ``Regime: N tokens per parameter (M per non-embedding parameter), E epochs
over the training text``, computed from what the runs record (parameters and the optimizer's parameter groups
printed by ``fit``, tokens trained, the data's meta.json)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from scalevec_lit import study as st
from scalevec_lit.study import regime
from scalevec_lit.study import report as st_report


def test_regime_line_numbers_and_format():
    # the smoke studies: 200 steps x 16 x 128 tokens, 1,836,160 parameters (787,584 outside the embedding and the
    # untied head: 2 x 4096 x 128), 485,838 training tokens
    assert regime.regime_line(409_600, 1_836_160, 485_838, 787_584) == (
        "Regime: 0.22 tokens per parameter (0.52 per non-embedding parameter), 0.84 epochs over the training text")
    # the 0.3M documentation model: 298,416 parameters, 101,808 outside the embedding and head (2 x 2048 x 48)
    assert regime.regime_line(6_144_000, 298_416, 13_185_353, 101_808) == (
        "Regime: 20.6 tokens per parameter (60.3 per non-embedding parameter), 0.47 epochs over the training text")
    assert regime.regime_line(250_000_000, 1_000_000, 10_000_000, 500_000) == (
        "Regime: 250 tokens per parameter (500 per non-embedding parameter), 25.0 epochs over the training text")
    # the MoE model of the 0.3M class (studies K, L): 521,136 parameters, 299,952 active per token, 196,608 in
    # the embedding and head (active for every token): 11.8 and 18.9 per total, 20.5 and 59.5 per active parameter
    assert regime.regime_line(6_144_000, 521_136, 13_185_353, 521_136 - 196_608, 299_952) == (
        "Regime: 11.8 tokens per parameter (18.9 per non-embedding parameter); 20.5 per active parameter (59.5 per "
        "active non-embedding parameter), 0.47 epochs over the training text")
    # a dense model's active count is its total: the line is the dense one
    assert regime.regime_line(6_144_000, 298_416, 13_185_353, 101_808, 298_416) == \
        regime.regime_line(6_144_000, 298_416, 13_185_353, 101_808)
    assert regime.regime_line(409_600, None, None) == (
        "Regime: n/a tokens per parameter (n/a per non-embedding parameter), n/a epochs over the training text")


GROUPS = """optimizer parameter groups:
group      optimizer  tensors  params   lr     weight_decay
matrix     AdamW      28       {matrix}  0.003  0.1
embedding  AdamW      1        {embedding}   0.003  0
{head}scale      AdamW      17       528      0.003  0

RoleWeightDecay (preset decay_none): weight decay per parameter group
group                         tensors  params   weight_decay  applied by
embedding                     1        1   0             optimizer
"""


def _log(total: int, embedding: int, head: int = 0) -> str:
    head_row = f"head       AdamW      1        {head:,}   0.003  0.1\n" if head else ""
    return ("=== start\n" + GROUPS.format(matrix=f"{total - embedding - head - 528:,}", embedding=f"{embedding:,}",
                                        head=head_row) + f"Transformer: parameters: {total:,} total, 528 in scale vectors\n")


def test_active_parameters_read_from_an_moe_run(tmp_path):
    (tmp_path / "log.txt").write_text("=== start\nTransformer: parameters: 1,000 total, 600 active per token, 12 in "
                                      "scale vectors\n=== resume\nTransformer: parameters: 521,136 total, 299,952 "
                                      "active per token, 432 in scale vectors (0.0829%)\n")
    assert regime.active_params_from_log(tmp_path) == 299_952  # the last attempt's
    (tmp_path / "log.txt").write_text(_log(298_416, 98_304, 98_304))  # a dense run prints no active count
    assert regime.active_params_from_log(tmp_path) is None and regime.active_params_from_log(tmp_path / "x") is None


def test_embedding_and_head_read_from_the_optimizer_groups(tmp_path):
    (tmp_path / "log.txt").write_text(_log(1_000, 100, 100) + _log(298_416, 98_304, 98_304))  # the last attempt's
    assert regime.embedding_params_from_log(tmp_path) == 196_608
    (tmp_path / "log.txt").write_text(_log(200_112, 98_304))  # a tied head: one tensor, no head row
    assert regime.embedding_params_from_log(tmp_path) == 98_304
    (tmp_path / "log.txt").write_text("Transformer: parameters: 1,000 total, 12 in scale vectors\n")
    assert regime.embedding_params_from_log(tmp_path) is None
    assert regime.embedding_params_from_log(tmp_path / "none") is None


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
    # the reference (baseline) is the smaller model: the line is the reference's, not the largest variant's
    for variant, params in (("baseline", 9_000), ("no_scale", 10_000)):
        for seed in (1, 2):
            root = runs / variant / f"seed{seed}"
            root.mkdir(parents=True)
            (root / "log.txt").write_text(_log(params, 2_000, 2_000 if variant == "baseline" else 3_000))
            (root / st.DONE).write_text(json.dumps({
                "variant": variant, "seed": seed, "lr": None, "endpoint": 5.0 + seed, "final_val_loss": 5.0,
                "final_step": 99, "last_train_step": 99, "endpoint_steps": [49, 99], "train_tokens": 250_000,
                "trained_tokens": 250_000, "params": params, "val": [[49, 6.0], [99, 5.0]]}))
    report = st_report.write_report(out).read_text()
    # 250,000 / 9,000 = 27.8; 250,000 / (9,000 - 4,000) = 50.0
    assert ("\nRegime: 27.8 tokens per parameter (50.0 per non-embedding parameter), 2.5 epochs over the training "
            "text.\n") in report
    assert ("250,000 tokens trained per run (steps × global batch × sequence length); 9,000 parameters of "
            "`baseline`, 5,000 of them outside the embedding and head (4,000 in the embedding and untied head, from "
            "fit's table of optimizer parameter groups) (variants: 9,000–10,000); 100,000 training tokens in"
            in report)


def test_every_committed_report_states_its_regime():
    import re

    reports = sorted((Path(__file__).resolve().parents[1] / "results").glob("*/report.md"))
    assert len(reports) >= 6
    for path in reports:
        found = [line for line in path.read_text().splitlines() if line.startswith("Regime: ")]
        moe = "co_moe" in path.parent.name  # a mixture of experts: per active parameter too
        assert len(found) == 1 and re.fullmatch(
            r"Regime: [\d.,]+ tokens per parameter \([\d.,]+ per non-embedding parameter\)"
            + (r"; [\d.,]+ per active parameter \([\d.,]+ per active non-embedding parameter\)" if moe else "")
            + r", [\d.,]+ epochs over the training text\.", found[0]), path


def test_the_papers_regime_is_stated_both_ways():
    """The paper's 0.12B at 20 tokens per parameter, counted without the embedding and head: from the sizes of
    recipes/dense_0.12b.yaml (with Llama's 32,000-token vocabulary, untied head), as docs/PAPER.md states it."""
    from scalevec_lit.model.config import SIZES, TransformerConfig
    from scalevec_lit.model.transformer import count_parameters
    from scalevec_lit.scale import ScaleStrategy

    root = Path(__file__).resolve().parents[1]
    recipe = yaml.safe_load((root / "recipes" / "dense_0.12b.yaml").read_text())["model"]["config"]
    size = SIZES["dense_0.12b"]
    config = TransformerConfig(**{**recipe, "vocab_size": size.vocab_size})
    assert config == size and not config.tie_embeddings
    n = count_parameters(config, ScaleStrategy())
    outside = n.total - 2 * n.embedding  # the embedding and the untied head: 2 x 32,000 x 768
    assert (n.total, outside) == (121_129_728, 71_977_728)
    paper = (root / "docs" / "PAPER.md").read_text()
    per = regime.regime_line(20 * n.total, n.total, None, outside)
    assert per.startswith("Regime: 20.0 tokens per parameter (33.7 per non-embedding parameter)")
    assert "0.12B at about 20 tokens per parameter, 33.7 per non-embedding parameter" in paper
    assert "20 × 121,129,728 / 71,977,728 = 33.7 per non-embedding" in paper


def test_every_committed_study_has_its_endpoints_or_says_why():
    """``endpoints.json`` beside every committed report; where the runs did not survive, the notes say so."""
    studies = sorted(p.parent for p in (Path(__file__).resolve().parents[1] / "results").glob("*/report.md"))
    assert len(studies) >= 10
    for study in studies:
        if (study / "endpoints.json").exists():
            record = json.loads((study / "endpoints.json").read_text())
            assert record["study"] == study.name and record["runs"], study
        else:
            notes = (study / "notes.md").read_text()
            assert "**No `endpoints.json`" in notes and "did not survive" in notes, study
