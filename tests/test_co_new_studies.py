"""The compute-optimal studies of issue 47 (claim 3 with Muon: I, J; for MoE: K, L): the MoE model of the 0.3M
class has the parameters its recipe states (total and active, with and without the embedding and head), every
run trains the dense studies' 6,144,000 tokens, and each study is pre-registered as studies E-H were (pilot on
seeds 1 (2), main study on seeds 3+, paired t-test at each variant's own LR)."""
from __future__ import annotations

import pytest
import yaml

from helpers import ROOT

from scalevec_lit import study as st
from scalevec_lit.model.config import TransformerConfig
from scalevec_lit.model.transformer import count_parameters

VOCAB = 2048          # results/corpus/tokenizer.json
TOKENS = 3000 * 16 * 128
DENSE = 298_416       # recipes/docs_0.3m.yaml
MOE_TOTAL, MOE_ACTIVE, EMBED_AND_HEAD = 521_136, 299_952, 2 * VOCAB * 48


def _config(*recipes: str) -> TransformerConfig:
    cfg: dict = {}
    for r in recipes:
        cfg.update(yaml.safe_load((ROOT / r).read_text())["model"]["config"])
    return TransformerConfig(vocab_size=VOCAB, **cfg)


def test_moe_recipe_has_the_stated_parameters_total_and_active():
    n = count_parameters(_config("recipes/docs_0.3m.yaml", "recipes/moe_0.3m.yaml"))
    assert (n.total, n.active, 2 * n.embedding) == (MOE_TOTAL, MOE_ACTIVE, EMBED_AND_HEAD)
    dense = count_parameters(_config("recipes/docs_0.3m.yaml"))
    assert dense.total == DENSE and dense.active == DENSE
    assert n.active - dense.total == 4 * 48 * 8  # equal active parameters but for the 4 routers
    text = (ROOT / "recipes/moe_0.3m.yaml").read_text()
    for number in (MOE_TOTAL, MOE_TOTAL - EMBED_AND_HEAD, MOE_ACTIVE, MOE_ACTIVE - EMBED_AND_HEAD):
        assert f"{number:,}" in text, number
    per = {k: round(TOKENS / v, 1) for k, v in {"total": MOE_TOTAL, "total_ne": MOE_TOTAL - EMBED_AND_HEAD,
                                                  "active": MOE_ACTIVE, "active_ne": MOE_ACTIVE - EMBED_AND_HEAD}.items()}
    assert per == {"total": 11.8, "total_ne": 18.9, "active": 20.5, "active_ne": 59.5}
    assert "11.8 tokens per total parameter (18.9 per" in text and "20.5 per active parameter (59.5 per" in text


def _arg(study, key):
    return next(a.split("=", 1)[1] for a in study.args if a.startswith(f"--{key}="))


@pytest.mark.parametrize("name,kind,pilot", [("co_muon_lr_cpu", "muon", True), ("co_muon_claim3_cpu", "muon", False),
                                             ("co_moe_lr_cpu", "moe", True), ("co_moe_claim3_cpu", "moe", False)])
def test_new_studies_are_preregistered_in_the_compute_optimal_regime(name, kind, pilot):
    study = st.load_study(ROOT / "recipes" / "ablation" / f"{name}.yaml")
    extra = "recipes/optim/muon_wsd.yaml" if kind == "muon" else "recipes/moe_0.3m.yaml"
    assert study.base == ["recipes/smoke.yaml", "recipes/docs_0.3m.yaml", extra]
    assert "before any run" in study.preregistration
    steps, every = int(_arg(study, "trainer.max_steps")), int(_arg(study, "trainer.val_check_interval"))
    assert steps * int(_arg(study, "data.batch_size")) * 128 == TOKENS and steps % every == 0
    assert study.endpoint_evals == 2 and _arg(study, "trainer.limit_val_batches") == "1.0"
    assert _arg(study, "data.data_dir") == "data/prepared/docs"
    assert [v.name for v in study.variants] == ["baseline", "unified"] and study.baseline == "baseline"
    assert all(c["expect"] == {"unified": "lower"} for c in study.claims)
    if kind == "muon":  # the LR swept is Muon's; AdamW's part (embedding, head, scales) is fixed at E's best
        assert study.lr_arg == "--model.optimizer.init_args.muon_lr"
        assert _arg(study, "model.optimizer.init_args.lr") == "0.003"
    if pilot:
        assert study.primary == "pooled" and max(study.seeds) <= 2 and len(study.lrs) == 3
    else:  # on seeds the pilot did not choose the LR on, each variant at its own LR, sized by the F-H rule
        assert study.primary == "best_lr" and min(study.seeds) == 3 and len(study.seeds) >= 6
        assert all(v.lrs and len(v.lrs) == 1 for v in study.variants)
        assert study.power["mde"] == 0.02 and "n = the fewest seeds" in study.preregistration


