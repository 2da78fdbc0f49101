"""The compute-optimal CPU studies of issue 36 (recipes/ablation/co_*.yaml on recipes/docs_0.3m.yaml): the
model has the parameters its recipe states, each run trains ~20 tokens per parameter, and the studies are
well formed (pre-registered, last evaluation at the final step, full validation split, LR from study E)."""
from __future__ import annotations

import pytest
import yaml

from helpers import ROOT

from scalevec_lit import study as st
from scalevec_lit.model.config import TransformerConfig
from scalevec_lit.model.transformer import Transformer

PARAMS = 298_416  # recipes/docs_0.3m.yaml's stated count (embedding + untied head + blocks, baseline scales)
VOCAB = 2048      # results/corpus/tokenizer.json


def test_recipe_model_has_the_stated_parameters():
    cfg = yaml.safe_load((ROOT / "recipes/docs_0.3m.yaml").read_text())["model"]["config"]
    model = Transformer(TransformerConfig(vocab_size=VOCAB, **cfg))
    assert sum(p.numel() for p in model.parameters()) == PARAMS
    assert f"{PARAMS:,} = 2 x {VOCAB} x {cfg['n_embd']}" in (ROOT / "recipes/docs_0.3m.yaml").read_text()


def _arg(study, key):
    return next(a.split("=", 1)[1] for a in study.args if a.startswith(f"--{key}="))


@pytest.mark.parametrize("name", ["co_lr_cpu", "co_claim1_cpu", "co_claim2_cpu", "co_claim3_cpu"])
def test_co_studies_run_twenty_tokens_per_parameter_and_are_preregistered(name):
    study = st.load_study(ROOT / "recipes" / "ablation" / f"{name}.yaml")
    assert study.base == ["recipes/smoke.yaml", "recipes/docs_0.3m.yaml"] and study.preregistration
    steps, every = int(_arg(study, "trainer.max_steps")), int(_arg(study, "trainer.val_check_interval"))
    tokens = steps * int(_arg(study, "data.batch_size")) * 128
    assert steps % every == 0 and study.endpoint_evals == 2 and _arg(study, "trainer.limit_val_batches") == "1.0"
    assert 19 <= tokens / PARAMS <= 22 and _arg(study, "data.data_dir") == "data/prepared/docs"
    for v in study.variants:
        for c in [*study.base, *v.configs]:
            assert (ROOT / c).is_file(), c
    if name == "co_lr_cpu":
        # the pre-registered grid, plus what its edge rule adds: one LR at a time beyond the edge that won
        grid = [0.003, 0.01, 0.03]
        extra = sorted(set(study.lrs) - set(grid))
        assert set(grid) <= set(study.lrs) and len(study.seeds) == 2 and study.primary == "pooled"
        assert all(lr < grid[0] or lr > grid[-1] for lr in extra), extra
    else:  # sized from study E, on seeds E did not choose the LR on
        assert study.primary == "best_lr" and min(study.seeds) == 3 and len(study.seeds) >= 6
        assert study.lr_from in (None, {"study": "co_lr_cpu", "variant": study.baseline})
        assert study.power["mde"] > 0 and "co_lr_cpu" in study.power["source"]


def _rule(pilot_sd: float, mde: float) -> int:
    """The pre-registered size: the fewest seeds n with (t_.975,n-1 + t_.8,n-1) * pilot_sd / sqrt(n) <= MDE
    (``pilot_sd`` is already 1.5 x E's paired std), between 6 and 24."""
    from scipy import stats

    n = next(n for n in range(2, 1000)
             if (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * pilot_sd / n ** 0.5 <= mde)
    return min(max(n, 6), 24)


@pytest.mark.parametrize("name,n", [("co_claim1_cpu", 7), ("co_claim2_cpu", 24), ("co_claim3_cpu", 24)])
def test_f_to_h_are_sized_by_their_rule_from_study_e(name, n):
    """F-H's seeds follow from their committed pilot std by the pre-registered rule (no placeholder left),
    and every variant runs at E's best LR (3e-3 for all, inside E's extended grid)."""
    text = (ROOT / "recipes" / "ablation" / f"{name}.yaml").read_text()
    assert "placeholder" not in text.split("preregistration:")[0].lower()
    study = st.load_study(ROOT / "recipes" / "ablation" / f"{name}.yaml")
    assert _rule(study.power["pilot_sd"], study.power["mde"]) == n
    assert study.seeds == list(range(3, 3 + n))
    if name == "co_claim3_cpu":
        assert [v.lrs for v in study.variants] == [[0.003], [0.003]]
