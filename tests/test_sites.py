"""The scale site against rules written here from the placement definitions, independently of its code.

Every placement (input, output, dual, dual_norm) on every branch (q, k, v, gate, up, router), dense with
grouped-query attention (2 query heads per kv head) and MoE with a shared expert: the fused forward and
its gradients equal a plain per-branch computation, roles follow the absorbability rule, and folding
keeps the function while leaving exactly the output-role scales. Everything in float64, where "equal"
means reduction-order rounding (≤ 1e-10 relative here), on any CPU kind and thread count.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import saved_storages, tiny_config
from scalevec_lit.model import Transformer
from scalevec_lit.model.config import MoEConfig
from scalevec_lit.model.rope import rope_tables
from scalevec_lit.scale import (
    INPUT, OUTPUT, MagnitudeDirectionScale, Placement, PlainScale, ScaleStrategy, fold_scales, group_norm_rope,
    scale_parameters, scaled_linear,
)

BRANCHES = ("q", "k", "v", "gate", "up", "router")
PLACEMENTS = ("input", "output", "dual", "dual_norm")
EXACT = 1e-10


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


# -- the two fused operations against plain autograd --------------------------------------------------------
def test_scaled_linear_equals_scaling_the_activations():
    torch.manual_seed(0)
    d = torch.float64
    x = torch.randn(3, 5, 16, dtype=d, requires_grad=True)
    ws = [torch.randn(o, 16, dtype=d, requires_grad=True) for o in (8, 4, 4)]
    gs = [torch.rand(16, dtype=d, requires_grad=True) + 0.5, None, torch.rand(16, dtype=d, requires_grad=True)]
    us = [None, torch.randn(4, dtype=d, requires_grad=True), torch.randn(4, dtype=d, requires_grad=True)]
    got = scaled_linear(x, ws, gs, us)
    parts = []
    for w, g, u in zip(ws, gs, us):
        y = (x if g is None else x * g) @ w.T
        parts.append(y if u is None else y * u)
    want = torch.cat(parts, -1)
    leaves = [x, *ws, gs[0], gs[2], us[1], us[2]]
    grad = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, leaves, grad), torch.autograd.grad(want, leaves, grad)):
        assert _rel(a, b) <= EXACT
    assert _rel(got, want) <= EXACT


def _norm_rope_composition(a, u, cos, sin):
    """``RoPE(u ⊙ a / RMS(a))`` written from the definitions (plain autograd)."""
    n = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)
    z = n if u is None else n * u
    if cos is None:
        return z
    h = z.shape[-1] // 2
    return z * cos[: z.shape[1], None] + torch.cat((-z[..., h:], z[..., :h]), -1) * sin[: z.shape[1], None]


@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("with_u", [True, False])
def test_group_norm_rope_equals_its_plain_composition(rope, with_u):
    torch.manual_seed(1)
    d = torch.float64
    a = torch.randn(2, 6, 3, 8, dtype=d, requires_grad=True)
    u = (torch.randn(3, 8, dtype=d) + 0.1).requires_grad_() if with_u else None
    cos, sin = (t.double() for t in rope_tables(6, 8, 100.0))  # tables rounded in fp32, as the model's
    got = group_norm_rope(a, u, 1e-6, cos if rope else None, sin if rope else None)
    z = _norm_rope_composition(a, u, cos if rope else None, sin if rope else None)
    leaves = [a] + ([u] if with_u else [])
    grad = torch.randn_like(z)
    assert _rel(got, z) <= EXACT
    for x, y in zip(torch.autograd.grad(got, leaves, grad), torch.autograd.grad(z, leaves, grad)):
        assert _rel(x, y) <= EXACT


@pytest.mark.parametrize("rope", [True, False])
def test_group_norm_rope_in_bfloat16_stays_within_bfloat16_rounding(rope):
    """bf16 activations (FSDP2 mixed precision): computed in float32 inside, rounded to bf16 at the output
    and at the normalized input (as F.rms_norm rounds), so the result is within a few bf16 units
    (2⁻⁸ relative) of the float64 composition; the gradient is computed in float32 from the rounded output
    and rounded once more: 8 units of 2⁻⁸ bound all of it, far below a wrong formula's O(1)."""
    torch.manual_seed(3)
    a64 = torch.randn(2, 6, 3, 8, dtype=torch.float64)
    u64 = torch.rand(3, 8, dtype=torch.float64) + 0.5
    cos, sin = rope_tables(6, 8, 100.0)
    a = a64.bfloat16().requires_grad_()
    u = u64.float().requires_grad_()
    got = group_norm_rope(a, u, 1e-6, cos if rope else None, sin if rope else None)
    assert got.dtype == torch.bfloat16
    ref_a, ref_u = a64.clone().requires_grad_(), u64.clone().requires_grad_()
    z = ref_a * torch.rsqrt(ref_a.pow(2).mean(-1, keepdim=True) + 1e-6) * ref_u
    if rope:
        c, s = cos.double()[:, None], sin.double()[:, None]
        z = z * c + torch.cat((-z[..., 4:], z[..., :4]), -1) * s
    grad = torch.randn_like(z)
    bf16_unit = 2.0 ** -8
    assert _rel(got.double(), z) <= 4 * bf16_unit
    for x, y in zip(torch.autograd.grad(got, [a, u], grad.bfloat16()), torch.autograd.grad(z, [ref_a, ref_u], grad)):
        assert _rel(x.double(), y) <= 8 * bf16_unit


