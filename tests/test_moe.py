"""Tests of the mixture-of-experts MLP (``scalevec_lit/model/moe.py``), its recipes and its load monitor.

Checks: equal experts reproduce the dense SwiGLU; outputs and gradients match a per-token reference;
gradients reach exactly the selected experts and the router; bias balancing evens a skewed router and
never touches the combine weights; the balance loss matches hand-computed values; folding is exact for
every ``scales`` option under every strategy preset; the registry sees every scale; active-parameter
counts; the recipes' parameter counts on the meta device; every preset composes with the MoE recipe;
activation checkpointing with bias balancing; the monitor's figures; an end-to-end smoke run.
"""
from __future__ import annotations

import dataclasses

import functools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers import ROOT, run_cli, tiny_config
from scalevec_lit.model import MoEConfig, SwiGLU, Transformer, count_parameters
from scalevec_lit.model.moe import MoE, load_balancing_loss, route, router_z_loss
from scalevec_lit.model.spec import import_object
from scalevec_lit.scale import INPUT, ScaleStrategy, ScaleVector, fold_scales, scale_parameters

PRESETS = sorted((ROOT / "recipes" / "strategy").glob("*.yaml"))


def preset_strategy(path: Path) -> ScaleStrategy:
    """A ScaleStrategy from a preset file, without the CLI."""
    strat = dict(yaml.safe_load(path.read_text())["model"]["strategy"])
    vec = strat.pop("vector")
    cls = import_object(vec["class_path"])
    strat["vector"] = functools.partial(cls, **vec["init_args"]) if vec.get("init_args") else cls
    return ScaleStrategy(**strat)


def moe_config(**moe):
    base = dict(num_experts=4, top_k=2, expert_intermediate_size=64)
    base.update(moe)
    return tiny_config(moe=MoEConfig(**base))


@torch.no_grad()
def perturb_scales(model: torch.nn.Module, amount: float = 0.3) -> None:
    for sp in scale_parameters(model):
        sp.param.add_(amount * torch.randn_like(sp.param))


