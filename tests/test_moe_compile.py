"""The MoE layer compiles whole and reads nothing on the host (``scalevec_lit/model/moe.py``, ``routing.py``,
``experts.py``).

"No host read" is checked on a CPU: with ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops``
off, Dynamo cannot put a data-dependent value (``.item()``, ``.tolist()``, ``nonzero``, ``bincount``'s
size) in a graph, so it breaks the graph there. ``fullgraph=True`` cannot be the check: in torch 2.13 it
turns scalar capture on by itself (``.item()`` then compiles, as an unbacked symbol), so the layer is
compiled without it and the test asserts one graph and no break (which is what ``fullgraph=True``
compiles, minus any host read). Each variant (``scales: shared|expert``, bias balancing on/off, shared
experts on/off, several placements) is compiled with the ``aot_eager`` backend (Dynamo + AOTAutograd: the
forward and the backward graphs) in fp32 and under bf16 autocast, and with activation checkpointing, and
three training steps are compared with eager ones: outputs, every gradient, the aux losses, the load
statistics and the balancing bias (which moves between the steps), within a tolerance derived from the
dtype. The new grouping equals the old one (``torch.bincount``, host-sliced matmuls) exactly, in float64.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo as dynamo
import torch.nn.functional as F
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from helpers import ROOT, tiny_config
from scalevec_lit.model import MoEConfig
from scalevec_lit.model.experts import effective_expert_weight, expert_matmul
from scalevec_lit.scale.ops import higher_order
from scalevec_lit.model.moe import MoE, group_by_expert
from scalevec_lit.scale import ScaleStrategy, scale_parameters
from moe_models import preset_strategy

# slow: every test traces with dynamo (a few seconds each) or compiles C++ kernels with inductor
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

STRATEGY = {name: (lambda n=name: preset_strategy(ROOT / "recipes" / "strategy" / f"{n}.yaml"))
            for name in ("baseline", "hg", "dp", "unified_dnp_vup", "sandwich", "or")}

# scales, bias balancing, shared experts, strategy preset, router: every combination of the first three
VARIANTS = [
    ("shared", False, 0, "baseline", "softmax"),
    ("shared", True, 0, "dp", "sigmoid"),
    ("shared", False, 1, "hg", "softmax"),
    ("shared", True, 1, "unified_dnp_vup", "softmax"),
    ("expert", False, 0, "sandwich", "sigmoid"),
    ("expert", True, 0, "baseline", "softmax"),
    ("expert", False, 1, "dp", "softmax"),
    ("expert", True, 1, "or", "sigmoid"),
]


@pytest.fixture(autouse=True)
def _no_host_reads():
    """Any data-dependent value is a graph break (see the module doc)."""
    with dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        dynamo.reset()
        yield
    dynamo.reset()


def compile_counted(fn):
    """``fn`` compiled with ``aot_eager`` (no ``fullgraph``: see the module doc), and the graphs it made."""
    aot_eager = lookup_backend("aot_eager")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    counters.clear()
    return torch.compile(fn, backend=backend), graphs


def assert_one_graph(graphs) -> None:
    breaks = dict(counters["graph_break"])
    assert not breaks and len(graphs) == 1, (len(graphs), list(breaks)[:3])


def build(scales: str, bias: bool, shared: int, preset: str, router: str) -> MoE:
    cfg = tiny_config(moe=MoEConfig(num_experts=4, top_k=2, expert_intermediate_size=32, scales=scales,
                                    bias_balancing=bias, bias_update_rate=0.05, num_shared_experts=shared,
                                    router=router, aux_loss_coef=0.01, z_loss_coef=0.001))
    moe = MoE(cfg, 0, STRATEGY[preset]())
    with torch.no_grad():
        for sp in scale_parameters(moe):
            sp.param.add_(0.2 * torch.randn_like(sp.param))
        moe.input.weight("router").mul_(20)  # decided routes: no near-tie that a last-bit difference could flip
    return moe.train()


def train_steps(moe: torch.nn.Module, inner: MoE, xs: list[torch.Tensor], dtype: torch.dtype) -> list[dict]:
    """One forward and backward per input; what each step produced (output, gradients, losses, stats, bias)."""
    steps = []
    for x in xs:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            y = moe(x)
        loss = y.float().square().mean() + sum(inner.last_aux_losses.values())
        loss.backward()
        steps.append({
            "y": y.detach().float(), **{f"grad {n}": p.grad.clone() for n, p in inner.named_parameters()},
            **{f"loss {k}": v.detach() for k, v in inner.last_aux_losses.items()},
            **{f"stat {k}": v.float() for k, v in inner.last_load_stats.items()},
            **({"bias": inner.expert_bias.clone()} if inner.bias_balancing else {}),
        })
        inner.zero_grad(set_to_none=True)
    return steps


# activation checkpointing changes what runs when, not the dtype: checked in fp32
MODES = [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)]


@pytest.mark.parametrize("dtype,checkpointing", MODES, ids=["fp32", "bf16", "fp32-checkpointed"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_moe_compiles_whole_without_host_reads_and_matches_eager(variant, dtype, checkpointing):
    eager = build(*variant)
    inner = copy.deepcopy(eager)
    wrapped = checkpoint_wrapper(inner, preserve_rng_state=False) if checkpointing else inner
    compiled, graphs = compile_counted(wrapped)
    xs = [torch.randn(2, 12, 64) for _ in range(3)]
    want = train_steps(eager, eager, xs, dtype)
    got = train_steps(compiled, inner, xs, dtype)
    assert_one_graph(graphs)  # and no recompilation over the three steps
    eps = torch.finfo(dtype).eps
    for step, (a, b) in enumerate(zip(got, want)):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype
            torch.testing.assert_close(a[key], b[key], rtol=16 * eps, atol=16 * eps * b[key].abs().max().item(),
                                       msg=lambda m: f"step {step}, {key}: {m}")
    if variant[1]:
        assert want[0]["bias"].abs().sum() == 0 and any(s["bias"].abs().sum() > 0 for s in want)  # it moved


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_bias_balancing_compiles_whole_under_a_process_group(checkpointing):
    """With a process group the queued load is summed over ranks in the forward (``all_reduce``, traced by
    Dynamo as a functional collective: no break, no host read); one rank here, compiled equals eager."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        eager = build("shared", True, 1, "baseline", "softmax")
        inner = copy.deepcopy(eager)
        compiled, graphs = compile_counted(checkpoint_wrapper(inner, preserve_rng_state=False) if checkpointing
                                           else inner)
        xs = [torch.randn(2, 12, 64) for _ in range(3)]
        want, got = train_steps(eager, eager, xs, torch.float32), train_steps(compiled, inner, xs, torch.float32)
        assert_one_graph(graphs)
        eps = torch.finfo(torch.float32).eps
        for a, b in zip(got, want):
            for key in a:
                torch.testing.assert_close(a[key], b[key], rtol=16 * eps, atol=16 * eps * b[key].abs().max().item())
    finally:
        dist.destroy_process_group()