def test_group_norm_rope_reuses_position_tables_only_for_the_same_unchanged_buffers():
    """The u-free RoPE tables are built once per cos/sin buffer, length and dtype: other buffers of the same
    shape (another theta), another length, or the same buffers changed in place all get their own."""
    torch.manual_seed(4)
    a = torch.randn(2, 6, 3, 8, dtype=torch.float64, requires_grad=True)
    u = (torch.rand(3, 8, dtype=torch.float64) + 0.5).requires_grad_()
    tables = {theta: [t.double() for t in rope_tables(6, 8, theta)] for theta in (100.0, 10000.0)}
    cos, sin = tables[100.0]

    def check(x, cos, sin):
        got, want = group_norm_rope(x, u, 1e-6, cos, sin), _norm_rope_composition(x, u, cos, sin)
        assert _rel(got, want) <= EXACT
        grad = torch.randn_like(want)
        for g, w in zip(torch.autograd.grad(got, [x, u], grad), torch.autograd.grad(want, [x, u], grad)):
            assert _rel(g, w) <= EXACT

    for _ in range(2):
        check(a, cos, sin)
        check(a, *tables[10000.0])
        check(a[:, :4], cos, sin)  # a shorter sequence reads the first 4 positions
    cos.copy_(tables[10000.0][0])
    sin.copy_(tables[10000.0][1])
    check(a, cos, sin)


# -- the site against a per-branch computation written from the definitions ----------------------------------
def _model(branch: str, placement: str, hg: bool, moe: bool, shape: str = "channel") -> Transformer:
    torch.manual_seed(2)
    cfg = tiny_config(n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48, vocab_size=64, seq_len=16,
                      moe=MoEConfig(num_experts=4, top_k=2, num_shared_experts=1, expert_intermediate_size=24)
                      if moe else None)
    strategy = ScaleStrategy(vector=PlainScale, branch_specific=hg, placement=Placement(**{branch: placement}),
                             output_shape=shape)
    model = Transformer(cfg, strategy).double()
    with torch.no_grad():  # scales far from 1 and different across heads and channels
        for sp in scale_parameters(model):
            sp.param.copy_(torch.rand_like(sp.param) * 1.5 + 0.25)
    return model


def _expected_role(branch: str, placement: str) -> str:
    """The absorbability rule: u after a norm is absorbable only where the next map is linear in it."""
    if placement == "dual_norm" and branch in ("q", "k", "gate", "router"):
        return OUTPUT
    return INPUT


