"""The MoE model around its layer (``tests/test_moe.py``): its scale sites and registry, folding exact for every
``scales`` option under every strategy preset, active-parameter counts, meta init, the recipes' parameter
counts on the meta device, every preset composed with the MoE recipes, the load monitor's figures, config
errors, and an end-to-end smoke run.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from helpers import ROOT, run_cli, tiny_config
from moe_models import PRESETS, moe_config, perturb_scales, preset_strategy
from scalevec_lit.model import MoEConfig, Transformer, count_parameters
from scalevec_lit.scale import INPUT, ScaleStrategy, ScaleVector, fold_scales, scale_parameters


# -- scale sites, folding, counting ------------------------------------------------------------------------
def _mlp_input_branches(model, layer):
    return {sp.info.branch for sp in scale_parameters(model) if sp.info.layer == layer and sp.info.site == "mlp_input"}


def test_scale_sites_per_option_and_every_scale_is_registered():
    expert_names = {f"expert{i}" for i in range(4)}
    cases = [  # the baseline MoE: one γ for router and experts (Mixtral, Qwen3-MoE); HG: one each
        ("shared", False, {"shared"}),
        ("shared", True, {"router", "gate", "up"}),
        ("expert", False, {"router", "shared_experts"} | expert_names),
    ]
    for scales, hg, branches in cases:
        model = Transformer(moe_config(scales=scales, num_shared_experts=1), ScaleStrategy(branch_specific=hg))
        assert _mlp_input_branches(model, 0) == branches, (scales, hg)
        registered = {id(sp.param) for sp in scale_parameters(model)}
        for module in model.modules():
            if isinstance(module, ScaleVector):
                assert all(id(p) in registered for p in module.parameters()), (scales, hg)
        assert all(sp.info.role == INPUT for sp in scale_parameters(model) if sp.info.site == "mlp_input")
    with pytest.raises(ValueError, match=r"model.config.moe.scales: 'expert' with model.strategy.branch_specific: "
                                         r"true: .* set moe.scales: shared"):
        Transformer(moe_config(scales="expert"), ScaleStrategy(branch_specific=True))
    dp = Transformer(moe_config(), preset_strategy(ROOT / "recipes/strategy/dp.yaml"))
    out = {(sp.info.branch, sp.info.role) for sp in scale_parameters(dp) if sp.info.site == "mlp_proj" and sp.info.layer == 0}
    assert out == {("gate", INPUT), ("up", INPUT)}  # one u per expert branch, shared by the experts


# per-expert scales with a branch-specific preset are refused (tested above), so they are not folded here
FOLD_CASES = [(p, s) for p in PRESETS for s in ("shared", "expert")
              if not (s == "expert" and "branch_specific: true" in p.read_text())]


@pytest.mark.parametrize("preset,scales", FOLD_CASES, ids=lambda v: getattr(v, "stem", v))
def test_fold_scales_is_exact_for_moe(preset, scales):
    strategy = preset_strategy(preset)
    cfg = moe_config(num_experts=4, top_k=2, scales=scales, num_shared_experts=1, first_dense_layers=1,
                     bias_balancing=True)
    model = Transformer(cfg, strategy).double().eval()
    perturb_scales(model)
    with torch.no_grad():
        for block in model.blocks[1:]:
            block.mlp.expert_bias.normal_(0, 0.02)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    model.train()(idx)  # a training forward first: its aux losses hold a graph, the copy must not care
    model.eval()
    folded = fold_scales(model)
    assert not [sp for sp in scale_parameters(folded) if sp.info.role == INPUT]
    before = {sp.name for sp in scale_parameters(model) if sp.info.role != INPUT}
    assert {sp.name for sp in scale_parameters(folded)} == before  # output-role scales stay
    want, got = model(idx), folded(idx)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-10  # float64: rounding only


def test_active_parameters_exclude_unselected_experts():
    d, f, E, k = 64, 64, 8, 2
    for scales, per_expert_scale in (("shared", 0), ("expert", d)):
        cfg = moe_config(num_experts=E, top_k=k, expert_intermediate_size=f, scales=scales, first_dense_layers=1)
        n = count_parameters(cfg)  # meta device
        assert n.total - n.active == (cfg.n_layer - 1) * (E - k) * (3 * d * f + per_expert_scale)
        assert n.total == sum(p.numel() for p in Transformer(cfg).parameters())


def test_meta_init_then_materialize():
    """The GPU recipes build on the meta device, shard, then materialize and initialize (meta_init)."""
    cfg = moe_config(num_experts=4, top_k=2, bias_balancing=True, num_shared_experts=1)
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device="cpu")
    model.reset_parameters()
    moe = model.blocks[0].mlp
    assert torch.equal(moe.expert_bias, torch.zeros(4))
    assert moe.input.weight("gate").std().item() == pytest.approx(cfg.init_std, rel=0.1)
    assert moe.expert_down.std().item() == pytest.approx(cfg.init_std / math.sqrt(2 * cfg.n_layer), rel=0.1)
    assert moe.shared_down.weight.std().item() == pytest.approx(cfg.init_std / math.sqrt(2 * cfg.n_layer), rel=0.1)
    assert torch.isfinite(model(torch.randint(0, cfg.vocab_size, (1, 8)))).all()


# -- recipes -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recipe_parser():
    """Parse recipes exactly as the CLI does, without instantiating trainer or data; build the model."""
    from jsonargparse import ArgumentParser

    from scalevec_lit.cli import ScaleVecCLI
    from scalevec_lit.data.datamodule import TokenDataModule
    from scalevec_lit.lit.module import CausalLM

    class ParseOnly(ScaleVecCLI):
        def instantiate_classes(self) -> None:
            pass

    cli = ParseOnly(CausalLM, TokenDataModule, run=False, auto_configure_optimizers=False,
                    args=["--config", str(ROOT / "recipes" / "moe_smoke.yaml")])
    model_parser = ArgumentParser(exit_on_error=False)
    model_parser.add_class_arguments(CausalLM, "model", fail_untyped=False)
    instantiate = getattr(model_parser, "instantiate", None) or model_parser.instantiate_classes

    def parse(*configs: str):
        cfg = cli.parser.parse_args([a for c in configs for a in ("--config", str(ROOT / "recipes" / c))])
        return cfg, instantiate(model_parser.parse_object({"model": cfg.model.as_dict()})).model

    return parse


@pytest.mark.parametrize(
    "recipe, total_range, active_range",
    [("moe_0.5b.yaml", (0.45e9, 0.55e9), (0.10e9, 0.15e9)), ("moe_2b.yaml", (1.6e9, 2.0e9), (0.3e9, 0.45e9))],
)
def test_gpu_recipes_counts_on_meta(recipe_parser, recipe, total_range, active_range, capsys):
    cfg, lm = recipe_parser(recipe, "strategy/unified.yaml")
    assert "ModelParallelStrategy" in cfg.trainer.strategy.class_path and lm.parallel.mixed_precision == "bf16"
    mesh = cfg.trainer.strategy.init_args  # pure FSDP2 over every device: the data-parallel size follows them
    assert (cfg.trainer.devices, mesh.data_parallel_size, mesh.tensor_parallel_size) == ("auto", "auto", 1)
    assert cfg.global_batch_tokens == 256 * 2048 and "accumulate_grad_batches" not in open(ROOT / "recipes" / recipe).read()
    # the vocabulary follows the data's tokenizer; the named sizes count a 32k (Llama-style) one
    n = count_parameters(dataclasses.replace(lm.config, vocab_size=32000), lm.strategy, lm.block)
    with capsys.disabled():
        print(f"\n{recipe}: {n.total / 1e9:.3f}B total, {n.active / 1e9:.3f}B active ({n.summary()})")
    assert 0.12e9 <= n.total <= 2.0e9  # the paper's range
    assert total_range[0] <= n.total <= total_range[1]
    assert active_range[0] <= n.active <= active_range[1]
    assert f"{n.active:,} active per token" in n.summary()
    comments = (ROOT / "recipes" / recipe).read_text()  # the numbers the recipe states are the counted ones
    assert f"{n.total / 1e9:.3f}B total, {n.active / 1e9:.3f}B active" in comments


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_composes_with_the_moe_recipes(recipe_parser, preset):
    _, lm = recipe_parser("moe_smoke.yaml", f"strategy/{preset.name}")
    expected = preset_strategy(preset)
    assert lm.config.moe is not None and lm.strategy.placement == expected.placement
    assert lm.strategy.branch_specific == expected.branch_specific
    lm.configure_model()
    logits = lm(torch.randint(0, lm.config.vocab_size, (2, 16)))
    assert logits.shape == (2, 16, lm.config.vocab_size) and torch.isfinite(logits).all()
    assert set(lm.model.aux_losses()) == {"moe_aux_loss", "moe_z_loss"}
    _, big = recipe_parser("moe_2b.yaml", f"strategy/{preset.name}")
    assert count_parameters(big.config, big.strategy, big.block).total > 1e9  # builds on meta


# -- monitor and end to end --------------------------------------------------------------------------------
def test_monitor_metrics_follow_the_layers():
    from scalevec_lit.callbacks import MoELoadMonitor

    model = Transformer(moe_config(num_experts=4, top_k=2, bias_balancing=True, first_dense_layers=1))
    model(torch.randint(0, 4096, (2, 32)))
    mon = MoELoadMonitor(every_n_steps=1)
    layers = mon.layer_stats(model)
    assert [layer for layer, _ in layers] == [1]
    metrics, fractions = mon.compute_metrics(layers)
    stats = layers[0][1]
    assert metrics["moe/layer01/load_max_over_mean"] == pytest.approx(stats["load_max_over_mean"].item())
    assert metrics["moe/layer01/router_entropy"] == pytest.approx(stats["router_entropy"].item())
    assert 1.0 <= metrics["moe/all/load_max_over_mean"] <= 4 / 2
    assert sum(metrics[f"moe_fraction/layer01/expert{i:02d}"] for i in range(4)) == pytest.approx(1.0)
    assert fractions[1].sum().item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="every_n_steps"):
        MoELoadMonitor(every_n_steps=0)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"model\.config\.moe\.router: 'softmaxx'"):
        MoEConfig(router="softmaxx")
    with pytest.raises(ValueError, match=r"model\.config\.moe\.top_k"):
        tiny_config(moe=MoEConfig(num_experts=2, top_k=3))


@pytest.mark.slow
def test_moe_smoke_trains_end_to_end_with_unified(prepared_data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = 30
    args = [
        "fit", "--config", str(ROOT / "recipes" / "moe_smoke.yaml"),
        "--config", str(ROOT / "recipes" / "strategy" / "unified.yaml"),
        f"--data.data_dir={prepared_data}", f"--trainer.max_steps={steps}",
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.val_check_interval=30", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
        "--trainer.log_every_n_steps=1", "--model.schedule.init_args.warmup_steps=2",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--data.batch_size=8", "--model.config.seq_len=64",
    ]
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "active per token" in proc.stdout + proc.stderr
    (events,) = tmp_path.rglob("events.out.tfevents*")
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    losses = [e.value for e in acc.Scalars("train/loss")]
    assert len(losses) >= steps - 1
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    print(f"\nmoe_smoke + unified: loss {first:.3f} -> {last:.3f} over {steps} steps")
    assert last < first - 0.5
    tags = set(acc.Tags()["scalars"])
    for tag in ("moe/layer00/load_max_over_mean", "moe/layer03/router_entropy", "moe/layer00/aux_loss",
                "moe/layer00/z_loss", "moe/layer00/bias_spread", "moe_fraction/layer02/expert07",
                "train/moe_aux_loss", "train/moe_z_loss"):
        assert tag in tags, tag
    loads = [e.value for e in acc.Scalars("moe/all/load_max_over_mean")]
    assert all(1.0 <= v <= 8 / 2 for v in loads)  # between balanced and fully collapsed (E/k)
    assert [e.step for e in acc.Scalars("moe/layer00/router_entropy")][:2] == [1, 10]
    assert acc.Scalars("moe/layer00/bias_spread")[-1].value > 0  # the bias moved