# -- the grouping and the expert matmuls against the old algorithm ------------------------------------------
def old_grouping(experts: torch.Tensor, num_experts: int):
    """What the layer did before: ``torch.bincount`` (its size depends on the values) and the same sort."""
    k = experts.shape[-1]
    flat = experts.flatten()
    _, order = flat.sort(stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel()))
    return order, order // k, inverse, counts.cumsum(0).to(torch.int32), counts


@pytest.mark.parametrize("n,k,num_experts", [(1, 1, 1), (1, 2, 8), (7, 2, 4), (64, 4, 16), (300, 8, 64)])
def test_grouping_equals_the_old_algorithm_exactly(n, k, num_experts):
    gen = torch.Generator().manual_seed(n * 1000 + num_experts)
    cases = [torch.rand(n, num_experts, generator=gen).topk(k, -1).indices,  # a real top-k: distinct per token
             torch.randint(0, 1, (n, k)),  # every pair on expert 0
             torch.randint(num_experts - 1, num_experts, (n, k))]  # every pair on the last expert
    for experts in cases:
        g = group_by_expert(experts, num_experts)
        for name, new, old in zip(("order", "token", "inverse", "offsets", "counts"),
                                  (g.order, g.token, g.inverse, g.offsets, g.counts),
                                  old_grouping(experts, num_experts)):
            assert new.dtype == old.dtype and torch.equal(new, old), (name, experts.tolist())
        assert int(g.counts.sum()) == n * k  # dropless: every pair kept
    # the check that guards the layer sees the old algorithm's host read (bincount's size)
    compiled, graphs = compile_counted(lambda e: old_grouping(e, num_experts))
    compiled(cases[0])
    assert [r for r in counters["graph_break"] if "bincount" in r]
    compiled, graphs = compile_counted(lambda e: group_by_expert(e, num_experts))
    compiled(cases[0])
    assert_one_graph(graphs)


