"""Tests of the mixture-of-experts layer (``scalevec_lit/model/moe.py``): routing and balancing.

Checks: equal experts reproduce the dense SwiGLU; outputs and gradients match a per-token reference;
gradients reach exactly the selected experts and the router; bias balancing evens a skewed router and
never touches the combine weights; the balance loss matches hand-computed values; activation checkpointing
with bias balancing. The model around it (scale sites, folding, counts, recipes, monitor, an end-to-end
run): ``tests/test_moe_model.py``.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_config
from moe_models import moe_config, perturb_scales
from scalevec_lit.model import SwiGLU
from scalevec_lit.model.moe import MoE, load_balancing_loss, route, router_z_loss
from scalevec_lit.scale import ScaleStrategy


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
