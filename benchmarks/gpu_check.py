"""GPU check: bf16 FSDP2 + torch.compile throughput, MFU and peak memory per model size and preset.

    bash benchmarks/gpu_check.sh                      # on one NVIDIA GPU; writes logs to $OUT
    bash benchmarks/gpu_check.sh --sizes dense_0.12b,moe_0.5b --presets baseline,unified,no_scale
    python benchmarks/gpu_check.py --dry-run          # tiny sizes on CPU (what the test suite runs)
    python benchmarks/gpu_check.py --dry-run --sizes tiny_moe   # a tiny MoE (bias balancing, shared expert)

Sizes: the named dense sizes (``scalevec_lit.model.SIZES``) and the MoE recipes ``moe_0.5b``, ``moe_2b``
(``recipes/<name>.yaml``'s ``model.config``; vocabulary 32000 where the recipe takes the tokenizer's).
The loss is the cross-entropy plus the MoE aux losses, as the library trains.

Installs nothing and reads no data: batches are random token ids (throughput does not depend on them).
The bf16 matmul peak of this GPU is measured first and MFU is reported against it (and against the
datasheet peak when the device name is known). Needs only torch and PyYAML (no Lightning, litdata,
jsonargparse or tokenizers).

Host-device syncs: the timed steps run as the library trains (the non-finite loss check of
``scalevec_lit.lit.nonfinite.NonFiniteGuard`` with fused AdamW's on-device skip, losses kept on the device)
and are timed with CUDA events, so nothing in the loop needs to wait for the GPU. They run under
``torch.cuda.set_sync_debug_mode("warn")``: every synchronizing call (``.item()``, a blocking copy, ...)
is counted and reported per timed step (column ``syncs/step``, JSON ``syncs`` with the first call sites).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scalevec_lit.lit.parallel import DATASHEET_BF16_TFLOPS, ParallelOptions, parallelize  # noqa: E402
from scalevec_lit.model import SIZES, Transformer, TransformerConfig, count_parameters  # noqa: E402
from scalevec_lit.lit.nonfinite import NonFiniteGuard  # noqa: E402
from scalevec_lit.model.spec import strategy_from_dict  # noqa: E402



#: dry-run sizes (CPU): tiny models, the MoE one with every part of the layer switched on
DRY_RUN = {
    "tiny": dict(vocab_size=512, seq_len=32, n_layer=2, n_embd=64, n_head=4, n_kv_head=2),
    "tiny_deep": dict(vocab_size=512, seq_len=32, n_layer=3, n_embd=64, n_head=4),
    "tiny_moe": dict(vocab_size=512, seq_len=32, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                     moe=dict(num_experts=4, top_k=2, expert_intermediate_size=64, num_shared_experts=1,
                              bias_balancing=True)),
}


def size_config(name: str, seq: int) -> TransformerConfig:
    """A named dense size, or an MoE recipe's model (``moe_0.5b`` -> ``recipes/moe_0.5b.yaml``)."""
    recipe = ROOT / "recipes" / f"{name}.yaml"
    if name.startswith("moe_") and recipe.exists():
        model = dict(yaml.safe_load(recipe.read_text())["model"]["config"])
        model.setdefault("vocab_size", 32000)
        model["seq_len"] = seq
        return TransformerConfig(**model)
    return TransformerConfig.from_name(name, seq_len=seq)


