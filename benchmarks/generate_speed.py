"""Decoding speed with and without the key/value cache, in one process (``scalevec_lit.generate``).

Greedy decoding of ``--new-tokens`` tokens after a ``--prompt-tokens``-token prompt, end-of-text ignored,
alternately with the cache (``Transformer.forward_cached``: the prompt once, then one position per step)
and without it (the whole sequence at every step, what a plain ``model(ids)`` loop does), ``--rounds``
times each in the order AB, BA, AB, ... so that slow drifts of a shared machine cancel. Prints one table
(median tokens/s of each, the prompt included in the time) and the ratio, and checks that both decoded
the same tokens.

    .venv/bin/python benchmarks/generate_speed.py --ckpt runs/smoke/version_0/checkpoints/last.ckpt
    .venv/bin/python benchmarks/generate_speed.py                 # a random model of the smoke shape
    .venv/bin/python benchmarks/generate_speed.py --ckpt ... --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalevec_lit.generate import DTYPES, Sampling, _cast_parameters_, generate  # noqa: E402
from scalevec_lit.model import Transformer, TransformerConfig  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=None, help="a checkpoint generate reads (default: a random smoke-shaped model)")
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=112, help="default: fill the smoke model's 128 positions")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.ckpt:
        from scalevec_lit.checkpoint import load_model

        model, _ = load_model(args.ckpt)
        source = args.ckpt
    else:
        torch.manual_seed(0)
        model = Transformer(TransformerConfig(vocab_size=4096, seq_len=128, n_layer=4, n_embd=128, n_head=4,
                                              n_kv_head=2)).eval()
        source = "random smoke-shaped model"
    model.to(device)
    if args.dtype != "float32":
        _cast_parameters_(model, DTYPES[args.dtype])
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_tokens), generator=gen).to(device)
    n = args.new_tokens

    def run(use_cache: bool) -> tuple[float, torch.Tensor]:
        _sync(device)
        start = time.perf_counter()
        out = generate(model, prompt, n, Sampling(temperature=0.0), use_cache=use_cache)
        _sync(device)
        return time.perf_counter() - start, out

    run(True), run(False)  # warm-up (allocator, kernels)
    times: dict[bool, list[float]] = {True: [], False: []}
    outs = {}
    for r in range(args.rounds):
        for use_cache in ((True, False) if r % 2 == 0 else (False, True)):
            t, outs[use_cache] = run(use_cache)
            times[use_cache].append(t)
    same = torch.equal(outs[True], outs[False])
    rate = {k: n / statistics.median(v) for k, v in times.items()}
    print(f"{source}: {args.prompt_tokens} prompt + {n} new tokens, greedy, batch 1, {device.type} {args.dtype}, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds (median)")
    print(f"{'':<22}{'tokens/s':>10}{'ms/token':>10}")
    for use_cache, label in ((False, "without cache"), (True, "with KV cache")):
        print(f"{label:<22}{rate[use_cache]:>10.1f}{1000 / rate[use_cache]:>10.2f}")
    print(f"ratio (cache / no cache): {rate[True] / rate[False]:.2f}x; same tokens: {same}")
    if not same:
        raise SystemExit("the cached and uncached decodings differ")


if __name__ == "__main__":
    main()