def _reference_attention(attn, x, cos, sin, placement):
    """q/k/v of one attention site, computed per branch from the definitions (activation-side γ)."""
    site, hd = attn.input, attn.head_dim
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + site.eps)
    outs = []
    for b in "qkv":
        g = site.gamma(b)
        y = (xhat if g is None else xhat * g) @ site.weight(b).T
        p = placement.get(b, "input")
        heads = y.unflatten(-1, (-1, hd))
        if p == "dual_norm":
            heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + site.eps)
        f = site.factors(b)
        u = f.after if f.normalized else f.rows  # full width
        if p in ("output", "dual", "dual_norm"):
            heads = heads * u.view(-1, hd)
        if b in "qk":
            T = heads.shape[1]
            c, s = cos[:T, None], sin[:T, None]
            heads = heads * c + torch.cat((-heads[..., hd // 2:], heads[..., : hd // 2]), -1) * s
        outs.append(heads.flatten(-2))
    return outs


@pytest.mark.parametrize("shape", ["channel", "head"])
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("branch", ["q", "k", "v"])
def test_attention_site_matches_the_definition_with_gqa(branch, placement, shape):
    model = _model(branch, placement, hg=True, moe=False, shape=shape)
    attn = model.blocks[0].attn
    x = torch.randn(2, 8, 32, dtype=torch.float64, requires_grad=True)
    got = attn.input(x, rope=(model.rope_cos, model.rope_sin))
    want = _reference_attention(attn, x, model.rope_cos, model.rope_sin, {branch: placement})
    leaves = [x, *attn.input.parameters()]
    grads = [torch.randn_like(w) for w in want]
    for a, b in zip(got, want):
        assert _rel(a, b) <= EXACT
    for a, b in zip(torch.autograd.grad(got, leaves, grads, allow_unused=True),
                    torch.autograd.grad(want, leaves, grads, allow_unused=True)):
        assert (a is None) == (b is None) and (a is None or _rel(a, b) <= EXACT)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("branch", ["gate", "up"])
def test_mlp_site_matches_the_definition(branch, placement):
    model = _model(branch, placement, hg=False, moe=False)
    site = model.blocks[0].mlp.input
    x = torch.randn(2, 8, 32, dtype=torch.float64, requires_grad=True)
    got = site(x)
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + site.eps)
    want = []
    for b in ("gate", "up"):
        g = site.gamma(b)
        y = (xhat if g is None else xhat * g) @ site.weight(b).T
        if b == branch and placement == "dual_norm":
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + site.eps)
        if b == branch and placement != "input":
            f = site.factors(b)
            y = y * (f.after if f.normalized else f.rows)
        want.append(y)
    leaves = [x, *site.parameters()]
    grads = [torch.randn_like(w) for w in want]
    for a, b in zip(got, want):
        assert _rel(a, b) <= EXACT
    for a, b in zip(torch.autograd.grad(got, leaves, grads), torch.autograd.grad(want, leaves, grads)):
        assert _rel(a, b) <= EXACT


# -- roles and folds for every placement on every branch ------------------------------------------------------
FOLD_CASES = [(b, p, hg, moe) for b in BRANCHES for p in PLACEMENTS if p != "input" for hg in (False, True)
              for moe in (False, True) if moe or b != "router"]


@pytest.mark.parametrize("branch,placement,hg,moe", FOLD_CASES)
def test_roles_and_fold_for_every_placement_on_every_branch(branch, placement, hg, moe):
    model = _model(branch, placement, hg, moe)
    outside = {sp.info.branch: sp.info.role for sp in scale_parameters(model) if sp.info.site.endswith("_proj")}
    expected = {branch: _expected_role(branch, placement)}
    if branch in ("gate", "up") and moe:  # the shared experts follow gate's and up's placement
        expected[f"shared_{branch}"] = _expected_role(branch, placement)
    assert outside == expected
    assert all(sp.info.role == INPUT for sp in scale_parameters(model) if sp.info.site.endswith("_input"))
    idx = torch.randint(0, 64, (2, 12))
    model.eval()
    folded = fold_scales(model)
    assert _rel(folded(idx), model(idx)) <= EXACT
    left = {(sp.info.layer, sp.info.branch) for sp in scale_parameters(folded)}
    want = {(sp.info.layer, sp.info.branch) for sp in scale_parameters(model) if sp.info.role == OUTPUT}
    assert left == want and all(b not in ("shared",) for _, b in left)


def test_a_dnp_output_scale_on_v_folds_into_the_query_heads_that_read_it():
    """GQA: kv head j serves query heads j·g … j·g+g−1, so u on v must repeat per head into W_o's columns
    (repeating the whole vector instead would mix the heads: the fold check above would catch it)."""
    model = _model("v", "dual_norm", hg=False, moe=False)
    attn = model.blocks[0].attn
    u = attn.input.factors("v").after.detach().view(2, -1)  # 2 kv heads
    w_o = attn.o.weight.detach().clone()
    folded = fold_scales(model).blocks[0].attn.o.weight
    group = attn.n_head // attn.n_kv_head
    for h in range(attn.n_head):
        cols = slice(h * attn.head_dim, (h + 1) * attn.head_dim)
        assert torch.equal(folded[:, cols], w_o[:, cols] * u[h // group])


# -- what autograd keeps for the backward -----------------------------------------------------------------------
def _saved_bytes(model: torch.nn.Module, idx: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves during one forward (parameters excluded)."""
    run = lambda: F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()  # noqa: E731
    return sum(b for _, b in saved_storages(model, run))


def test_unified_saves_no_activation_per_branch_beyond_the_baseline():
    """HG applies γ to the weights and DNP on q/k saves only what attention saves anyway, so the unified
    strategy keeps the baseline's activations plus the per-head RMS of q and k (1/head_dim of them)."""
    cfg = tiny_config(n_embd=64, n_head=4, n_kv_head=4, vocab_size=256, seq_len=128)
    torch.manual_seed(0)
    idx = torch.randint(0, 256, (4, 129))
    base = _saved_bytes(Transformer(cfg), idx)
    unified = ScaleStrategy(vector=MagnitudeDirectionScale, branch_specific=True,
                            placement=Placement(q="dual_norm", k="dual_norm"))
    model = Transformer(cfg, unified)
    got = _saved_bytes(model, idx)
    per_head_rms = cfg.n_layer * 4 * 128 * (cfg.n_head + cfg.n_kv_head) * 4  # B·T·(H+K) fp32 per layer
    # plus a few vector-sized intermediates of each γ = β α / RMS(α) (weight-sized, not activations)
    vectors = 4 * 4 * sum(sp.param.numel() for sp in scale_parameters(model))
    assert base < got <= base + per_head_rms + vectors, (base, got, per_head_rms, vectors)
