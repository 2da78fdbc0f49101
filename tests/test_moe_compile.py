"""The MoE layer compiles whole and reads nothing on the host (``scalevec_lit/model/moe.py``, ``routing.py``,
``experts.py``).

"No host read" is checked on a CPU: with ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops``
off, Dynamo cannot put a data-dependent value (``.item()``, ``.tolist()``, ``nonzero``, ``bincount``'s
size) in a graph, so it breaks the graph there, and ``fullgraph=True`` turns any break into an error. Each
variant (``scales: shared|expert``, bias balancing on/off, shared experts on/off, several placements) is
compiled with the ``aot_eager`` backend (Dynamo + AOTAutograd: the forward and the backward graphs) in
fp32 and under bf16 autocast, with and without activation checkpointing, and three training steps are
compared with eager ones: outputs, every gradient, the aux losses, the load statistics and the balancing
bias (which moves between the steps), within a tolerance derived from the dtype. The new grouping equals
the old one (``torch.bincount``, host-sliced matmuls) exactly, in float64.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo as dynamo
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from helpers import ROOT, tiny_config
from scalevec_lit.model import MoEConfig
from scalevec_lit.model.experts import expert_matmul
from scalevec_lit.model.moe import MoE, group_by_expert
from scalevec_lit.scale import ScaleStrategy, scale_parameters
from test_moe import preset_strategy

pytestmark = pytest.mark.usefixtures("one_thread")

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
    """Any data-dependent value is a graph break, and ``fullgraph=True`` makes a break an error."""
    with dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        dynamo.reset()
        yield
    dynamo.reset()


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
    compiled = torch.compile(wrapped, backend="aot_eager", fullgraph=True)
    xs = [torch.randn(2, 12, 64) for _ in range(3)]
    want = train_steps(eager, eager, xs, dtype)
    got = train_steps(compiled, inner, xs, dtype)
    eps = torch.finfo(dtype).eps
    for step, (a, b) in enumerate(zip(got, want)):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype
            torch.testing.assert_close(a[key], b[key], rtol=16 * eps, atol=16 * eps * b[key].abs().max().item(),
                                       msg=lambda m: f"step {step}, {key}: {m}")
    if variant[1]:
        assert want[0]["bias"].abs().sum() == 0 and any(s["bias"].abs().sum() > 0 for s in want)  # it moved