def test_j_is_sized_by_its_amended_rule_and_runs_at_study_is_best_lr():
    """J's seeds follow from study H's observed paired std (0.0192) by the F-H rule (n = 19, committed before
    any run of J), and both variants run at study I's best Muon LR, read from I's committed endpoints."""
    import json

    from scipy import stats

    study = st.load_study(ROOT / "recipes" / "ablation" / "co_muon_claim3_cpu.yaml")
    text = (ROOT / "recipes" / "ablation" / "co_muon_claim3_cpu.yaml").read_text()
    assert "placeholder" not in text.split("preregistration:")[0].lower()
    assert study.power["pilot_sd"] == round(1.5 * 0.0192, 4)
    n = next(n for n in range(2, 1000) if (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1))
             * study.power["pilot_sd"] / n ** 0.5 <= study.power["mde"])
    assert min(max(n, 6), 24) == 19 and study.seeds == list(range(3, 22))
    runs = json.loads((ROOT / "results" / "co_muon_lr_cpu" / "endpoints.json").read_text())["runs"]
    for v in study.variants:
        mine = [r for r in runs if r["variant"] == v.name]
        assert len(mine) == 3 and v.lrs == [min(mine, key=lambda r: r["endpoint"])["lr"]]


def test_a_study_stopped_by_its_clock_cap_reports_the_seeds_that_ran(tmp_path):
    """Study J's records (10 of its 19 seeds complete when its clock cap stopped it): its report's power line
    counts the complete seeds and so says the study is underpowered, where it used to print the design's 19
    as 'enough'."""
    import shutil

    from scalevec_lit.study.report import write_report
    from scalevec_lit.study.secondary import power_line

    shutil.copytree(ROOT / "results" / "co_muon_claim3_cpu" / "runs", tmp_path / "runs")
    text = write_report(tmp_path).read_text()
    assert "needs 19 seeds; the study has 19, 10 of them complete: NOT enough" in text
    study = st.load_study(ROOT / "recipes" / "ablation" / "co_muon_claim3_cpu.yaml")
    assert power_line(study).endswith("needs 19 seeds; the study has 19: enough.")  # the design, before any run
    assert power_line(study, complete=19).endswith("the study has 19: enough.")


def test_l_is_sized_from_k_and_runs_at_k_s_best_lrs():
    """L's pilot std is 1.5 x study K's observed paired std (both variants at their best LR in K's committed
    endpoints), its seeds follow from it by the F-H rule (39, capped at 24), and each variant runs at its K best."""
    import json
    import statistics

    from scalevec_lit.study.secondary import seeds_needed

    study = st.load_study(ROOT / "recipes" / "ablation" / "co_moe_claim3_cpu.yaml")
    runs = json.loads((ROOT / "results" / "co_moe_lr_cpu" / "endpoints.json").read_text())["runs"]
    mean = {}
    for r in runs:
        mean.setdefault((r["variant"], r["lr"]), []).append(r["endpoint"])
    best = {v: min((lr for (name, lr) in mean if name == v), key=lambda lr: statistics.mean(mean[(v, lr)]))
            for v in ("baseline", "unified")}
    assert {v.name: v.lrs for v in study.variants} == {v: [lr] for v, lr in best.items()}
    at = {(r["variant"], r["seed"]): r["endpoint"] for r in runs if r["lr"] == best[r["variant"]]}
    diffs = [at[("unified", s)] - at[("baseline", s)] for s in (1, 2)]
    assert study.power["pilot_sd"] == round(1.5 * statistics.stdev(diffs), 4)
    assert seeds_needed(study.power["pilot_sd"], study.power["mde"]) == 39
    assert study.seeds == list(range(3, 3 + 24))  # the rule's 39, capped at 24
