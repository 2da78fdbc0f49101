"""A direction-only γ in front of a per-head norm (issue 36 item 3): γ's size is seen only through the norm's ε,
exactly as ``DirectionScale``'s and ``ScaleStrategy.magnitude_before_norm``'s docstrings say. Scaling the product
W diag γ of q and k by c (γ of size c) multiplies each head's normalized output by √((m + ε)/(m + ε/c²)), m that
head's mean square before the norm: a change that is not zero and stays below ε (1 − 1/c²)/(2 m).
"""
from __future__ import annotations

import torch

from helpers import ROOT, tiny_config
from scalevec_lit.hub.convert import read_strategy
from scalevec_lit.model import Transformer
from scalevec_lit.scale import DirectionScale

C = 3.0
EPS64 = torch.finfo(torch.float64).eps


def test_the_size_of_a_direction_scale_is_seen_only_through_eps():
    torch.manual_seed(0)
    strategy = read_strategy(ROOT / "recipes" / "strategy" / "unified.yaml", 1e-6)
    model = Transformer(tiny_config(vocab_size=128, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48),
                        strategy).double().eval()
    site = model.blocks[0].attn.input
    assert all(type(g.vector) is DirectionScale for g in site.input_scales() if set(g.branches) <= {"q", "k"})
    x = torch.randn(2, 8, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rope = (model.rope_cos[:8], model.rope_sin[:8])
    idx = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before, logits = site(x, rope=rope), model(idx)
        xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + site.eps)
        pre = {b: torch.nn.functional.linear(xhat * site.gamma(b), site.weight(b)) for b in ("q", "k")}
        for b in ("q", "k"):
            site.weight(b).mul_(C)  # W diag(c γ) = (c W) diag γ: γ of size c
        after, moved_logits = site(x, rope=rope), model(idx)
    bounds = []
    for i, b in enumerate(("q", "k")):
        m = pre[b].unflatten(-1, (-1, model.config.head_dim)).pow(2).mean(-1, keepdim=True)  # per head and token
        ratio = torch.sqrt((m + site.eps) / (m + site.eps / C**2))
        want = before[i].unflatten(-1, (-1, model.config.head_dim)) * ratio
        got = after[i].unflatten(-1, (-1, model.config.head_dim))
        assert float((got - want).abs().max()) <= 64 * EPS64 * float(want.abs().max())  # the formula, exactly
        change = float((got - before[i].unflatten(-1, (-1, model.config.head_dim))).abs().max()
                       / before[i].abs().max())
        bound = site.eps * (1 - 1 / C**2) / (2 * float(m.min()))
        assert 0.0 < change <= bound * (1 + 1e-9) and bound < 1e-3  # seen, and only through ε
        bounds.append(bound)
    assert torch.equal(after[2], before[2])  # v reads its own γ, untouched
    rel = float((moved_logits - logits).abs().max() / logits.abs().max())
    # each attention logit q·k moves by at most (1 + δ_q)(1 + δ_k) − 1 ≈ δ_q + δ_k; the rest of the model passes it on
    assert 0.0 < rel <= 4 * max(bounds)  # the logits move too: not invisible, tiny (observed 9.8e-6 here)
