"""Training stall per checkpoint save: synchronous against asynchronous (``SafeModelCheckpoint(async_save: true)``).

A plain torch training loop (a stack of Linear layers, AdamW, one intra-op thread) whose checkpoint
(weights + two AdamW moments, fp32) takes seconds to write, saved through ``SafeCheckpointIO`` exactly as
a one-process run saves it (``<name>.tmp``, fsync, rename), every ``--every`` steps, into ``--dir``.
Rounds alternate sync and async (S A S A ...) in the same process, so drifts of a shared machine hit both.
Per round and mode:

- **stall** (the headline): how long the training thread waits inside the save call, per save (sync: the
  whole write; async: the copy of the state in memory, plus any wait for the previous write);
- **wall overhead**: the round's wall time minus the same number of steps without saving (measured in the
  round), per save: it adds the writer thread's competition for the CPU (async) and any wait for the last
  write at the end of the round (``--every`` steps follow it), but on a shared machine it carries the
  noise of two separate runs of many steps.

Prints a table (medians over rounds) and the sync/async ratio of the stall.

    .venv/bin/python benchmarks/checkpoint_stall.py                  # ~390 MiB checkpoint, 3 rounds
    .venv/bin/python benchmarks/checkpoint_stall.py --layers 16 --every 50 --rounds 5   # ~770 MiB
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks.checkpoint import SafeCheckpointIO  # noqa: E402


def build(width: int, layers: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def step(model, opt, x) -> None:
    loss = F.mse_loss(model(x), x)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def run(model, opt, x, steps: int, every: int, io, folder: Path) -> tuple[float, list[float]]:
    """Wall time of ``steps`` steps saving every ``every`` (none if ``io`` is None), and the time blocked per save."""
    blocked = []
    start = time.perf_counter()
    for i in range(1, steps + 1):
        step(model, opt, x)
        if io is not None and i % every == 0 and i < steps:
            t = time.perf_counter()
            io.save_checkpoint({"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()],
                                "global_step": i}, folder / f"step{i:06d}.ckpt")
            blocked.append(time.perf_counter() - t)
    if io is not None:
        io.writer.wait()  # the run is not done before its last checkpoint is
    return time.perf_counter() - start, blocked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8, help="Linear layers (default: 8 × 2048² ≈ 34M parameters)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (cheap steps; the checkpoint's size is "
                    "the model's)")
    ap.add_argument("--every", type=int, default=10, help="save every N steps (make N steps outlast one write: "
                    "an asynchronous save waits for the write before it)")
    ap.add_argument("--saves", type=int, default=3, help="saves per round and mode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary folder here)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, opt = build(args.width, args.layers)
    x = torch.randn(args.batch, args.width)
    step(model, opt, x)  # AdamW's moments exist: the checkpoint has its full size
    params = sum(p.numel() for p in model.parameters())
    saves = args.saves
    args.steps = args.every * (saves + 1)  # N steps after the last save: its write overlaps them too
    rows = {"sync": {"blocked": [], "stall": [], "step": []}, "async": {"blocked": [], "stall": [], "step": []}}
    with tempfile.TemporaryDirectory(dir=args.dir or ".", prefix="checkpoint_stall.") as tmp:
        folder = Path(tmp)
        size = None
        for r in range(args.rounds):
            for mode in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
                base, _ = run(model, opt, x, args.steps, args.every, None, folder)
                io = SafeCheckpointIO(async_save=(mode == "async"))
                wall, blocked = run(model, opt, x, args.steps, args.every, io, folder)
                size = size or (folder / f"step{args.every:06d}.ckpt").stat().st_size
                for p in folder.glob("*.ckpt"):
                    p.unlink()
                rows[mode]["blocked"].append(statistics.median(blocked))
                rows[mode]["stall"].append((wall - base) / saves)
                rows[mode]["step"].append(base / args.steps)
                print(f"round {r + 1}/{args.rounds} {mode:5s}: stall {statistics.median(blocked):6.2f} s per save, "
                      f"wall overhead {(wall - base) / saves:6.2f} s per save", flush=True)
    med = {m: {k: statistics.median(v) for k, v in d.items()} for m, d in rows.items()}
    print(f"\n{params:,} parameters, checkpoint {size / 2**20:,.0f} MiB, save every {args.every} steps "
          f"({saves} per round), {args.rounds} rounds interleaved; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}, one intra-op thread")
    print("| mode | step (no save) | stall per save (training waits) | wall overhead per save |")
    print("|---|---|---|---|")
    for mode in ("sync", "async"):
        m = med[mode]
        print(f"| {mode} | {m['step']:.3f} s | {m['blocked']:.2f} s | {m['stall']:.2f} s |")
    print(f"stall ratio sync/async: {med['sync']['blocked'] / max(med['async']['blocked'], 1e-9):.1f}× "
          f"(wall overhead: {med['sync']['stall'] / max(med['async']['stall'], 1e-9):.1f}×)")


if __name__ == "__main__":
    main()
