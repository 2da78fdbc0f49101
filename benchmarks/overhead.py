"""Overhead of the scale-vector strategies and of Lightning, on the smoke model (recipes/smoke.yaml).

Two measurements, each interleaved in one process so that the machine's drifts hit both sides alike:

1. ``presets``: one training step (forward, cross-entropy, backward, grad-norm clip 1.0, AdamW step with
   the library's parameter groups, LR schedule, ``zero_grad(set_to_none=True)``) of every strategy preset
   in ``recipes/strategy/``, round after round (the order rotates each round); per round the ratio
   t(preset) / t(baseline); the result is the median ratio over the rounds (warm-up rounds dropped), with
   its interquartile range. Peak memory per preset, deterministic: parameter + optimizer-state bytes, plus
   the peak of the running sum of the CPU allocator events that ``torch.profiler`` (``profile_memory=True``)
   records during one training step after warm-up (activations, gradients, temporaries).
2. ``lightning``: the ``CausalLM`` training step under Lightning's ``Trainer`` (TensorBoard logger,
   ``log_every_n_steps=10``, gradient clipping 1.0, no checkpointing or progress bar) vs a plain PyTorch
   loop over the same model (a second copy, same init) and the same data module: a callback, last in
   the list, runs one plain step after each Lightning step (A B A B ...). A Lightning step is the time
   from the end of the previous plain step to the callbacks' ``on_train_batch_end`` (data fetch,
   hooks, logging, optimizer, clipping, schedule); a plain step includes its own data fetch.

    .venv/bin/python benchmarks/overhead.py                          # both, all presets, 150 rounds
    .venv/bin/python benchmarks/overhead.py --only presets --presets baseline unified --rounds 200
    .venv/bin/python benchmarks/overhead.py --only presets --presets baseline unified --reference --shape d256
    .venv/bin/python benchmarks/overhead.py --only lightning --rounds 200 --json out.json

``--shape d256`` times the d = 256, 6-layer, seq 256, batch 8 model instead of the smoke model;
``--reference`` adds ``plain_llama`` (benchmarks/plain_llama.py: fused q/k/v and gate/up, SDPA, the same
shape, init and AdamW) to the interleaved rounds. Besides time and allocator peak, every preset gets the
bytes autograd saves for the backward in one step (distinct storages, parameters excluded): in total and
per token per block (saved while a block runs, over blocks and tokens), the measure that does not depend
on the allocator.

Neither RoleWeightDecay nor ScaleVectorMonitor is attached (see ``benchmarks/monitor_overhead.py`` for the
monitor). Imports the library (model, ``CausalLM``, data module) and Lightning; the library must not
import this file. The step machinery it shares with ``compiled.py`` is ``bench_steps.py``.
"""
from __future__ import annotations
import argparse
import copy
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_steps import (ROOT, SHAPES, PlainStep, ReferenceStep, batches, build_module, interleaved_times,  # noqa: E402
                         machine, quartiles, saved_bytes, state_bytes, step_peak_bytes)

PRESETS = ["baseline", "no_scale", "unit_offset", "hg", "dp", "dnp", "or", "er", "unified", "qk_norm", "sandwich"]


