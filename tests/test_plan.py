"""``fit --print_plan``: the plan before a launch (``scalevec_lit/lit/plan.py``, ``lit/plan_count.py``).

- parameter counts: exact against a model built from the recipe (tiny) and against ``count_parameters`` of
  the recipe's shape (the GPU recipes, on the meta device);
- the memory counts (activations, weights, gradients, optimizer state) against a real step:
  ``tests/test_plan_memory.py``;
- every GPU recipe: exit 0 and the table on this CPU machine, nothing materialized; a plan that does not fit
  warns; a global batch the devices cannot make, and a bad device memory, are refused (exit 2).
"""
from __future__ import annotations

import pytest
import torch

from helpers import ROOT, SMOKE, main_in_process, recipe, strategy_preset

import scalevec_lit.cli  # noqa: F401  (Lightning's log handlers bind to the session's stderr, not to one test's capture)

GPU_RECIPES = ["dense_0.12b", "dense_0.5b", "dense_1b", "dense_2b", "moe_0.5b", "moe_2b"]


@pytest.fixture
def plans(monkeypatch):
    """Runs ``fit ... --print_plan`` in-process; returns ``run(args) -> (exit code, output, the Plan)``."""
    import scalevec_lit.lit.plan as plan_module
    from scalevec_lit.model.transformer import Transformer

    made = []
    original = plan_module.print_plan

    def recording(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    def refuse(self):  # materializing a model calls it: the plan never does
        raise AssertionError("the plan initialized a model")

    monkeypatch.setattr(plan_module, "print_plan", recording)
    monkeypatch.setattr(Transformer, "reset_parameters", refuse)

    def run(capfd, args):
        made.clear()
        code, text = main_in_process(capfd, ["fit", *args, "--print_plan"])
        return code, text, (made[0] if made else None)

    return run


# -- parameters ------------------------------------------------------------------------------------------------
def test_parameter_counts_exact_against_a_built_model(capfd, plans):
    code, text, plan = plans(capfd, ["--config", SMOKE, "--config", recipe("strategy", "unified.yaml"),
                                     "--model.config.vocab_size=8192"])
    assert code == 0, text
    from scalevec_lit.model.transformer import Transformer
    from scalevec_lit.scale.registry import scale_parameters

    torch.manual_seed(0)
    with torch.device("meta"):  # the same shape, every parameter counted one by one
        model = Transformer(plan.config, strategy_preset("unified"))
    total = sum(p.numel() for p in dict.fromkeys(model.parameters()))
    scale = sum(sp.param.numel() for sp in scale_parameters(model))
    assert (plan.count.total, plan.count.active, plan.count.scale) == (total, total, scale)
    assert f"{total:,} total, {total:,} active per token, {scale:,} in scale vectors" in text


@pytest.mark.parametrize("name", ["dense_2b", "moe_2b"])
def test_parameter_counts_exact_for_the_gpu_recipes(capfd, plans, name):
    import yaml

    from scalevec_lit.model.config import TransformerConfig
    from scalevec_lit.model.transformer import count_parameters

    code, text, plan = plans(capfd, ["--config", recipe(f"{name}.yaml")])
    assert code == 0, text
    shape = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())["model"]["config"]
    count = count_parameters(TransformerConfig(vocab_size=32000, **shape))
    assert plan.count == count
    assert "vocab 32,000 (assumed: no prepared data" in text
    if name == "moe_2b":  # the recipe's own statement: 1.845B total / 0.370B active per token
        assert (round(count.total / 1e6), round(count.active / 1e6)) == (1845, 370)
        assert count.active < count.total
    else:
        assert count.active == count.total


# -- the command -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GPU_RECIPES)
def test_every_gpu_recipe_prints_its_plan_on_a_cpu_machine(capfd, plans, name):
    code, text, plan = plans(capfd, ["--config", recipe(f"{name}.yaml")])
    assert code == 0 and "Traceback" not in text, text
    for part in ("on 8 devices (assumed: trainer.devices is auto", "memory per device:", "weights (fp32, 1/8 each)",
                 "optimizer (AdamW: 2 moments", "activations (", "GFLOP per token", "tokens per step",
                 "steps = ", "H100, assumed"):
        assert part in text, (part, text)
    n = plan.count
    assert plan.flops_per_token == 6 * n.active_non_embedding + 12 * plan.config.n_layer * plan.config.n_head * \
        plan.config.head_dim * plan.config.seq_len
    assert plan.batch.tokens == 524288 and plan.memory.total <= plan.memory_budget
    assert "warning:" not in text


def test_plan_for_a_device_count_and_memory_with_muon_and_checkpointing(capfd, plans):
    code, text, plan = plans(capfd, ["--config", recipe("dense_2b.yaml"), "--config", recipe("optim", "muon_wsd.yaml"),
                                     "--model.parallel.activation_checkpointing=true", "--plan_devices=16",
                                     "--plan_device_memory=H200"])
    assert code == 0, text
    assert "on 16 devices (--plan_devices)" in text and "140.4 GiB (H200)" in text
    assert "Muon: 1 moment, AdamW: 2 moments" in text and "blocks checkpointed" in text
    assert plan.shards == 16 and plan.batch.accumulate == 4


def test_a_plan_that_does_not_fit_warns(capfd, plans):
    code, text, plan = plans(capfd, ["--config", recipe("dense_2b.yaml"), "--plan_devices=1",
                                     "--plan_device_memory=40"])
    assert code == 0, text
    assert plan.memory.total > 40 * 2 ** 30 and "DOES NOT FIT" in text
    warnings = [line for line in text.splitlines() if line.startswith("warning: plan:")]
    assert len(warnings) == 1 and "activation_checkpointing=true" in warnings[0]


@pytest.mark.parametrize("args, parts", [
    (["--plan_device_memory=lots"], ["error: plan_device_memory: lots: is neither", "H100, H200, A100"]),
    (["--plan_devices=3"], ["error: global_batch_tokens: 524,288: is not a multiple", "data-parallel size 3"]),
])
def test_a_plan_that_cannot_be_made_is_refused(capfd, plans, args, parts):
    code, text, _ = plans(capfd, ["--config", recipe("dense_2b.yaml"), *args])
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in text, text
    for part in parts:
        assert part in errors[0], (part, errors[0])


def test_the_plan_counts_a_user_model_class(capfd, plans):
    """``model.class_path`` (a CausalLM subclass from a user package): the plan counts the model it builds."""
    from scalevec_lit.model.transformer import count_parameters

    code, text, plan = plans(capfd, ["--config", SMOKE, "--config", str(ROOT / "tests" / "extensions" /
                                                                        "temperature.yaml")])
    assert code == 0, text
    stock = count_parameters(plan.config).total
    assert plan.count.total == stock + 1  # the subclass's learned temperature
    assert f"{plan.count.total:,} total" in text
