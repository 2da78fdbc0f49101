"""Exactness at the edges (issue 23): the fused q/k norm's gradients with an output scale entry exactly 0,
ER's conserved quantity, head-shaped conversions, and no parameter the function cannot see.

Everything in float64 against plain autograd of the definitions; "equal" means reduction-order rounding.
"""
from __future__ import annotations

import pytest
import torch

from scalevec_lit.model.rope import rope_tables
from scalevec_lit.scale import group_norm_rope, scaled_linear

pytestmark = pytest.mark.usefixtures("one_thread")

EPS64 = torch.finfo(torch.float64).eps


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


# -- (1) q/k norm + RoPE with u_j = 0 exactly ---------------------------------------------------------------
def _qk_reference(x, w, gamma, u, cos, sin, eps):
    """``RoPE(u ⊙ RMS_head(W (γ ⊙ x̂)))`` written from the definitions (plain autograd)."""
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    a = ((xhat * gamma) @ w.T).unflatten(-1, (-1, u.shape[-1]))
    z = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps) * u
    if cos is None:
        return z.flatten(-2)
    h = z.shape[-1] // 2
    T = z.shape[1]
    return (z * cos[:T, None] + torch.cat((-z[..., h:], z[..., :h]), -1) * sin[:T, None]).flatten(-2)


def _qk_library(x, w, gamma, u, cos, sin, eps):
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    a = scaled_linear(xhat, [w], [gamma], [None]).unflatten(-1, (-1, u.shape[-1]))
    return group_norm_rope(a, u, eps, cos, sin).flatten(-2)


@pytest.mark.parametrize("rope", [True, False])
def test_q_k_norm_gradients_are_exact_with_output_scale_entries_exactly_zero(rope):
    """Every gradient (the block input, the rows of W_q/W_k, γ, u) equals plain autograd when some u_j are 0:
    a zero channel's normalized input still enters its u_j's gradient and, through the head's RMS, the
    gradient of every input of that head (the function divided by u and got those wrong)."""
    torch.manual_seed(5)
    d, eps, hd = torch.float64, 1e-6, 8
    x = torch.randn(2, 6, 16, dtype=d, requires_grad=True)
    w = torch.randn(4 * hd, 16, dtype=d, requires_grad=True)  # q and k: 2 + 2 heads of 8
    gamma = (torch.rand(16, dtype=d) + 0.5).requires_grad_()
    u = torch.rand(4, hd, dtype=d) + 0.5
    u[0, 1] = u[2, 5] = u[3, 0] = 0.0  # a zero in a rotated pair's first and second half
    u[1] = 0.0  # a whole head
    u.requires_grad_()
    cos, sin = (t.double() for t in rope_tables(6, hd, 100.0)) if rope else (None, None)
    got = _qk_library(x, w, gamma, u, cos, sin, eps)
    want = _qk_reference(x, w, gamma, u, cos, sin, eps)
    assert _rel(got, want) <= 64 * EPS64
    grad = torch.randn_like(want)
    leaves = [x, w, gamma, u]
    grads = torch.autograd.grad(got, leaves, grad)
    for name, g, r in zip(("x", "W", "gamma", "u"), grads, torch.autograd.grad(want, leaves, grad)):
        assert _rel(g, r) <= 1e3 * EPS64, name
    gu = grads[3]  # the zero channels do get a gradient (what the division lost)
    assert gu[0, 1] != 0 and (gu[1] != 0).all()


def test_q_k_norm_without_zero_output_scales_saves_no_input():
    """The exact path costs nothing when no u_j is 0: only the output, the per-head RMS and the tables'
    inputs are saved (the normalized input only once some u_j is exactly 0)."""
    a = torch.randn(2, 3, 2, 4, dtype=torch.float64, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    for zero, want in ((False, 0), (True, 1)):
        u = torch.rand(2, 4, dtype=torch.float64) + 0.5
        if zero:
            u[1, 2] = 0.0
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            group_norm_rope(a, u.requires_grad_(), 1e-6)
        assert saved.count((2, 3, 2, 4)) == 1 + want  # the output, and the normalized input with a zero u_j
