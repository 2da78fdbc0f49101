"""The routed experts' scales on their weights: ``model.experts.scaled_expert_matmul``.

Every expert branch of a site reads x̂ itself, gathered once per (token, slot) row; each branch's input-side
γ (shared ``[in]`` or per expert ``[E, in]``) and an un-normalized output-side u (``[out]``) multiply its
stacked weight, and that effective weight is recomputed in the backward instead of being saved. Checked:

- the function and its gradients (input, weight, γ, u) against autograd's plain composition in float64,
  on every way the expert matmul runs (host-sliced loop, the grouped kernel) and compiled (``aot_eager``,
  full graph, no host read);
- what the MoE layer saves: with branch-specific γ on gate and up (``hg``) exactly one gathered input
  ``[rows, d]``, as with one shared γ (``baseline``), and no weight-sized tensor besides the parameters.
"""
from __future__ import annotations

import pytest
import torch

from scalevec_lit.model.experts import _grouped_mm_fits, effective_expert_weight, expert_matmul, scaled_expert_matmul
from helpers import saved_storages
from scalevec_lit.scale.ops import higher_order
from test_compile import aot_eager_without_host_reads, strict_dynamo  # noqa: F401
from test_moe_compile import build

pytestmark = pytest.mark.usefixtures("one_thread")
E, OUT, IN, ROWS = 4, 24, 32, 18
COUNTS = torch.tensor([5, 0, 9, 4])  # an expert without rows: zero gradients for its weight and γ_e


def operands(dtype, cols_kind: str, rows_on: bool):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, IN, generator=g, dtype=torch.float64)
    w = 0.2 * torch.randn(E, OUT, IN, generator=g, dtype=torch.float64)
    cols = {"none": None, "shared": 1 + 0.3 * torch.randn(IN, generator=g, dtype=torch.float64),
            "expert": 1 + 0.3 * torch.randn(E, IN, generator=g, dtype=torch.float64)}[cols_kind]
    rows = 1 + 0.3 * torch.randn(OUT, generator=g, dtype=torch.float64) if rows_on else None
    return [None if t is None else t.to(dtype).requires_grad_() for t in (x, w, cols, rows)]


def reference(x, w, cols, rows, offsets):
    """Autograd's composition in float64 (the effective weight built, then the host-sliced matmuls)."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, cols, rows)]
    y = expert_matmul(leaves[0], effective_expert_weight(*leaves[1:]), offsets, "loop")
    return y, leaves


def grads_of(y, leaves, gy):
    present = [t for t in leaves if t is not None]
    return y.detach(), torch.autograd.grad(y, present, gy.to(y.dtype))


def close(got, want, tol):
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-300)).item()
    assert err <= tol, err


CASES = [(c, r) for c in ("none", "shared", "expert") for r in (False, True) if c != "none" or r]


@pytest.mark.parametrize("cols_kind, rows_on", CASES, ids=[f"{c}-{'u' if r else 'no_u'}" for c, r in CASES])
@pytest.mark.parametrize("way", ["loop-float64", "grouped-float32", "compiled-float32", "compiled-float64"])
def test_scaled_expert_matmul_equals_the_plain_composition(way, cols_kind, rows_on, strict_dynamo):
    kind, dtype_name = way.split("-")
    dtype = getattr(torch, dtype_name)
    offsets = COUNTS.cumsum(0).to(torch.int32)
    x, w, cols, rows = operands(dtype, cols_kind, rows_on)
    if kind == "grouped" and not _grouped_mm_fits(x, OUT):
        pytest.skip("this torch has no grouped kernel for float32 on CPU")
    mode = "loop" if kind == "loop" else "auto"
    fn = scaled_expert_matmul
    if kind == "compiled":
        fn = torch.compile(scaled_expert_matmul, backend=aot_eager_without_host_reads, fullgraph=True)
    y = fn(x, w, cols, rows, offsets, mode)
    gy = torch.randn(y.shape, dtype=torch.float64)
    got = grads_of(y, [x, w, cols, rows], gy)
    want = grads_of(*reference(x, w, cols, rows, offsets), gy)
    if kind == "compiled":
        assert not strict_dynamo["graph_break"]
    # float64: a few roundings of K-term sums; float32 against float64: √K u32 per entry, K ≤ ROWS·OUT
    tol = 64 * torch.finfo(torch.float64).eps if dtype == torch.float64 else (ROWS * OUT) ** 0.5 * 2 ** -24 * 8
    close(got[0], want[0], tol)
    for a, b in zip(got[1], want[1]):
        close(a, b, tol)
    assert torch.count_nonzero(got[1][1][1]) == 0  # the weight of the expert without rows


def test_inside_higher_order_it_is_the_plain_composition():
    """Twice differentiable where Hessian-vector products need it (``SharpnessMonitor``)."""
    offsets = COUNTS.cumsum(0).to(torch.int32)
    x, w, cols, rows = operands(torch.float64, "expert", True)
    with higher_order():
        y = scaled_expert_matmul(x, w, cols, rows, offsets, "loop")
    (gc,) = torch.autograd.grad(y.square().sum(), [cols], create_graph=True)
    (hv,) = torch.autograd.grad(gc.sum(), [cols])
    assert torch.isfinite(hv).all() and hv.abs().sum() > 0


def saved_shapes(moe, x) -> list[tuple[tuple, int]]:
    return saved_storages(moe, lambda: moe(x).sum().backward())


@pytest.mark.parametrize("scales, preset", [("shared", "baseline"), ("shared", "hg"), ("expert", "dp"),
                                            ("shared", "or")])
def test_the_layer_gathers_its_input_once_and_saves_no_weight(scales, preset):
    moe = build(scales, False, 0, preset, "softmax")
    n, d = 40, moe.input.dim
    x = torch.randn(n, d, requires_grad=True)  # the residual stream: the input gradient is wanted
    saved = saved_shapes(moe, x)
    rows = n * moe.top_k
    gathered = [s for s, b in saved if s == (rows, d)]
    assert len(gathered) == 1, saved
    weight_numel = moe.input.weight("gate").numel()
    assert not [s for s, b in saved if b >= 4 * weight_numel], saved
