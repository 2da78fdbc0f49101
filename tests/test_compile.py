"""The GPU path on CPU: every preset's block compiled whole, without a host read, and compiled numerics.

1. Graph capture (``aot_eager``: Dynamo + AOTAutograd, no code generation) of every preset in
   ``recipes/strategy/`` (globbed: a new preset is covered without editing this file), dense in fp32 and
   bf16 (autocast), MoE once per preset (dtype, AC and the MoE options varied across presets), with
   activation checkpointing on and off, forward and backward, through
   ``parallelize`` as training compiles the blocks, with ``fullgraph=True``: a graph break is an error.
   torch 2.13 captures ``.item()``, ``nonzero``, ``bincount`` ... in a full graph (it turns scalar capture
   on) instead of breaking, so the backend refuses any graph holding a data-dependent value (an unbacked
   symbol: a host-device sync on a GPU). Logits and gradients are checked against eager and float64.
2. Inductor (what ``compile: true`` runs) on baseline and unified, fp32 and bf16, the same check.
3. bf16 autocast of the two fused functions (``scale/ops.py``) against float64, per element, within bounds
   derived from bf16's unit roundoff and the reduction sizes (their autocast branches).

Tolerances. ``u = eps / 2`` of the dtype (fp32 2⁻²⁴, bf16 2⁻⁸). A compiled step evaluates the eager step's
function in the same dtype in another order (fusion, reduction order, another backward of a fused function
under compile); it must be as accurate: per tensor, its error against the float64 step (``max|Δ| / max|ref|``)
is at most twice the eager step's, or ``√K u`` (the probabilistic error of a K-term reduction, ``K`` the
terms summed into one entry of that tensor: ``longest_reduction``) when eager is better than that by chance
(a scalar magnitude's gradient, a sum of everything with cancellation, was 22 u off compiled and 10 u
eager; 6 u and 0.1 u in another case). A wrong or missing term is off by O(1).
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers import ROOT, tiny_config
from scalevec_lit.lit.parallel import ParallelOptions, parallelize
from scalevec_lit.model import Block, Transformer
from scalevec_lit.model.config import MoEConfig
from scalevec_lit.model.spec import strategy_from_dict
from scalevec_lit.model.rope import rope_tables
from scalevec_lit.scale import apply_rope, group_norm_rope, scale_parameters, scaled_linear

# slow: every test traces with dynamo (a few seconds each) or compiles C++ kernels with inductor
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

PRESETS = sorted((ROOT / "recipes" / "strategy").glob("*.yaml"))
IDS = [p.stem for p in PRESETS]
VOCAB, T, B = 128, 16, 2


def strategy(path: Path):
    return strategy_from_dict(yaml.safe_load(path.read_text())["model"]["strategy"])


def tiny(moe: MoEConfig | None = None, n_layer: int = 1):
    return tiny_config(vocab_size=VOCAB, seq_len=T, n_layer=n_layer, moe=moe)


@torch.no_grad()
def perturb(model: torch.nn.Module) -> None:
    """Scale vectors away from their init (γ = 1 hides a scale applied twice or not at all)."""
    for sp in scale_parameters(model):
        sp.param.add_(0.3 * torch.randn_like(sp.param))


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def longest_reduction(model: Transformer, numel: int) -> int:
    """Terms summed into one entry of a tensor of ``numel`` entries: a matmul's inner size for the logits
    and activations; for a parameter, the ``B T`` tokens times the entries of the weights it multiplies
    (one weight entry: B T; one γ entry: B T times its consumers' outputs; a scalar magnitude: everything)."""
    c = model.config
    f = c.moe.expert_intermediate_size if c.moe is not None else c.intermediate_size
    width = max(c.n_embd, c.intermediate_size, f, T)
    return max(width, B * T * c.n_embd * width // numel)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-300)).item()


def step(model: Transformer, idx: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Forward (autocast when ``bf16``), cross-entropy plus the MoE losses, backward: the training step."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
    aux = model.aux_losses()
    (loss + sum(aux.values()) if aux else loss).backward()
    return logits.detach(), [p.grad for p in model.parameters()]


class HostRead(Exception):
    """A value computed on the device read by the program (a host-device sync per call on a GPU)."""


def aot_eager_without_host_reads(gm: torch.fx.GraphModule, example_inputs):
    """``aot_eager``, refusing a graph with a data-dependent value: ``.item()``, ``.tolist()``, ``nonzero``,
    ``bincount`` ... With ``fullgraph=True`` Dynamo captures these (torch 2.13 turns scalar capture on for a
    full graph) instead of breaking; each leaves an unbacked symbol in the graph, and each is a sync on a GPU."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            values = torch.utils._pytree.tree_leaves(node.meta.get("example_value"))
            symbolic = [v for v in values if isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool))]
            if any(free_unbacked_symbols(v) for v in symbolic):
                raise HostRead(f"a data-dependent value (a host read): {node.format_node()}; {node.stack_trace}")
    return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


@pytest.fixture()
def strict_dynamo():
    """A fresh Dynamo (and its counters) for each case, any host read a graph break where Dynamo breaks."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch._dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        yield torch._dynamo.utils.counters
    torch._dynamo.reset()


def compiled_step(model: Transformer, bf16: bool, checkpointing: bool, counters, backend=aot_eager_without_host_reads):
    """The training path: ``parallelize`` (AC, then per-block compile, ``fullgraph=True``); one step (two with
    MoE bias balancing: the second applies the load the first queued), and the same steps of the same model
    in eager mode (no AC) and in float64. Returns the three last (logits, gradients)."""
    perturb(model)
    eager, exact = copy.deepcopy(model), copy.deepcopy(model).double()
    parallelize(model, None, ParallelOptions(activation_checkpointing=checkpointing), compile=True,
                compile_options=dict(backend=backend, fullgraph=True))
    steps = 2 if any(getattr(m, "bias_balancing", False) for m in model.modules()) else 1
    batches = [torch.randint(0, VOCAB, (B, T + 1)) for _ in range(steps)]
    got = [step(model, idx, bf16) for idx in batches][-1]
    assert counters["stats"]["unique_graphs"] >= 1, "no block was compiled"
    assert not counters["graph_break"], dict(counters["graph_break"])
    return got, [step(eager, idx, bf16) for idx in batches][-1], [step(exact, idx, False) for idx in batches][-1]


def assert_as_accurate(model: Transformer, bf16: bool, got, eager, exact) -> None:
    """Per tensor (logits, each gradient): the compiled step's error against the float64 step is at most
    twice the eager step's, or ``√K u`` (see the module doc)."""
    u = unit_roundoff(torch.bfloat16 if bf16 else torch.float32)
    assert len(got[1]) == len(exact[1])
    for i, (g, e, x) in enumerate([(got[0], eager[0], exact[0]), *zip(got[1], eager[1], exact[1])]):
        assert (g is None) == (x is None), i
        if x is not None:
            floor = longest_reduction(model, x.numel()) ** 0.5 * u
            assert rel_err(g, x) <= max(2 * rel_err(e, x), floor), (i, rel_err(g, x) / u, rel_err(e, x) / u)


# -- 1. every preset compiles whole (aot_eager, fullgraph) ----------------------------------------------------
# Each preset in fp32 and in bf16, one of them with activation checkpointing: every preset is compiled with AC
# on and off and in both dtypes, and across presets every (dtype, AC) pair occurs (a pairwise design: the
# full product costs twice the time for combinations that share their code).
CASES = [(p, bf16, (i + bf16) % 2 == 1) for i, p in enumerate(PRESETS) for bf16 in (False, True)]
CASE_IDS = [f"{p.stem}-{'bf16' if bf16 else 'fp32'}-{'ac' if ac else 'no_ac'}" for p, bf16, ac in CASES]


def check_compiled(model: Transformer, bf16: bool, checkpointing: bool, counters) -> None:
    assert_as_accurate(model, bf16, *compiled_step(model, bf16, checkpointing, counters))


@pytest.mark.parametrize("preset, bf16, checkpointing", CASES, ids=CASE_IDS)
def test_dense_block_compiles_whole(preset, bf16, checkpointing, strict_dynamo):
    check_compiled(Transformer(tiny(), strategy(preset)), bf16, checkpointing, strict_dynamo)


def moe_options(i: int, branch_specific: bool) -> dict:
    """The i-th preset's MoE variant: i runs through the 8 combinations of scales (shared, expert),
    bias_balancing and shared experts (``scales: expert`` cannot go with branch-specific scales: shared there)."""
    return dict(num_experts=4, top_k=2, expert_intermediate_size=64,
                scales="expert" if i % 2 and not branch_specific else "shared",
                bias_balancing=bool(i // 2 % 2), num_shared_experts=i // 4 % 2)


# One MoE case per preset (the MoE layer's own variants, in both dtypes and with AC, are compiled in
# test_moe_compile.py): the i-th preset gets the i-th combination of the MoE options, and dtype and AC are
# chosen so that every (dtype, AC) pair and every option value occurs with both dtypes across the 14 presets.
MOE_CASES = [(i, p, (i + i // 8) % 2 == 1, i % 3 == 0) for i, p in enumerate(PRESETS)]
MOE_IDS = [f"{i}-{p.stem}-{'bf16' if bf16 else 'fp32'}-{'ac' if ac else 'no_ac'}" for i, p, bf16, ac in MOE_CASES]


@pytest.mark.parametrize("index, preset, bf16, checkpointing", MOE_CASES, ids=MOE_IDS)
def test_moe_block_compiles_whole(index, preset, bf16, checkpointing, strict_dynamo):
    strat = strategy(preset)
    options = moe_options(index, strat.branch_specific)
    model = Transformer(tiny(MoEConfig(**options)), strat)
    model.train()
    check_compiled(model, bf16, checkpointing, strict_dynamo)


# -- the check itself: a host read or a repeated input is a failure ------------------------------------------
class _ItemBlock(Block):
    def forward(self, x, cos, sin):
        return super().forward(x, cos, sin) * (1.0 + 0.0 * x.abs().max().item())


class _NonzeroBlock(Block):
    def forward(self, x, cos, sin):
        y = super().forward(x, cos, sin)
        return y + 0.0 * y.flatten().nonzero().sum()


@pytest.mark.parametrize("block", [_ItemBlock, _NonzeroBlock], ids=["item", "nonzero"])
def test_a_host_read_fails_the_check(block, strict_dynamo):
    """A block that reads a value on the host (a sync per layer on a GPU) does not pass ``compiled_step``."""
    model = Transformer(tiny(), strategy(ROOT / "recipes" / "strategy" / "baseline.yaml"), block)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="a data-dependent value"):
        compiled_step(model, False, False, strict_dynamo)


def test_one_scale_read_by_several_maps_is_one_input(strict_dynamo):
    """One γ (and one u) read by three maps: ``scaled_linear`` compiles to one graph (Dynamo breaks on an
    autograd.Function given the same tensor twice) and its gradients are plain autograd's, the partial
    gradients of the shared tensors summed."""
    d = torch.float64
    x = torch.randn(2, 3, 8, dtype=d, requires_grad=True)
    ws = [torch.randn(o, 8, dtype=d, requires_grad=True) for o in (4, 4, 6)]
    g = torch.rand(8, dtype=d, requires_grad=True) + 0.5
    u = torch.randn(4, dtype=d, requires_grad=True)
    gs, us = [g, g, g], [u, u, None]
    leaves = [x, *ws, g, u]
    want = torch.cat([(x * g) @ ws[0].T * u, (x * g) @ ws[1].T * u, (x * g) @ ws[2].T], -1)
    got = torch.compile(scaled_linear, backend="aot_eager", fullgraph=True)(x, ws, gs, us)
    assert strict_dynamo["stats"]["unique_graphs"] == 1
    grad = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, leaves, grad), torch.autograd.grad(want, leaves, grad)):
        assert rel_err(a, b) <= 16 * unit_roundoff(d)
    assert rel_err(got, want) <= 16 * unit_roundoff(d)


# -- 2. inductor (the compile of GPU recipes) -----------------------------------------------------------------
# inductor compiles C++ kernels: about 10 s a preset on 2 cores (30 s for the first); baseline (one γ read
# by every map, scaled_linear) and unified (HG, magnitude/direction, group_norm_rope with u and RoPE) cover
# every fused function; the graph of every preset is checked above.
@pytest.mark.parametrize("preset, bf16", [("baseline", False), ("unified", False), ("unified", True)],
                         ids=["baseline-fp32", "unified-fp32", "unified-bf16"])
def test_inductor_numerics(preset, bf16, strict_dynamo):
    model = Transformer(tiny(), strategy(ROOT / "recipes" / "strategy" / f"{preset}.yaml"))
    perturb(model)
    eager, exact = copy.deepcopy(model), copy.deepcopy(model).double()
    parallelize(model, None, ParallelOptions(), compile=True)  # what fit runs with compile: true
    idx = torch.randint(0, VOCAB, (B, T + 1))
    got = step(model, idx, bf16)
    assert strict_dynamo["stats"]["unique_graphs"] == 1 and not strict_dynamo["graph_break"]
    assert_as_accurate(model, bf16, got, step(eager, idx, bf16), step(exact, idx, False))


# -- 3. the fused functions under bf16 autocast, per element against float64 ---------------------------------
# Under autocast ``scaled_linear`` rounds x and the effective weight W diag(γ) diag(u) to bf16, multiplies
# exactly (a bf16 product fits fp32), accumulates in fp32 and rounds its output to bf16: each entry is within
# (3 u_b + 2 u_b² + (K + 4) u_32) Σ|terms| of the exact value (three bf16 roundings, K fp32 additions). Its
# backward rounds the weight, x and each product's output once more: the same bound with the matching sums.
def _sum_bound(k: int) -> float:
    ub, u32 = unit_roundoff(torch.bfloat16), unit_roundoff(torch.float32)
    return 3 * ub + 2 * ub * ub + (k + 4) * u32


def _within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> None:
    excess = (got.double() - want).abs() - bound
    assert excess.max() <= 0, (excess.max().item(), (bound.max() / want.abs().max()).item())


def test_scaled_linear_under_bf16_autocast():
    """Three maps reading one γ, one with an output scale u: output, input gradient and the gradients of
    the weights, γ and u within the bf16 bound of each entry; the output in bf16, the gradients in fp32."""
    d_in, outs, bt = 64, (64, 32, 32), (2, 16)
    x = torch.randn(*bt, d_in, requires_grad=True)
    ws = [(0.1 * torch.randn(o, d_in)).requires_grad_() for o in outs]
    g = (1 + 0.3 * torch.randn(d_in)).requires_grad_()
    u = (1 + 0.3 * torch.randn(outs[1])).requires_grad_()
    leaves = [x, *ws, g, u]
    with torch.autocast("cpu", torch.bfloat16):
        y = scaled_linear(x, ws, [g, g, g], [None, u, None])
    assert y.dtype == torch.bfloat16
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, gy)
    assert [t.dtype for t in grads] == [torch.float32] * len(leaves)

    X, W, G, U = (t.detach().double().requires_grad_() for t in (x, torch.cat(ws), g, u))
    parts = W.split(outs)
    W_eff = torch.cat([parts[0] * G, parts[1] * G * U[:, None], parts[2] * G])
    exact = X @ W_eff.T
    want = torch.autograd.grad(exact, [X, W, G, U], gy.double())
    X, W, G, U, W_eff, GY = (t.detach().abs() for t in (X, W, G, U, W_eff, gy.double()))
    rows = torch.cat([torch.ones(outs[0], dtype=torch.float64), U, torch.ones(outs[2], dtype=torch.float64)])
    K, N, M = d_in, sum(outs), bt[0] * bt[1]
    _within(y, exact.detach(), _sum_bound(K) * (X @ W_eff.T))
    _within(grads[0], want[0], _sum_bound(N) * (GY @ W_eff))
    GX = GY.flatten(0, 1).T @ X.flatten(0, 1)  # Σ_tokens |gy_i| |x_j|: [N, d_in]
    _within(torch.cat(grads[1:4]), want[1], _sum_bound(M) * GX * G * rows[:, None])
    _within(grads[4], want[2], _sum_bound(M + N) * (GX * W * rows[:, None]).sum(0))
    _within(grads[5], want[3], _sum_bound(M + K) * (GX * W * G).split(outs)[1].sum(1))


def _norm_rope_exact(a, u, cos, sin, eps):
    """``RoPE(u ⊙ a / RMS(a))`` from the definitions, in float64."""
    n = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps)
    return apply_rope(n * u, cos, sin), n


@pytest.mark.parametrize("zero", [False, True], ids=["recovered", "saved"])
def test_group_norm_rope_under_bf16(zero):
    """bf16 q/k (the output of ``scaled_linear`` under autocast) through the per-head norm, u and RoPE:
    computed in fp32, output rounded to bf16. Each output entry is within (2 u_b + u_b² + (g + 10) u_32) M of
    the exact value, ``M = |u n| |cos| + |rotate(u n)| |sin|`` (the normalized input and the output rounded
    once each). Backward: the normalized input recovered from the bf16 output (all u ≠ 0: off by
    ``E = RoPEᵀ(δ_y) / |u|``) or saved in bf16 (a u_j exactly 0: off by ``u_b |n|``); the gradients of the
    input and of u follow from E, and the input gradient is rounded to bf16 once more."""
    Bn, Tn, G, g, eps = 2, 16, 6, 16, 1e-6
    ub, u32 = unit_roundoff(torch.bfloat16), unit_roundoff(torch.float32)
    cos, sin = rope_tables(Tn, g, 10000.0)
    a = torch.randn(Bn, Tn, G, g).bfloat16().requires_grad_()
    u = (1 + 0.3 * torch.randn(G, g))
    if zero:
        u[1, 3] = 0.0
    u.requires_grad_()
    y = group_norm_rope(a, u, eps, cos, sin)
    assert y.dtype == torch.bfloat16
    gy = torch.randn_like(y)
    ga, gu = torch.autograd.grad(y, [a, u], gy)
    assert ga.dtype == torch.bfloat16 and gu.dtype == torch.float32

    A, U, C, S = a.detach().double().requires_grad_(), u.detach().double().requires_grad_(), cos.double(), sin.double()
    exact, n = _norm_rope_exact(A, U, C, S, eps)
    want_a, want_u = torch.autograd.grad(exact, [A, U], gy.double())
    c, s = C[:Tn, None, :], S[:Tn, None, :]
    swap = lambda t: torch.cat((t[..., g // 2:], t[..., : g // 2]), -1)  # noqa: E731
    z = (n * U).detach().abs()
    delta_y = (2 * ub + ub * ub + (g + 10) * u32) * (z * c.abs() + swap(z) * s.abs())
    _within(y, exact.detach(), delta_y)
    n = n.detach()
    if zero:
        E = (ub + (g + 10) * u32) * n.abs()
    else:  # n = RoPE⁻¹(y) / u: RoPE⁻¹ mixes each pair (j, j ± g/2) with cos and sin
        E = (delta_y * c.abs() + swap(delta_y * s.abs())) / U.detach().abs() + (g + 10) * u32 * n.abs()
    gz = gy.double().abs() * c.abs() + swap(gy.double().abs() * s.abs())  # ≥ |RoPEᵀ(gy)|
    gn = gz * U.detach().abs()  # |∂L/∂n|
    rstd = torch.rsqrt(A.detach().pow(2).mean(-1, keepdim=True) + eps)
    mean_m = (gn * n.abs()).mean(-1, keepdim=True)
    slack = (g + 10) * u32
    bound_a = rstd * (E * mean_m + n.abs() * (gn * E).mean(-1, keepdim=True)) + ub * want_a.abs() \
        + (ub + slack) * rstd * (gn + n.abs() * mean_m)
    _within(ga, want_a, bound_a)
    bound_u = (gz * E).sum((0, 1)) + (Bn * Tn + 4) * u32 * (gz * n.abs()).sum((0, 1))
    _within(gu, want_u, bound_u)