def old_layer(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward before this change (eval, no out_norm, no shared experts): bincount counts and
    one matmul per expert on rows sliced at the counts read on the host."""
    from scalevec_lit.model.moe import route

    outs = dict(zip((b.name for b in moe.input.branches), moe.input(x)))
    r = route(outs["router"], moe.top_k, moe.score, getattr(moe, "expert_bias", None), moe.route_norm)
    n, k = r.experts.shape
    order, _, inverse, _, counts = old_grouping(r.experts, moe.num_experts)

    def mm(a, w):
        out, start = [], 0
        for e, c in enumerate(counts.tolist()):
            if c:
                out.append(a[start:start + c] @ w[e].transpose(0, 1))
                start += c
        return torch.cat(out)

    xs = outs["gate"][order // k]
    assert outs["up"] is outs["gate"]  # x̂ itself for every expert branch; γ is on the weights
    h = F.silu(moe.input.expert_output("gate", mm(xs, effective_expert_weight(*moe.input.expert_factors("gate")))))
    h = h * moe.input.expert_output("up", mm(xs, effective_expert_weight(*moe.input.expert_factors("up"))))
    y_pairs = mm(h, moe.expert_down)[inverse].view(n, k, -1)
    return torch.einsum("nkd,nk->nd", y_pairs, r.weights.to(y_pairs.dtype))


@pytest.mark.parametrize("scales,preset", [("shared", "hg"), ("expert", "dp")])
def test_float64_layer_equals_the_old_algorithm_exactly(scales, preset):
    moe = build(scales, True, 0, preset, "softmax").double().eval()
    with torch.no_grad():
        moe.expert_bias.normal_(0, 0.05)
    x = torch.randn(40, 64, dtype=torch.float64)
    g = torch.randn(40, 64, dtype=torch.float64)
    params = list(moe.parameters())
    with higher_order():  # the scaled expert matmul as autograd's composition: only the grouping differs
        y = moe(x)
    y_old = old_layer(moe, x)
    assert torch.equal(y, y_old)
    for a, b in zip(torch.autograd.grad(y, params, g), torch.autograd.grad(y_old, params, g)):
        assert torch.equal(a, b)
    assert int((moe.last_load_stats["tokens_per_expert"] > 0).sum()) == 4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 62], ids=["aligned", "unaligned"])
def test_every_expert_matmul_path_compiles_and_agrees(dtype, width):
    """Compiled (grouped kernel, opaque operator or masked per-expert matmuls: none reads the offsets on the
    host) against eager host-sliced matmuls in float64; an expert without rows gets a zero gradient."""
    counts = torch.tensor([5, 0, 9, 2])
    offsets = counts.cumsum(0).to(torch.int32)
    x64 = torch.randn(16, width, dtype=torch.float64, requires_grad=True)
    w64 = torch.randn(4, 24, width, dtype=torch.float64, requires_grad=True)
    want = expert_matmul(x64, w64, offsets, "loop")
    gx, gw = torch.autograd.grad(want.sum(), [x64, w64])
    eps = torch.finfo(dtype).eps

    def close(a, b):
        torch.testing.assert_close(a.double(), b, rtol=8 * eps, atol=8 * eps * b.abs().max().item())

    for mode in ("auto", "loop"):
        x = x64.detach().to(dtype).requires_grad_()
        w = w64.detach().to(dtype).requires_grad_()
        dynamo.reset()
        compiled, graphs = compile_counted(expert_matmul)
        y = compiled(x, w, offsets, mode)
        y.sum().backward()  # a stride-0 gradient into the matmul
        assert_one_graph(graphs)
        close(y, want.detach())
        close(x.grad, gx)
        close(w.grad, gw)
        assert torch.equal(w.grad[1], torch.zeros_like(w.grad[1]))


@pytest.mark.slow
def test_gpu_check_runs_the_moe_layer(tmp_path):
    """benchmarks/gpu_check.py's MoE path (the one that counts syncs per step on a GPU) runs this layer with
    its aux losses in the loss, on one FSDP2 rank; on a CPU as a dry run."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--sizes",
                          "tiny_moe", "--presets", "baseline", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (row,) = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert (row["size"], row["preset"], row["finite"]) == ("tiny_moe", "baseline", True)
    assert row["syncs"] is None and row["tokens_per_s"] > 0  # syncs are counted on CUDA only
