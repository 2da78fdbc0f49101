"""Overhead of ScaleVectorMonitor on the smoke model's training step (target: under 2% at every_n_steps=50).

Interleaved blocks of ``every`` optimizer steps, one without the monitor (A) and one with it (B; exactly
one log per block, histograms every ``hist`` monitored steps, a TensorBoard writer to a temporary folder),
in the order AB, BA, AB, ... so that slow drifts of the machine cancel. Each round gives the ratio
t(B block) / t(A block); the result is the median ratio over the rounds. It also times the log call alone
(median), which gives a second, lower-noise estimate: t_log / (every × t_step).

    .venv/bin/python benchmarks/monitor_overhead.py                     # smoke model, N=50, 30 rounds
    .venv/bin/python benchmarks/monitor_overhead.py --strategy unified  # many more scale vectors
    .venv/bin/python benchmarks/monitor_overhead.py --device cuda       # on a GPU machine

Plain torch training loop (no Lightning), so the ratio is an upper bound: Lightning's own per-step work
only makes the monitor's share smaller. Imports the monitor and the model; nothing of scalevec_lit.lit.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalevec_lit.callbacks import ScaleVectorMonitor  # noqa: E402
from scalevec_lit.model import TransformerConfig  # noqa: E402
from scalevec_lit.model.transformer import Transformer  # noqa: E402
from scalevec_lit.scale import MagnitudeDirectionScale, PlainScale  # noqa: E402
from scalevec_lit.scale.registry import scale_parameters  # noqa: E402
from scalevec_lit.scale.strategy import ScaleStrategy  # noqa: E402

STRATEGIES = {
    "baseline": ScaleStrategy(),  # what recipes/smoke.yaml trains
    "unified": ScaleStrategy(vector=MagnitudeDirectionScale, branch_specific=True,
                             placement=dict(q="dual_norm", k="dual_norm")),
    "qk_norm": ScaleStrategy(vector=PlainScale, placement=dict(q="dual_norm", k="dual_norm"), output_shape="head"),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=50, help="ScaleVectorMonitor.every_n_steps (block length)")
    ap.add_argument("--hist", type=int, default=250, help="ScaleVectorMonitor.histogram_every_n_steps")
    ap.add_argument("--rounds", type=int, default=30, help="AB pairs of blocks")
    ap.add_argument("--strategy", choices=sorted(STRATEGIES), default="baseline")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    # the smoke recipe's model (recipes/smoke.yaml) with the embedded tokenizer's vocabulary
    config = TransformerConfig(vocab_size=4096, seq_len=128, n_layer=4, n_embd=128, n_head=4, n_kv_head=2)
    torch.manual_seed(0)
    model = Transformer(config, STRATEGIES[args.strategy]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    batch = torch.randint(0, config.vocab_size, (args.batch_size, config.seq_len + 1), device=device)

    def step() -> None:
        logits = model(batch[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    from torch.utils.tensorboard import SummaryWriter

    tmp = tempfile.TemporaryDirectory()
    writer = SummaryWriter(tmp.name)
    monitor = ScaleVectorMonitor(every_n_steps=args.every, histogram_every_n_steps=args.hist)
    monitored = 0  # steps taken with the monitor on (its own step counter)
    log_times: list[float] = []

    def block(with_monitor: bool) -> float:
        nonlocal monitored
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(args.every):
            step()
            if with_monitor:
                monitored += 1
                if monitored % monitor.every_n_steps == 0:
                    t = time.perf_counter()
                    monitor.log_model(model, monitored, writer)
                    _sync(device)
                    log_times.append(time.perf_counter() - t)
        _sync(device)
        return time.perf_counter() - t0

    t = time.perf_counter()
    monitor.log_model(model, 0, writer)  # first log: matplotlib import and figure build, once per run
    first_log = time.perf_counter() - t
    for _ in range(3):
        step()

    ratios, a_times, b_times = [], [], []
    for r in range(args.rounds):
        if r % 2 == 0:
            ta, tb = block(False), block(True)
        else:
            tb, ta = block(True), block(False)
        a_times.append(ta)
        b_times.append(tb)
        ratios.append(tb / ta)
        print(f"round {r + 1:3d}/{args.rounds}: without {ta:7.3f} s  with {tb:7.3f} s  ratio {tb / ta:.4f}", flush=True)
    writer.close()

    t_step = statistics.median(a_times) / args.every
    t_log = statistics.median(log_times)
    n_params = sum(1 for _ in scale_parameters(model))
    rows = [
        ("strategy", args.strategy),
        ("scale parameters", str(n_params)),
        ("every_n_steps / histogram_every_n_steps", f"{args.every} / {args.hist}"),
        ("rounds (AB pairs of blocks)", str(args.rounds)),
        ("device, threads", f"{device}, {torch.get_num_threads()}"),
        ("median step without monitor", f"{1000 * t_step:.1f} ms"),
        ("median block without / with monitor", f"{statistics.median(a_times):.3f} s / {statistics.median(b_times):.3f} s"),
        ("first log (imports, figure build; once)", f"{1000 * first_log:.0f} ms"),
        ("median log call", f"{1000 * t_log:.1f} ms"),
        ("overhead from the log call: t_log / (N t_step)", f"{100 * t_log / (args.every * t_step):.2f} %"),
        ("median per-round ratio with / without", f"{statistics.median(ratios):.4f}"),
        ("ratio quartiles", " / ".join(f"{q:.4f}" for q in statistics.quantiles(ratios, n=4))),
    ]
    width = max(len(k) for k, _ in rows)
    print("\nScaleVectorMonitor overhead")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")


if __name__ == "__main__":
    main()
