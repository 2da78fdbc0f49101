"""What a compiled block keeps for the backward, and the zero-``u`` case that decides it.

``group_norm_rope`` (``scale/norm_rope.py``) keeps only its output, which attention keeps anyway, and recovers the
normalized input from it by dividing by the output scale ``u``. A ``u_j`` exactly 0 cannot be divided by, so
then the normalized input is kept as well. Inside a compiled block that check would break the graph;
``Transformer.forward`` makes it before each compiled block and hands it in as a constant
(``scale/zero_check.py``). These tests hold the two halves together:

- with an exact zero in ``u``, compiled gradients are as accurate as eager ones against float64, whether
  the zero is there from the start, appears between two steps (the graph is specialized again), or the
  compiled block is called on its own (no check made: the normalized input is kept);
- with inductor (what ``compile: true`` runs), compiled unified keeps no second q/k-sized tensor: its
  saved bytes exceed compiled baseline's by less than half of q and k (before the fix: by all of them).
"""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import ROOT, saved_storages
from scalevec_lit.lit.parallel import ParallelOptions, parallelize
from scalevec_lit.model import Transformer
from scalevec_lit.scale import NormSite
from test_compile import (B, T, VOCAB, aot_eager_without_host_reads, assert_as_accurate, perturb, step,  # noqa: F401
                          strategy, strict_dynamo, tiny)

# slow: every test traces with dynamo (a few seconds each) or compiles C++ kernels with inductor
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]
UNIFIED = ROOT / "recipes" / "strategy" / "unified.yaml"


def q_scale(model: Transformer):
    """The output scale ``u`` of the first layer's queries (unified: ``dual_norm``, per head)."""
    site = next(m for m in model.modules() if isinstance(m, NormSite) and "q" in m.by_name)
    vec = site.output_vector("q")
    assert vec is not None and not vec.is_identity
    return vec


@torch.no_grad()
def zero_one_channel(model: Transformer, j: int = 3) -> None:
    vec = q_scale(model)
    gamma = vec().clone()
    gamma[j] = 0.0
    assert vec.set_gamma_(gamma)
    assert vec()[j].item() == 0.0 and bool(vec().ne(0).sum() == gamma.numel() - 1)


def compiled(model: Transformer) -> Transformer:
    parallelize(model, None, ParallelOptions(), compile=True,
                compile_options=dict(backend=aot_eager_without_host_reads, fullgraph=True))
    return model


def test_exact_zero_in_u_from_the_start(strict_dynamo):
    model = Transformer(tiny(), strategy(UNIFIED))
    perturb(model)
    zero_one_channel(model)
    eager, exact = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled(model)
    idx = torch.randint(0, VOCAB, (B, T + 1))
    got = step(model, idx, False)
    assert not strict_dynamo["graph_break"]
    assert_as_accurate(model, False, got, step(eager, idx, False), step(exact, idx, False))
    assert all(p.grad is not None for p in q_scale(model).parameters())


def test_exact_zero_in_u_appearing_between_steps(strict_dynamo):
    """First step: no zero (the graph that recovers the normalized input); then a zero: a second graph
    (the guard on the check), and its gradients exact; one block, so two graphs in all."""
    model = Transformer(tiny(n_layer=1), strategy(UNIFIED))
    perturb(model)
    eager, exact = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled(model)
    idx = torch.randint(0, VOCAB, (B, T + 1))
    step(model, idx, False)
    assert strict_dynamo["stats"]["unique_graphs"] == 1
    for m in (model, eager, exact):
        zero_one_channel(m)
    got = step(model, idx, False)
    assert strict_dynamo["stats"]["unique_graphs"] == 2 and not strict_dynamo["graph_break"]
    assert_as_accurate(model, False, got, step(eager, idx, False), step(exact, idx, False))
    step(model, idx, False)  # the flag unchanged: no third graph
    assert strict_dynamo["stats"]["unique_graphs"] == 2