def preset(name: str):
    data = yaml.safe_load((ROOT / "recipes" / "strategy" / f"{name}.yaml").read_text())
    return strategy_from_dict(data["model"]["strategy"])


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> float:
    """TFLOP/s of an n×n×n matmul (median of ``reps``)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(reps + 3):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / sorted(times)[len(times) // 2] / 1e12


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_one(config: TransformerConfig, preset_name: str, args, device, peak_tflops: float) -> dict:
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(config, preset(preset_name))
    mesh = torch.distributed.device_mesh.init_device_mesh(device.type, (1,), mesh_dim_names=("data_parallel",))
    opts = ParallelOptions(mixed_precision="bf16" if args.bf16 else "fp32", meta_init=True)
    parallelize(model, mesh, opts, compile=args.compile)
    model.to_empty(device=device)
    model.reset_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tokens = torch.randint(0, config.vocab_size, (args.batch, config.seq_len + 1), device=device)
    guard = NonFiniteGuard()
    guard.reset(device)
    losses: list[torch.Tensor] = []

    def train_step(step: int) -> None:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss = loss + sum(model.aux_losses().values())  # MoE balancing losses (none for a dense model)
        guard.observe(loss, step, opt)  # device-side flag; fused AdamW skips a non-finite step on the device
        found = guard.poll()  # reads the flag only once it has arrived; never waits
        if found is not None:
            raise RuntimeError(f"non-finite loss {found[1]} at step {found[0]}")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    for step in range(args.warmup):
        train_step(step)
    sync(device)
    cuda = device.type == "cuda"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)] if cuda else []
    times, sync_sites = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            t0 = time.perf_counter()
            for i, step in enumerate(range(args.warmup, args.warmup + args.steps)):
                if cuda:
                    events[i].record()
                train_step(step)
                if not cuda:
                    times.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
            if cuda:
                events[-1].record()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    sync_sites = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    sync(device)
    if cuda:
        times = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(args.steps)]
    if guard.poll(block=True) is not None:
        raise RuntimeError("non-finite loss during the timed steps")
    losses = torch.stack(losses).float().tolist()
    step_time = sorted(times)[len(times) // 2]
    tok_s = args.batch * config.seq_len / step_time
    count = count_parameters(config, preset(preset_name))
    flops = config.flops_per_token(config.seq_len, count.active_non_embedding)
    mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return {
        "params": count.total, "step_s": step_time, "tokens_per_s": tok_s,
        "mfu": tok_s * flops / (peak_tflops * 1e12), "peak_mem_gib": mem,
        "loss_first": losses[0], "loss_last": losses[-1], "finite": all(map(lambda x: x == x, losses)),
        "syncs": len(sync_sites) if device.type == "cuda" else None,
        "sync_sites": sorted(set(sync_sites))[:10],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None, help="comma-separated (default dense_0.12b,dense_1b; dry run: "
                        "tiny,tiny_deep; also moe_0.5b, moe_2b, tiny_moe)")
    parser.add_argument("--presets", default="baseline,unified")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU, fp32, no compile")
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "benchmarks" / "out")))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    args.bf16 = device.type == "cuda"
    if args.dry_run:
        args.compile, args.steps, args.warmup, args.batch = False, 3, 1, 2
        configs = {name: TransformerConfig(**DRY_RUN[name]) for name in (args.sizes or "tiny,tiny_deep").split(",")}
    else:
        configs = {name: size_config(name, args.seq) for name in (args.sizes or "dense_0.12b,dense_1b").split(",")}
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    try:
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        peak = measure_matmul_peak(device, dtype, 8192 if device.type == "cuda" else 256, 10)
        name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
        sheet = next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)
        rows = []
        for size, config in configs.items():
            for p in args.presets.split(","):
                r = run_one(config, p, args, device, peak)
                rows.append({"size": size, "preset": p, **r})
                print(json.dumps(rows[-1]), flush=True)
        header = f"device: {name}; measured {'bf16' if args.bf16 else 'fp32'} matmul peak {peak:.1f} TFLOP/s" + (
            f" (datasheet {sheet:.0f})" if sheet else ""
        )
        lines = [header, "", "| size | preset | params | tokens/s | MFU (measured peak) | step s | peak mem GiB | vs baseline "
                 "| syncs/step |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            base = next((b for b in rows if b["size"] == r["size"] and b["preset"] == "baseline"), None)
            ratio = f"{r['step_s'] / base['step_s']:.3f}x" if base else "-"
            lines.append(f"| {r['size']} | {r['preset']} | {r['params'] / 1e6:.1f}M | {r['tokens_per_s']:,.0f} | "
                         f"{100 * r['mfu']:.1f}% | {r['step_s']:.4f} | {r['peak_mem_gib']:.2f} | {ratio} | "
                         + (f"{r['syncs'] / args.steps:.2f} |" if r["syncs"] is not None else "n/a (CPU) |"))
        lines += ["", "syncs/step: host-device synchronizations per timed step (torch.cuda.set_sync_debug_mode), "
                  "including the non-finite loss check; 0 means the loop never waits for the GPU"]
        table = "\n".join(lines)
        print(table)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.json").write_text(json.dumps({"device": name, "peak_tflops": peak, "rows": rows}, indent=2))
        (out / "gpu_check.md").write_text(table + "\n")
        return 0 if all(r["finite"] for r in rows) else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
