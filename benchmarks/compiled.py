"""Eager vs compiled (inductor, per block) training steps of baseline, unified, no_scale and the plain Llama.

Issue 24, item 4. Every variant below is one training step (``overhead.py``'s ``PlainStep``: forward,
cross-entropy (+ MoE aux losses), backward, grad-norm clip 1.0, AdamW with the library's parameter groups,
LR schedule, ``zero_grad``); compiled variants compile each block with inductor exactly as training does
(``parallelize(model, None, ParallelOptions(), compile=True)``: ``block.compile()``), the plain Llama
(``benchmarks/plain_llama.py``) gets the same per-block ``compile()``. Two families:

* ``dense``: recipes/smoke.yaml's model (batch 16 x 128): baseline, unified, no_scale, plain_llama;
* ``moe``: recipes/moe_smoke.yaml's model (8 experts, top-2; batch 16 x 128): baseline, unified, no_scale.

All variants of a family, eager and compiled, run interleaved in one process (A B C D ... per round, the
order rotating each round). Per round the ratios of interest are taken (compiled/eager of each preset,
compiled preset / compiled baseline, compiled baseline / compiled plain_llama); the tables give their median
and interquartile range over the rounds (warm-up rounds dropped). Memory: the bytes autograd saves for the
backward in one step (``overhead.saved_bytes``: distinct storages, parameters excluded), deterministic.

Targets (issue 24): compiled baseline ≤ 1.02× compiled plain_llama; compiled unified ≤ 1.02× compiled
baseline in time and ≤ 1.01× in saved bytes; every preset's compiled step ≤ its eager step. A time target
is judged on the median per-round ratio: "met" when the upper end of its 95% confidence interval is within
the target, "missed" when the lower end is past it, "unresolved" when the interval straddles it (the noise
cannot decide). The interval is distribution-free (order statistics of the rounds: the ranks
``n/2 ∓ 1.96·√n/2``), so it narrows with more rounds; the IQR is printed beside it as the spread of single
rounds, which does not.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compiled.py --rounds 60
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compiled.py --family dense --rounds 100 --json out.json

Imports the library; the library must not import this file.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_steps import (ROOT, PlainStep, ReferenceStep, batches, build_module, interleaved_times, machine,  # noqa: E402
                         quartiles, saved_bytes)

PRESETS = ["baseline", "unified", "no_scale"]


def family_config(family: str) -> dict:
    if family == "dense":
        return {"seq_len": 128}
    moe = yaml.safe_load((ROOT / "recipes" / "moe_smoke.yaml").read_text())["model"]["config"]
    return dict(moe, seq_len=128)


def compile_blocks(model: torch.nn.Module) -> None:
    """Each block compiled with inductor, the training path (``parallelize(..., compile=True)``)."""
    from scalevec_lit.lit.parallel import ParallelOptions, parallelize

    parallelize(model, None, ParallelOptions(), compile=True)


def build_steps(family: str, data_dir: str) -> dict:
    config = family_config(family)
    steps = {}
    for p in PRESETS:
        for mode in ("eager", "compiled"):
            step = PlainStep(build_module(p, data_dir, seed=0, config=config))
            if mode == "compiled":
                compile_blocks(step.module.model)
            steps[f"{p}/{mode}"] = step
    if family == "dense":
        for mode in ("eager", "compiled"):
            step = ReferenceStep(steps["baseline/eager"].module)
            if mode == "compiled":
                compile_blocks(step.model)
            steps[f"plain_llama/{mode}"] = step
    return steps


def comparisons(family: str) -> list[tuple]:
    """(label, numerator, denominator, time target or None[, saved-bytes target])."""
    rows = [(f"{p} compiled / eager", f"{p}/compiled", f"{p}/eager", 1.0) for p in PRESETS]
    if family == "dense":
        rows.append(("plain_llama compiled / eager", "plain_llama/compiled", "plain_llama/eager", None))
        rows.append(("baseline / plain_llama, compiled", "baseline/compiled", "plain_llama/compiled", 1.02))
        rows.append(("baseline / plain_llama, eager", "baseline/eager", "plain_llama/eager", None))
    rows.append(("unified / baseline, compiled", "unified/compiled", "baseline/compiled", 1.02, 1.01))
    rows.append(("unified / baseline, eager", "unified/eager", "baseline/eager", None))
    rows.append(("no_scale / baseline, compiled", "no_scale/compiled", "baseline/compiled", None))
    return rows


def median_ci(xs: list[float], z: float = 1.959964) -> tuple[float, float]:
    """A distribution-free 95% confidence interval of the median: the order statistics of ranks
    ``⌊n/2 − z√n/2⌋`` and ``⌈1 + n/2 + z√n/2⌉`` (1-based, clamped to the sample)."""
    v = sorted(xs)
    n = len(v)
    if n < 2:
        return float("nan"), float("nan")
    half = z * math.sqrt(n) / 2
    lo = max(1, math.floor(n / 2 - half))
    hi = min(n, math.ceil(1 + n / 2 + half))
    return v[lo - 1], v[hi - 1]


def verdict(ci: tuple[float, float], target: float | None) -> str:
    """Met when the median's confidence interval lies within the target, missed when it lies past it,
    unresolved otherwise (the noise cannot decide)."""
    if target is None:
        return "—"
    lo, hi = ci
    if hi <= target:
        return f"met (≤ {target:.2f}×)"
    if lo > target:
        return f"missed (> {target:.2f}×)"
    return f"unresolved (CI straddles {target:.2f}×)"


def bench(family: str, data_dir: str, rounds: int, warmup: int) -> dict:
    data = batches(data_dir, 16, 8, seq_len=128)
    t0 = time.perf_counter()
    steps = build_steps(family, data_dir)
    names = list(steps)
    for name in names:  # compile here, not inside the timed rounds
        t = time.perf_counter()
        steps[name](data[0])
        steps[name](data[1])
        print(f"# {family} {name}: first two steps {time.perf_counter() - t:.1f} s", flush=True)
    times = interleaved_times(steps, names, data, rounds, warmup)
    out: dict = {"variants": {}, "ratios": {}, "wall_s": None}
    for n in names:
        saved, per_tb = saved_bytes(steps[n], data[0])
        out["variants"][n] = {"median_step_s": quartiles(times[n])[1] if len(times[n]) > 1 else float("nan"),
                              "step_s_q": quartiles(times[n]), "saved_bytes": saved, "saved_per_token_block": per_tb}
    for label, a, b, target, *mem_target in comparisons(family):
        ratios = [x / y for x, y in zip(times[a], times[b])]
        q, ci = quartiles(ratios), median_ci(ratios)
        mem = out["variants"][a]["saved_bytes"] / out["variants"][b]["saved_bytes"]
        mem_verdict = "—" if not mem_target else ("met" if mem <= mem_target[0] else "missed") + f" (≤ {mem_target[0]:.2f}×)"
        out["ratios"][label] = {"time_ratio_q": q, "time_ratio_ci95": ci, "saved_ratio": mem, "target": target,
                                "verdict": verdict(ci, target), "saved_verdict": mem_verdict}
    out["wall_s"] = time.perf_counter() - t0
    return out


def print_family(family: str, res: dict) -> None:
    print(f"\n**{family}** — per variant (step time over the rounds: median, IQR; saved for backward)\n")
    print("| variant | median step | step IQR | saved for backward | saved per token per block |")
    print("|---|---|---|---|---|")
    for n, r in res["variants"].items():
        lo, med, hi = r["step_s_q"]
        print(f"| {n} | {med * 1e3:.1f} ms | {lo * 1e3:.1f}–{hi * 1e3:.1f} ms | {r['saved_bytes'] / 2**20:.3f} MiB | "
              f"{r['saved_per_token_block']:,.0f} B |")
    print("\n| per-round ratio | time: median [95% CI] | IQR | time target | saved-bytes ratio | saved target |")
    print("|---|---|---|---|---|---|")
    for label, r in res["ratios"].items():
        lo, med, hi = r["time_ratio_q"]
        clo, chi = r["time_ratio_ci95"]
        print(f"| {label} | {med:.3f}× [{clo:.3f}, {chi:.3f}] | {lo:.3f}–{hi:.3f} | {r['verdict']} | "
              f"{r['saved_ratio']:.4f}× | {r['saved_verdict']} |", flush=True)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=["dense", "moe", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=str(ROOT / "data" / "prepared" / "shakespeare"))
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = {"command": "python benchmarks/compiled.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
              "rounds": args.rounds, "warmup": args.warmup}
    print(f"# {result['command']}\n# {result['date']}; {result['machine']}; batch 16 x 128 tokens", flush=True)
    for family in (["dense", "moe"] if args.family == "both" else [args.family]):
        result[family] = bench(family, args.data_dir, args.rounds, args.warmup)
        print_family(family, result[family])
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