def bench_presets(presets: list[str], data_dir: str, rounds: int, warmup: int, batch_size: int,
                  shape: str = "smoke", reference: bool = False) -> dict:
    if "baseline" not in presets:
        presets = ["baseline", *presets]
    config, default_batch, seq_len = SHAPES[shape]
    batch_size = batch_size or default_batch
    data = batches(data_dir, batch_size, 8, seq_len=seq_len)
    steps = {p: PlainStep(build_module(p, data_dir, config=dict(config, seq_len=seq_len))) for p in presets}
    if reference:
        steps["plain_llama"] = ReferenceStep(steps["baseline"].module)
        presets = [*presets, "plain_llama"]
    times = interleaved_times(steps, presets, data, rounds, warmup)
    out = {}
    for p in presets:
        ratios = [a / b for a, b in zip(times[p], times["baseline"])] or [float("nan")] * 2  # --rounds 0: memory only
        times[p] = times[p] or [float("nan")]
        persistent = state_bytes(steps[p])
        transient = step_peak_bytes(steps[p], data[0])
        saved, per_token_block = saved_bytes(steps[p], data[0])
        out[p] = {"median_step_s": statistics.median(times[p]), "time_ratio_q": quartiles(ratios),
                  "persistent_bytes": persistent, "step_peak_bytes": transient, "peak_bytes": persistent + transient,
                  "saved_bytes": saved, "saved_per_token_block": per_token_block,
                  "scale_params": sum(p_.numel() for n, p_ in steps[p].module.named_parameters()
                                      if _is_scale(steps[p].module, p_))}
    for p in presets:
        out[p]["mem_ratio"] = out[p]["peak_bytes"] / out["baseline"]["peak_bytes"]
        out[p]["saved_ratio"] = out[p]["saved_bytes"] / out["baseline"]["saved_bytes"]
    return out


def _is_scale(module, param) -> bool:
    from scalevec_lit.scale.registry import scale_parameters

    ids = getattr(module, "_scale_ids", None)
    if ids is None:
        ids = module._scale_ids = {id(sp.param) for sp in scale_parameters(module)}
    return id(param) in ids


def bench_lightning(data_dir: str, rounds: int, warmup: int, batch_size: int) -> dict:
    import lightning as L
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import TensorBoardLogger

    from scalevec_lit.data.datamodule import TokenDataModule

    lit = build_module("baseline", data_dir)
    total = warmup + rounds + 1  # the same LR schedule on both sides: fixed to the Trainer's length
    lit.schedule.warmup_steps = min(lit.schedule.warmup_steps, total)
    lit.schedule.max_steps, lit.schedule._max_steps_fixed = total, True
    plain = PlainStep(copy.deepcopy(lit))
    plain_data = TokenDataModule(data_dir=data_dir, seq_len=128, batch_size=batch_size, seed=0)
    plain_data.setup("fit")
    state = {"it": iter(plain_data.train_dataloader()), "t_end": None, "lit": [], "plain": []}

    def next_plain_batch():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(plain_data.train_dataloader())
            return next(state["it"])

    class Interleave(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            now = time.perf_counter()
            if state["t_end"] is not None:
                state["lit"].append(now - state["t_end"])
                t0 = time.perf_counter()
                plain(next_plain_batch())
                state["plain"].append(time.perf_counter() - t0)
            state["t_end"] = time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            accelerator="cpu", devices=1, precision="32-true", max_steps=total,
            logger=TensorBoardLogger(tmp, name="bench"), log_every_n_steps=10, gradient_clip_val=1.0,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            limit_val_batches=0, num_sanity_val_steps=0, callbacks=[Interleave()], default_root_dir=tmp,
        )
        dm = TokenDataModule(data_dir=data_dir, seq_len=128, batch_size=batch_size, seed=0)
        trainer.fit(lit, datamodule=dm)
    lit_t, plain_t = state["lit"][warmup:], state["plain"][warmup:]
    ratios = [a / b for a, b in zip(lit_t, plain_t)]
    return {"rounds": len(ratios), "lightning_median_s": statistics.median(lit_t),
            "plain_median_s": statistics.median(plain_t), "time_ratio_q": quartiles(ratios)}


