"""The per-head q/k norm, output scale and RoPE of a ``dual_norm`` placement, alone: time and saved bytes.

Three ways of computing ``RoPE(u ⊙ a / RMS_head(a))`` (forward and backward) over the q and k columns of
a fused q/k/v output ``[B, T, (H + 2K) · head_dim]``, interleaved in one process (the order rotates each
round; the median of per-round ratios over ``--rounds``, with its interquartile range):

- ``rope_only``: what the baseline does with q and k (RoPE by autograd, no norm, no u): the reference,
  i.e. the norm's *extra* cost is ``t(way) − t(rope_only)``;
- ``composition``: the plain autograd composition (``F.rms_norm`` per head, ``* u``, RoPE);
- ``library``: ``scalevec_lit.scale.group_norm_rope`` (the autograd function the model uses).

Saved bytes: distinct storages autograd keeps for the backward, per token, beyond the input ``a`` (the
matmul that produced it keeps it) and the output (SDPA keeps q and k): what the step adds to a layer. One thread by default (``--threads``).

    .venv/bin/python benchmarks/norm_rope.py                       # d256's attention: 8 x 256, 4 + 4 heads of 64
    .venv/bin/python benchmarks/norm_rope.py --batch 16 --seq 128 --heads 4 --kv-heads 4 --head-dim 32   # smoke
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalevec_lit.model.rope import rope_tables  # noqa: E402
from scalevec_lit.scale import apply_rope, group_norm_rope  # noqa: E402


def _composition(a, u, cos, sin, eps):
    n = F.rms_norm(a, (a.shape[-1],), eps=eps)
    return apply_rope(n * u, cos, sin)


WAYS = {
    "rope_only": lambda a, u, cos, sin, eps: apply_rope(a, cos, sin),
    "composition": _composition,
    "library": lambda a, u, cos, sin, eps: group_norm_rope(a, u, eps, cos, sin),
}


def one_step(way: str, fused: torch.Tensor, u: torch.Tensor, width: int, group: int, cos, sin, count=None):
    """Forward and backward of ``way`` over the first ``width`` columns of a fresh leaf copy of ``fused``."""
    x = fused.detach().clone().requires_grad_()
    uu = u.detach().clone().requires_grad_()
    a = x[..., :width].unflatten(-1, (-1, group))
    if count is None:
        y = WAYS[way](a, uu, cos, sin, 1e-6)
    else:
        fixed = {x.untyped_storage().data_ptr(), uu.untyped_storage().data_ptr(),
                 cos.untyped_storage().data_ptr(), sin.untyped_storage().data_ptr()}

        def pack(t):
            if t.untyped_storage().data_ptr() not in fixed:
                count[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = WAYS[way](a, uu, cos, sin, 1e-6)
        count.pop(y.untyped_storage().data_ptr(), None)  # attention saves q and k itself: not an extra
    y.backward(torch.ones_like(y))
    return x.grad, uu.grad


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, T, hd = args.batch, args.seq, args.head_dim
    width = (args.heads + args.kv_heads) * hd
    fused = torch.randn(B, T, width + args.kv_heads * hd)  # q | k | v
    u = torch.rand(width // hd, hd) + 0.5
    cos, sin = rope_tables(T, hd, 10000.0)

    # the three agree (library vs composition in float64, so that only the formulas are compared)
    g64 = [one_step(w, fused.double(), u.double(), width, hd, cos.double(), sin.double()) for w in ("composition", "library")]
    err = max(((p - q).abs().max() / q.abs().max()).item() for p, q in zip(*g64))

    times: dict[str, list[float]] = {w: [] for w in WAYS}
    ways = list(WAYS)
    for r in range(args.warmup + args.rounds):
        for w in ways[r % 3:] + ways[: r % 3]:
            t0 = time.perf_counter()
            one_step(w, fused, u, width, hd, cos, sin)
            if r >= args.warmup:
                times[w].append(time.perf_counter() - t0)
    saved = {}
    for w in WAYS:
        count: dict[int, int] = {}
        one_step(w, fused, u, width, hd, cos, sin, count)
        saved[w] = sum(count.values())

    def q(xs):
        qs = statistics.quantiles(xs, n=4)
        return qs[0], statistics.median(xs), qs[2]

    tokens = B * T
    ref = times["rope_only"]
    print(f"# python benchmarks/norm_rope.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# batch {B} x {T}, q {args.heads} + k {args.kv_heads} heads of {hd}, {args.threads} thread(s), "
          f"{args.rounds} rounds; library vs composition in float64: max relative gradient difference {err:.1e}\n")
    print("| way | median fwd+bwd | vs rope_only (median of per-round ratios, IQR) | extra over rope_only | extra saved per token |")
    print("|---|---|---|---|---|")
    out = {"gradient_rel_diff_float64": err}
    for w in WAYS:
        lo, med, hi = q([a / b for a, b in zip(times[w], ref)])
        extra = statistics.median(times[w]) - statistics.median(ref)
        print(f"| {w} | {statistics.median(times[w]) * 1e3:.2f} ms | {med:.3f}× ({lo:.3f}–{hi:.3f}) | "
              f"{extra * 1e3:+.2f} ms | {saved[w] / tokens:,.0f} B |")
        out[w] = {"median_s": statistics.median(times[w]), "ratio_q": (lo, med, hi), "saved_bytes": saved[w]}
    return out


if __name__ == "__main__":
    main()
