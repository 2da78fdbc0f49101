"""The GPU path on CPU: every preset's block compiled whole, and compiled numerics.

1. Graph capture (``aot_eager``: Dynamo + AOTAutograd, no code generation) of every preset in
   ``recipes/strategy/`` (globbed: a new preset is covered without editing this file), dense and MoE, in
   fp32 and bf16 (autocast), activation checkpointing on and off, forward and backward, through
   ``parallelize`` exactly as training compiles the blocks, with ``fullgraph=True``: a graph break is an
   error. Dynamo runs with ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops`` off, so a host
   read (``.item()``, ``.tolist()``, ``nonzero``, ``bincount``: a host-device sync on a GPU) is a break too.
   The compiled logits and gradients equal eager ones within ``tolerance``.
2. Inductor (what ``compile: true`` runs) on a few presets that cover every fused function: logits and
   gradients within ``tolerance`` of eager.
3. bf16 autocast against a float64 reference, the fused functions' autocast branches included, within
   bounds derived from bf16's unit roundoff and the reduction sizes.

Tolerances. ``u = eps / 2`` of the dtype (fp32 2⁻²⁴, bf16 2⁻⁸). Two fp32 evaluations of the same function
that differ in operation order (a compiler's fusion and reduction order) differ per element by at most
``K u Σ|terms|`` for a reduction of length ``K`` (the classic dot-product bound ``γ_K``); the test asks
``max|a − b| ≤ K u · max|b|`` per tensor, with ``K`` the model's longest reduction (measured: about 16 u).
"""
from __future__ import annotations

import copy
import functools
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
from scalevec_lit.scale import group_norm_rope, scale_parameters, scaled_linear

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = sorted((ROOT / "recipes" / "strategy").glob("*.yaml"))
IDS = [p.stem for p in PRESETS]
VOCAB, T, B = 128, 16, 2


def strategy(path: Path, **overrides):
    strat = yaml.safe_load(path.read_text())["model"]["strategy"]
    return strategy_from_dict({**strat, **overrides})


def tiny(moe: MoEConfig | None = None, n_layer: int = 1):
    return tiny_config(vocab_size=VOCAB, seq_len=T, n_layer=n_layer, moe=moe)


@torch.no_grad()
def perturb(model: torch.nn.Module) -> None:
    """Scale vectors away from their init (γ = 1 hides a scale applied twice or not at all)."""
    for sp in scale_parameters(model):
        sp.param.add_(0.3 * torch.randn_like(sp.param))


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def longest_reduction(model: Transformer) -> int:
    c = model.config
    f = c.moe.expert_intermediate_size if c.moe is not None else c.intermediate_size
    return max(c.n_embd, c.intermediate_size, f, T, B * T)


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


@pytest.fixture()
def strict_dynamo():
    """A fresh Dynamo for each case, any host read a graph break."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        yield torch._dynamo.utils.counters
    torch._dynamo.reset()


def compiled_step(model: Transformer, bf16: bool, checkpointing: bool, counters, backend: str = "aot_eager"):
    """The training path: ``parallelize`` (AC, then per-block compile, ``fullgraph=True``); one step, against
    the same model in eager mode (no AC). Returns (compiled, eager) logits and gradients."""
    perturb(model)
    eager = copy.deepcopy(model)
    parallelize(model, None, ParallelOptions(activation_checkpointing=checkpointing), compile=True,
                compile_options=dict(backend=backend, fullgraph=True))
    idx = torch.randint(0, VOCAB, (B, T + 1))
    got = step(model, idx, bf16)
    assert counters["stats"]["unique_graphs"] >= 1, "no block was compiled"
    assert not counters["graph_break"], dict(counters["graph_break"])
    return got, step(eager, idx, bf16), (step(eager, idx, False) if bf16 else None)


def assert_close(got, want, tol: float) -> None:
    (logits, grads), (ref_logits, ref_grads) = got, want
    assert rel_err(logits, ref_logits) <= tol, (rel_err(logits, ref_logits), tol)
    assert len(grads) == len(ref_grads)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert (g is None) == (r is None), i
        if r is not None:
            assert rel_err(g, r) <= tol, (i, rel_err(g, r), tol)


# -- 1. every preset compiles whole (aot_eager, fullgraph) ----------------------------------------------------
# Each preset in fp32 and in bf16, one of them with activation checkpointing: every preset is compiled with AC
# on and off and in both dtypes, and across presets every (dtype, AC) pair occurs (a pairwise design: the
# full product costs twice the time for combinations that share their code).
CASES = [(p, bf16, (i + bf16) % 2 == 1) for i, p in enumerate(PRESETS) for bf16 in (False, True)]
CASE_IDS = [f"{p.stem}-{'bf16' if bf16 else 'fp32'}-{'ac' if ac else 'no_ac'}" for p, bf16, ac in CASES]


def check_compiled(model: Transformer, bf16: bool, checkpointing: bool, counters) -> None:
    """fp32: compiled = eager within ``K u``. bf16: each tensor's error against the fp32 eager step is at most
    twice eager bf16's own or ``√K u`` (the probabilistic bound of a K-term reduction in bf16; a scalar
    magnitude's gradient, a sum with cancellation, can be 6 u off in one and 0.1 u in the other): compiled
    bf16 is as accurate as eager bf16."""
    got, want, ref = compiled_step(model, bf16, checkpointing, counters)
    if not bf16:
        return assert_close(got, want, longest_reduction(model) * unit_roundoff(torch.float32))
    u = unit_roundoff(torch.bfloat16)
    floor = longest_reduction(model) ** 0.5 * u
    pairs = [(got[0], want[0], ref[0]), *zip(got[1], want[1], ref[1])]
    for i, (g, w, r) in enumerate(pairs):
        assert (g is None) == (r is None), i
        if r is not None:
            assert rel_err(g, r) <= max(2 * rel_err(w, r), floor), (i, rel_err(g, r) / u, rel_err(w, r) / u)


@pytest.mark.parametrize("preset, bf16, checkpointing", CASES, ids=CASE_IDS)
def test_dense_block_compiles_whole(preset, bf16, checkpointing, strict_dynamo):
    check_compiled(Transformer(tiny(), strategy(preset)), bf16, checkpointing, strict_dynamo)


def moe_options(i: int, branch_specific: bool) -> dict:
    """The i-th preset's MoE variant: i runs through the 8 combinations of scales (shared, expert),
    bias_balancing and shared experts (``scales: expert`` cannot go with branch-specific scales: shared there)."""
    return dict(num_experts=4, top_k=2, expert_intermediate_size=64,
                scales="expert" if i % 2 and not branch_specific else "shared",
                bias_balancing=bool(i // 2 % 2), num_shared_experts=i // 4 % 2)


MOE_IDS = [f"{i}-{cid}" for i, cid in enumerate(CASE_IDS)]


@pytest.mark.parametrize("index, case", list(enumerate(CASES)), ids=MOE_IDS)
def test_moe_block_compiles_whole(index, case, strict_dynamo):
    preset, bf16, checkpointing = case
    strat = strategy(preset)
    options = moe_options(index // 2, strat.branch_specific)
    model = Transformer(tiny(MoEConfig(**options)), strat)
    model.train()
    check_compiled(model, bf16, checkpointing, strict_dynamo)