def test_compiled_block_called_on_its_own_keeps_the_normalized_input(strict_dynamo):
    """No ``Transformer.forward`` around it, so no check was made: exact with a zero ``u`` all the same."""
    model = Transformer(tiny(n_layer=1), strategy(UNIFIED))
    perturb(model)
    zero_one_channel(model)
    exact = copy.deepcopy(model).double()
    compiled(model)
    x = torch.randn(B, T, model.config.n_embd)
    grads = []
    for m, dtype in ((model, torch.float32), (exact, torch.float64)):
        m.zero_grad(set_to_none=True)
        xi = x.to(dtype).clone().requires_grad_()
        out = m.blocks[0](xi, m.rope_cos, m.rope_sin)
        out.pow(2).sum().backward()
        grads.append([xi.grad, *(p.grad for p in q_scale(m).parameters())])
    assert all(g is not None for g in grads[0] + grads[1]), [[g is None for g in gs] for gs in grads]
    for g, want in zip(*grads):
        err = ((g.double() - want).abs().max() / want.abs().max()).item()
        assert err < 1e-4, err  # fp32 against float64: a lost channel is off by O(1)


def saved_in_block(model: Transformer, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves while the (only) block runs, parameters excluded."""
    run = lambda: model.blocks[0](x, model.rope_cos, model.rope_sin).sum().backward()  # noqa: E731
    return sum(b for _, b in saved_storages(model, run))


def test_inductor_keeps_no_second_copy_of_q_and_k():
    torch._dynamo.reset()
    config = tiny(n_layer=1)
    saved = {}
    for preset in ("baseline", "unified"):
        model = Transformer(config, strategy(ROOT / "recipes" / "strategy" / f"{preset}.yaml"))
        perturb(model)
        parallelize(model, None, ParallelOptions(), compile=True)  # inductor, as compile: true
        from scalevec_lit.scale.zero_check import check_zero_u_

        check_zero_u_(model.blocks[0])  # what Transformer.forward does before a compiled block
        x = torch.randn(4, T, config.n_embd, requires_grad=True)
        saved_in_block(model, x)  # compiles
        saved[preset] = saved_in_block(model, x)
    torch._dynamo.reset()
    q_and_k = 4 * T * (config.n_head + config.n_kv_head) * config.head_dim * 4  # fp32 bytes
    extra = saved["unified"] - saved["baseline"]
    assert extra < q_and_k / 2, (saved, q_and_k)


# -- the plan's count of what an accelerator keeps, measured on CPU through the same path ----------------------
@pytest.mark.parametrize("preset", ["unified", "unified_dnp_vup"])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_plan_counts_the_normalized_input_kept_on_an_accelerator(preset, moe):
    """On an accelerator ``group_norm_rope`` keeps the normalized input of every branch with a normalized
    output side and a u (``lit/activations.py``, ``accelerator=True``). On CPU it does exactly that when some
    ``u_j`` is 0: with one zero in every such u, the measured bytes equal the accelerator count (1%)."""
    from scalevec_lit.lit.activations import block_saved_per_token
    from scalevec_lit.model.config import MoEConfig
    from scalevec_lit.scale.strategy import has_output_side, normalizes
    from test_plan_memory import MOE, TOLERANCE, _measured_saved
    from helpers import strategy_preset, tiny_config

    config = tiny_config(seq_len=64, vocab_size=256, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=192,
                         moe=MoEConfig(**MOE) if moe else None)
    strat = strategy_preset(preset)
    torch.manual_seed(0)
    model = Transformer(config, strat)
    zeroed = 0
    with torch.no_grad():
        for site in (m for m in model.modules() if isinstance(m, NormSite)):
            for b in site.branches:
                p = site.placement[b.name]
                vec = site.output_vector(b.name)
                if not b.experts and normalizes(p) and has_output_side(p) and vec is not None:
                    gamma = vec().clone()
                    gamma[0] = 0.0
                    assert vec.set_gamma_(gamma)
                    zeroed += 1
    assert zeroed >= config.n_layer
    measured = _measured_saved(model, torch.randint(0, config.vocab_size, (4, config.seq_len)))
    tokens = 4 * config.seq_len
    for layer in range(config.n_layer):
        gpu = tokens * block_saved_per_token(config, strat, layer, 4, n=4, accelerator=True)
        cpu = tokens * block_saved_per_token(config, strat, layer, 4, n=4, accelerator=False)
        assert gpu > cpu
        assert abs(gpu - measured[layer]) <= TOLERANCE * measured[layer], (layer, gpu, cpu, measured[layer])
