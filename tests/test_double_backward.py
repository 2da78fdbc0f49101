"""Second derivatives through the library's custom autograd code (issue 27): Hessian-vector products of
every preset in ``recipes/strategy/`` (globbed), dense and MoE, in float64, inside
``scalevec_lit.scale.ops.higher_order()``.

- HVP against central finite differences of gradients with Richardson extrapolation
  ``(4 D(ε) − D(2ε)) / 3``, ``D(ε) = (∇L(θ+εv) − ∇L(θ−εv)) / 2ε``, ‖v‖ = 1, ε = 1e-3. Its truncation error
  is O(ε⁴ ‖∂⁵L‖) (measured ≤ 2e-9 relative on every dense preset): bound 1e-8. The MoE router rounds its
  logits to float32 (``routing.py``), so there the rounding of the gradients, about 2⁻²⁴ ‖∇L‖ / ε,
  dominates (measured ≤ 3e-6): bound 1e-5. (ε is small enough that no top-k choice flips between the
  four evaluation points; a flip is an O(1) jump, seen at ε = 3e-3 on two presets.) A wrong second
  derivative (the fused norm's own backward, which treats its saved reciprocal RMS as a constant) is off by
  7-25 % on the presets that use it.
- HVP against ``Hᵀ v`` with ``H`` the dense Hessian (``torch.autograd.functional.hessian`` of the loss as a
  function of the flattened parameter vector, row i = ∂(∇L)_i/∂θ) on models small enough: two float64
  evaluations of the same quantity in different orders, so within 1e-10 relative. ``H`` is symmetric to
  1e-12 of its largest entry for the dense model; the MoE router's float32 logits make it symmetric only
  to about 2⁻²⁴ (hence ``Hᵀ v``, what reverse-over-reverse computes, not ``H v``).
- The fused norm refuses a second derivative asked outside ``higher_order()`` (an error, never a wrong
  number); inside it gives the fused function's values; the MoE grouped-matmul operator is twice
  differentiable.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import ROOT, flat_objective, hessian_model
from scalevec_lit.model import Transformer
from scalevec_lit.scale import group_norm_rope
from scalevec_lit.scale.ops import higher_order

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = sorted(p.stem for p in (ROOT / "recipes" / "strategy").glob("*.yaml"))
VOCAB = 32  # hessian_model's vocabulary


def objective(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """The training objective: next-token cross-entropy plus the MoE losses."""
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    aux = model.aux_losses()
    return loss + sum(aux.values()) if aux else loss


def hvp(model, params, idx, v) -> torch.Tensor:
    with higher_order():
        grads = torch.autograd.grad(objective(model, idx), params, create_graph=True)
    dot = sum((g * t).sum() for g, t in zip(grads, v))
    return torch.cat([h.flatten() for h in torch.autograd.grad(dot, params)])


def grad_at(model, params, idx, v, step: float) -> torch.Tensor:
    with torch.no_grad():
        for p, t in zip(params, v):
            p.add_(step * t)
    try:
        return torch.cat([g.flatten() for g in torch.autograd.grad(objective(model, idx), params)])
    finally:
        with torch.no_grad():
            for p, t in zip(params, v):
                p.sub_(step * t)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


CASES = [(p, moe) for p in PRESETS for moe in (False, True)]


@pytest.mark.parametrize("preset, moe", CASES, ids=[f"{p}-{'moe' if m else 'dense'}" for p, m in CASES])
def test_hvp_matches_finite_differences(preset, moe):
    model = hessian_model(preset, moe, PRESETS.index(preset))
    params = [p for p in model.parameters() if p.requires_grad]
    idx = torch.randint(0, VOCAB, (2, 9))
    v = [torch.randn_like(p) for p in params]
    norm = torch.sqrt(sum(t.square().sum() for t in v))
    v = [t / norm for t in v]
    exact = hvp(model, params, idx, v)
    eps = 1e-3

    def central(e: float) -> torch.Tensor:
        return (grad_at(model, params, idx, v, e) - grad_at(model, params, idx, v, -e)) / (2 * e)

    richardson = (4 * central(eps) - central(2 * eps)) / 3
    assert rel(exact, richardson) < (1e-5 if moe else 1e-8)


@pytest.mark.parametrize("preset, moe", [("unified", False), ("dnp", True)], ids=["unified-dense", "dnp-moe"])
def test_hvp_matches_dense_hessian(preset, moe):
    model = hessian_model(preset, moe, 1, experts=(2, 1, 4), vocab_size=8, n_embd=8, intermediate_size=8)
    idx = torch.randint(0, 8, (2, 5))
    f, theta = flat_objective(model, idx)
    assert theta.numel() < 800  # small enough for a dense Hessian
    with higher_order():
        H = torch.autograd.functional.hessian(f, theta, vectorize=True)
    if not moe:
        assert torch.allclose(H, H.T, rtol=0, atol=1e-12 * H.abs().max().item())
    params = [p for p in model.parameters() if p.requires_grad]
    v = torch.randn_like(theta)
    vs, start = [], 0
    for p in params:
        vs.append(v[start:start + p.numel()].view_as(p))
        start += p.numel()
    assert rel(hvp(model, params, idx, vs), H.T @ v) < 1e-10


def test_fused_norm_refuses_second_derivative_outside_higher_order():
    a = torch.randn(2, 3, 2, 4, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    y = group_norm_rope(a, u, 1e-6)
    with pytest.raises(RuntimeError, match=r"group_norm_rope: a second derivative \(create_graph=True\).*higher_order"):
        torch.autograd.grad(y.square().sum(), (a, u), create_graph=True)
    # first derivatives as before; inside higher_order the same values from the plain composition
    fused = torch.autograd.grad(group_norm_rope(a, u, 1e-6).sin().sum(), (a, u))
    with higher_order():
        y_plain = group_norm_rope(a, u, 1e-6)
        plain = torch.autograd.grad(y_plain.sin().sum(), (a, u))
    assert torch.allclose(y_plain, group_norm_rope(a, u, 1e-6), rtol=0, atol=1e-14)
    for x, z in zip(fused, plain):
        assert torch.allclose(x, z, rtol=0, atol=1e-13)


def test_grouped_mm_operator_is_twice_differentiable():
    from scalevec_lit.model.experts import _grouped_mm_op, _per_expert_sliced

    x = torch.randn(10, 16, requires_grad=True)
    w = torch.randn(3, 8, 16, requires_grad=True)
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)  # expert 1 has no rows
    out = []
    for mm in (lambda a, b: _grouped_mm_op(a, b, offs), lambda a, b: _per_expert_sliced(a, b, offs)):
        gx, gw = torch.autograd.grad(mm(x, w).sin().sum(), (x, w), create_graph=True)
        out.append(torch.autograd.grad(gx.square().sum() + gw.square().sum(), (x, w)))
    for a, b in zip(*out):  # fp32, the same products summed in another order: a few units of roundoff
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