def reference_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The same MoE, one (token, slot) at a time: slow and obvious (only for plain input scales)."""
    site = moe.input
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + site.eps)
    xs = {b: xhat if site.gamma(b) is None else xhat * site.gamma(b) for b in ("router", "gate", "up")}
    r = route(xs["router"] @ site.weight("router").T, moe.top_k, moe.score, getattr(moe, "expert_bias", None),
              moe.route_norm)
    wg, wu = site.weight("gate"), site.weight("up")
    rows = []
    for t in range(x.shape[0]):
        y = 0
        for slot in range(moe.top_k):
            e = int(r.experts[t, slot])
            h = F.silu(xs["gate"][t] @ wg[e].T) * (xs["up"][t] @ wu[e].T)
            y = y + r.weights[t, slot] * (h @ moe.expert_down[e].T)
        rows.append(y)
    return torch.stack(rows)


# -- the layer ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("matmul", ["grouped_mm", "loop"])
@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_equal_experts_reproduce_the_dense_mlp(matmul, router):
    cfg = moe_config(num_experts=4, top_k=2, scales="shared", router=router, expert_matmul=matmul)
    dense_cfg = tiny_config(intermediate_size=64)
    strategy = ScaleStrategy()
    dense, moe = SwiGLU(dense_cfg, 0, strategy), MoE(cfg, 0, strategy)
    perturb_scales(dense)
    with torch.no_grad():
        moe.input.scales["shared"].scale.copy_(dense.input.scales["shared"].scale)
        moe.input.weight("router").normal_()  # a real routing decision, which must not matter
        for e in range(4):
            moe.input.weight("gate")[e].copy_(dense.input.weight("gate"))
            moe.input.weight("up")[e].copy_(dense.input.weight("up"))
            moe.expert_down[e].copy_(dense.down.weight)
    x = torch.randn(3, 10, 64)
    y_moe = moe(x)
    assert moe.last_load_stats["unused_experts"] == 0  # several experts really were used
    torch.testing.assert_close(y_moe, dense(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("matmul", ["grouped_mm", "loop"])
def test_output_and_gradients_match_per_token_reference(matmul):
    cfg = moe_config(num_experts=8, top_k=2, scales="shared", expert_matmul=matmul, bias_balancing=True)
    moe = MoE(cfg, 0, ScaleStrategy(branch_specific=True))
    perturb_scales(moe)
    with torch.no_grad():
        moe.expert_bias.normal_(0, 0.05)
    x = torch.randn(3, 64)  # 3 tokens x top-2: at most 6 of the 8 experts are selected
    moe.eval()
    y = moe(x)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, list(moe.parameters()), g)
    y_ref = reference_moe(moe, x)
    ref_grads = torch.autograd.grad(y_ref, list(moe.parameters()), g)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    for (name, _), a, b in zip(moe.named_parameters(), grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)

    counts = moe.last_load_stats["tokens_per_expert"]
    assert 0 < int((counts > 0).sum()) < 8
    named = dict(zip([n for n, _ in moe.named_parameters()], grads))
    for e in range(8):
        for w in ("input.proj.gate.weight", "input.proj.up.weight", "expert_down"):
            reached = named[w][e].abs().sum() > 0
            assert bool(reached) == bool(counts[e] > 0), (w, e, counts.tolist())
    assert named["input.proj.router.weight"].abs().sum() > 0
    assert named["input.scales.router.scale"].abs().sum() > 0  # the router's own γ learns too


def test_bf16_dtypes_on_tiny_tensors():
    moe = MoE(moe_config(num_experts=4, top_k=2), 0, ScaleStrategy())
    x = torch.randn(8, 64)
    want = moe(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 weights: the expert matmuls run in bf16
        got = moe(x)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, rtol=0.1, atol=0.02)
    moe_bf16 = moe.to(torch.bfloat16)  # bf16 weights (FSDP2 mixed precision)
    assert moe_bf16(x.bfloat16()).dtype == torch.bfloat16
    assert moe_bf16.last_aux_losses["moe_aux_loss"].dtype == torch.float32  # router math stays fp32


def test_route_weights_ignore_the_bias_and_sum_to_one():
    logits = torch.randn(16, 6)
    bias = torch.tensor([5.0, 0, 0, 0, 0, -5.0])
    for score in ("softmax", "sigmoid"):
        r = route(logits, 2, score, bias)
        scores = logits.softmax(-1) if score == "softmax" else torch.sigmoid(logits)
        assert (r.experts == 0).any(dim=-1).all() and not (r.experts == 5).any()  # the bias steers selection
        picked = scores.gather(-1, r.experts)
        torch.testing.assert_close(r.weights, picked / picked.sum(-1, keepdim=True))  # ...never the weights
        torch.testing.assert_close(r.weights.sum(-1), torch.ones(16))
    raw = route(logits, 2, "sigmoid", normalize=False)
    torch.testing.assert_close(raw.weights, torch.sigmoid(logits).gather(-1, raw.experts))


def test_balance_loss_and_z_loss_match_hand_computed_values():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    counts = torch.tensor([3, 1])  # top-1 choices: 0, 0, 1, 0
    # E Σ f_i P_i = 2 (0.75 · 0.65 + 0.25 · 0.35) = 1.15
    assert load_balancing_loss(probs, counts).item() == pytest.approx(1.15, abs=1e-6)
    assert load_balancing_loss(torch.full((8, 4), 0.25), torch.tensor([4, 4, 4, 4])).item() == pytest.approx(1.0)
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # logsumexp: ln 2, ln 4
    expected = (math.log(2) ** 2 + math.log(4) ** 2) / 2
    assert router_z_loss(logits).item() == pytest.approx(expected, rel=1e-6)


def test_module_aux_losses_are_weighted_and_follow_the_routing():
    cfg = moe_config(num_experts=4, top_k=2, aux_loss_coef=0.05, z_loss_coef=0.002)
    moe = MoE(cfg, 0, ScaleStrategy())
    x = torch.randn(32, 64)
    moe(x)
    logits = moe.input(x)[0].float()  # the site's first branch: the router logits
    probs = logits.softmax(-1)
    chosen = probs.topk(2, dim=-1).indices
    f = torch.bincount(chosen.flatten(), minlength=4).float() / chosen.numel()
    expected_aux = 0.05 * 4 * (f * probs.mean(0)).sum()
    expected_z = 0.002 * torch.logsumexp(logits, -1).pow(2).mean()
    torch.testing.assert_close(moe.last_aux_losses["moe_aux_loss"], expected_aux)
    torch.testing.assert_close(moe.last_aux_losses["moe_z_loss"], expected_z)
    assert moe.last_aux_losses["moe_aux_loss"].requires_grad
    off = MoE(moe_config(aux_loss_coef=0.0, z_loss_coef=0.0), 0, ScaleStrategy())
    off(x)
    assert off.last_aux_losses == {} and off.last_load_stats["aux_loss"] > 0  # still monitored


def test_bias_balancing_evens_out_a_skewed_router():
    cfg = moe_config(num_experts=4, top_k=1, bias_balancing=True, bias_update_rate=0.01, aux_loss_coef=0.0)
    moe = MoE(cfg, 0, ScaleStrategy())
    with torch.no_grad():
        moe.input.weight("router").normal_(0, 0.1)  # scores that differ from token to token...
        moe.input.weight("router")[0] += 0.05  # ...but lean to expert 0
    x = torch.randn(256, 64) + 1.0
    moe.train()
    with torch.no_grad():
        moe(x)
        start = moe.last_load_stats["load_max_over_mean"].item()
        for _ in range(150):
            moe(x)
    end = moe.last_load_stats["load_max_over_mean"].item()
    assert start > 3.0  # most tokens on expert 0 (4 = all of them)
    assert end < 1.3
    assert moe.expert_bias.argmin() == 0 and moe.expert_bias.sum().abs() < 1e-5  # expert 0 held back; centred
    # eval forwards neither update the bias nor queue updates
    moe.eval()
    frozen = moe.expert_bias.clone()
    for _ in range(3):
        moe(x)
    torch.testing.assert_close(moe.expert_bias, frozen)
    assert "expert_bias" in moe.state_dict()


def test_activation_checkpointing_with_bias_balancing():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    cfg = moe_config(num_experts=4, top_k=2, bias_balancing=True, bias_update_rate=0.05)
    torch.manual_seed(1)
    plain = MoE(cfg, 0, ScaleStrategy())
    torch.manual_seed(1)
    wrapped = checkpoint_wrapper(MoE(cfg, 0, ScaleStrategy()), preserve_rng_state=False)
    x = torch.randn(64, 64) + 0.5
    biases = []
    for _ in range(3):
        outs = []
        for m in (plain, wrapped):
            m.train()
            y = m(x)
            inner = m._checkpoint_wrapped_module if m is wrapped else m
            loss = y.square().mean() + sum(inner.last_aux_losses.values())
            loss.backward()  # the recompute must select exactly as the forward did
            outs.append([p.grad.clone() for p in m.parameters()])
            m.zero_grad()
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        biases.append(plain.expert_bias.clone())
    torch.testing.assert_close(plain.expert_bias, wrapped._checkpoint_wrapped_module.expert_bias)
    assert biases[0].abs().sum() == 0 and biases[1].abs().sum() > 0  # updated at the next forward, not the recompute


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
