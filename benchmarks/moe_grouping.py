"""Eager cost of the MoE layer's device-side grouping against the old ``torch.bincount`` one (CPU).

The layer now takes each expert's row count and the grouped matmul's offsets from the sorted expert ids
(``routing.group_by_expert``: a binary search per expert) instead of ``torch.bincount`` (whose output
size depends on the values: a host sync on a GPU, a graph break under ``torch.compile``). This script
times, interleaved in one process (the order alternates each round, so the machine's drifts hit both
alike), one training step of one MoE layer (forward, the aux losses, backward; train mode, bias
balancing on) with the new grouping and with the old one swapped in (``--grouping old`` patches the
layer's ``group_by_expert`` with a bincount version of the same outputs), and the grouping alone.
Reports medians over the rounds (warm-up rounds dropped) and the median per-round ratio new/old.

    .venv/bin/python benchmarks/moe_grouping.py                       # smoke MoE layer, 200 rounds
    .venv/bin/python benchmarks/moe_grouping.py --tokens 4096 --experts 32 --top-k 4 --rounds 100

Imports the library's model only (no Lightning).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scalevec_lit.model import MoEConfig, TransformerConfig  # noqa: E402
from scalevec_lit.model import moe as moe_module  # noqa: E402
from scalevec_lit.model.routing import Grouping, group_by_expert  # noqa: E402
from scalevec_lit.scale import ScaleStrategy  # noqa: E402


def bincount_grouping(experts: torch.Tensor, num_experts: int) -> Grouping:
    """The old algorithm: the same sort, counts from ``torch.bincount``."""
    k = experts.shape[-1]
    flat = experts.flatten()
    _, order = flat.sort(stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return Grouping(order, order // k, inverse, counts.cumsum(0).to(torch.int32), counts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8 * 128, help="tokens per step (smoke: batch 8 x 128)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=512, seq_len=128, n_layer=4, n_embd=args.dim, n_head=4, n_kv_head=2,
                            moe=MoEConfig(num_experts=args.experts, top_k=args.top_k, bias_balancing=True,
                                          expert_intermediate_size=args.expert_size))
    layer = moe_module.MoE(cfg, 0, ScaleStrategy()).train()
    x = torch.randn(args.tokens, args.dim)
    ids = torch.rand(args.tokens, args.experts).topk(args.top_k, -1).indices

    def layer_step() -> None:
        y = layer(x)
        (y.square().mean() + sum(layer.last_aux_losses.values())).backward()
        layer.zero_grad(set_to_none=True)

    grouping = {"new": group_by_expert, "old": bincount_grouping}
    times: dict[str, list[float]] = {f"{what} {g}": [] for what in ("layer", "grouping") for g in grouping}
    for r in range(args.rounds + args.warmup):
        for name in (("new", "old") if r % 2 else ("old", "new")):
            moe_module.group_by_expert = grouping[name]
            t0 = time.perf_counter()
            layer_step()
            t1 = time.perf_counter()
            grouping[name](ids, args.experts)
            t2 = time.perf_counter()
            if r >= args.warmup:
                times[f"layer {name}"].append(t1 - t0)
                times[f"grouping {name}"].append(t2 - t1)
    moe_module.group_by_expert = group_by_expert
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.tokens} tokens, d={args.dim}, "
          f"E={args.experts}, k={args.top_k}, expert size {args.expert_size}; {args.rounds} interleaved rounds")
    for what in ("layer", "grouping"):
        new, old = times[f"{what} new"], times[f"{what} old"]
        ratio = statistics.median(a / b for a, b in zip(new, old))
        print(f"{what:9s} new {statistics.median(new) * 1e6:9.1f} us   old (bincount) "
              f"{statistics.median(old) * 1e6:9.1f} us   median ratio new/old {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