def profile_diff(preset: str, data_dir: str, steps: int, batch_size: int, top: int = 15,
                 shape: str = "smoke") -> list[tuple[str, float, float]]:
    """Self CPU time per op (ms per step) of ``preset`` vs baseline under torch.profiler, interleaved in
    blocks of one step; the ``top`` ops with the largest difference: ``(op, baseline_ms, preset_ms)``."""
    from torch.profiler import ProfilerActivity, profile

    config, _, seq_len = SHAPES[shape]
    data = batches(data_dir, batch_size, 4, seq_len=seq_len)
    runners = {p: PlainStep(build_module(p, data_dir, config=dict(config, seq_len=seq_len))) for p in ("baseline", preset)}
    for p in runners:  # warm-up (optimizer state, allocator)
        for b in data[:2]:
            runners[p](b)
    totals: dict[str, dict[str, float]] = {p: {} for p in runners}
    for i in range(steps):
        for p, step in runners.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(data[i % len(data)])
            for ev in prof.key_averages():
                totals[p][ev.key] = totals[p].get(ev.key, 0.0) + ev.self_cpu_time_total / 1e3 / steps
    keys = set(totals["baseline"]) | set(totals[preset])
    rows = [(k, totals["baseline"].get(k, 0.0), totals[preset].get(k, 0.0)) for k in keys]
    rows.sort(key=lambda r: -(r[2] - r[1]))
    return rows[:top] + [("TOTAL (all ops)", sum(r[1] for r in rows), sum(r[2] for r in rows))]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["presets", "lightning", "none"], default=None)
    ap.add_argument("--profile", default=None, metavar="PRESET",
                    help="instead: torch.profiler self CPU time per op, PRESET vs baseline (--rounds steps)")
    ap.add_argument("--presets", nargs="+", default=PRESETS)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=0, help="default: the shape's (smoke 16 x 128, d256 8 x 256)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smoke")
    ap.add_argument("--reference", action="store_true", help="also time plain_llama (benchmarks/plain_llama.py)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=str(ROOT / "data" / "prepared" / "shakespeare"))
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    args.batch_size = args.batch_size or SHAPES[args.shape][1]
    torch.set_num_threads(args.threads)
    unknown = set(args.presets) - set(PRESETS)
    if unknown:
        ap.error(f"unknown presets {sorted(unknown)}; choose from {PRESETS}")
    result = {"command": "python benchmarks/overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
              "batch": f"{args.batch_size} x {SHAPES[args.shape][2]} tokens",
              "shape": args.shape, "rounds": args.rounds, "warmup": args.warmup}
    print(f"# {result['command']}\n# {result['date']}; {result['machine']}; batch {result['batch']}", flush=True)
    if args.profile:
        rows = result["profile"] = profile_diff(args.profile, args.data_dir, args.rounds, args.batch_size, shape=args.shape)
        print(f"\n| op (self CPU time, ms per step) | baseline | {args.profile} | difference |\n|---|---|---|---|")
        for k, a, b in rows:
            print(f"| `{k}` | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
        args.only = "none"
    if args.only in (None, "presets"):
        res = result["presets"] = bench_presets(args.presets, args.data_dir, args.rounds, args.warmup, args.batch_size,
                                                args.shape, args.reference)
        print("\n| preset | scale params | median step | time vs baseline (median, IQR) | saved for backward | "
              "saved vs baseline | saved per token per block | allocator peak | peak vs baseline |")
        print("|---|---|---|---|---|---|---|---|---|")
        for p, r in res.items():
            q1, med, q3 = r["time_ratio_q"]
            timed = args.rounds > 0  # --rounds 0 measures memory only: no time columns
            step = f"{r['median_step_s'] * 1e3:.1f} ms" if timed else "—"
            ratio = f"{med:.3f}× ({q1:.3f}–{q3:.3f})" if timed else "—"
            print(f"| {p} | {r['scale_params']:,} | {step} | {ratio} | "
                  f"{r['saved_bytes'] / 2**20:.2f} MiB | {r['saved_ratio']:.4f}× | {r['saved_per_token_block']:,.0f} B | "
                  f"{r['peak_bytes'] / 2**20:.2f} MiB | {r['mem_ratio']:.4f}× |", flush=True)
    if args.only in (None, "lightning"):
        res = result["lightning"] = bench_lightning(args.data_dir, args.rounds, args.warmup, args.batch_size)
        q1, med, q3 = res["time_ratio_q"]
        print(f"\n| Lightning CausalLM step | plain PyTorch step | ratio (median of {res['rounds']} paired rounds, IQR) |")
        print("|---|---|---|")
        print(f"| {res['lightning_median_s'] * 1e3:.1f} ms | {res['plain_median_s'] * 1e3:.1f} ms | "
              f"{med:.3f}× ({q1:.3f}–{q3:.3f}) |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
