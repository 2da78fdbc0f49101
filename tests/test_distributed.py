"""FSDP2 on 2 CPU processes (gloo): equivalence with one process, and the CLI's sharded runs.

Lightning's ``fsdp`` strategy (FSDP1) refuses CPUs; ``ModelParallelStrategy`` + ``fully_shard`` (FSDP2)
runs with gloo, which is what the GPU recipes use too.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers import ROOT, recipe, run_cli, smoke_args, spawn_gloo, tiny_config

STEPS, GLOBAL_BATCH = 20, 8
# Compared in float64. Two ranks sum gradients in another order than one process (and the thread count,
# hence the order of the CPU's reductions, differs between the runs and between CPU kinds): a relative
# rounding of ~1e-16 per step, which Adam can amplify where a gradient is near zero (update ≈ g/√v).
# In float32 that amplification reached 1.5e-4 relative on an AVX-512 machine; in float64 the same
# amplification stays ≤ 1.1e-13 (measured on AMD with 1 and 2 threads). A real fault (a missing or doubled gradient reduction, an unsharded
# scale) moves losses and weights by ≥1e-2 relative, so 1e-8 separates the two by six orders of
# magnitude on either side.
TOLERANCE = 1e-8


def _batches():
    """Learnable sequences: t_{i+1} = t_i + 5 (mod 64) from random starts."""
    g = torch.Generator().manual_seed(123)
    return [(torch.randint(0, 64, (GLOBAL_BATCH, 1), generator=g) + 5 * torch.arange(33)) % 64 for _ in range(STEPS)]


def _model():
    from scalevec_lit.model import Transformer
    from scalevec_lit.scale import MagnitudeDirectionScale, Placement, ScaleStrategy

    torch.manual_seed(0)
    unified = ScaleStrategy(vector=MagnitudeDirectionScale, branch_specific=True,
                            placement=Placement(q="dual_norm", k="dual_norm"))
    return Transformer(tiny_config(), unified).double()


def _train(model, batches, rank: int = 0, world: int = 1) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    losses = []
    per_rank = GLOBAL_BATCH // world
    for batch in batches:
        local = batch[rank * per_rank : (rank + 1) * per_rank]
        loss = F.cross_entropy(model(local[:, :-1]).flatten(0, 1), local[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        reported = loss.detach().clone()
        if world > 1:
            dist.all_reduce(reported)
            reported /= world
        losses.append(reported.item())
    return losses


def _worker(rank: int, world: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from scalevec_lit.lit.parallel import ParallelOptions, parallelize
    from scalevec_lit.scale import scale_parameters

    model = _model()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("data_parallel",))
    parallelize(model, mesh, ParallelOptions())
    sharded = [type(sp.param).__name__ for sp in scale_parameters(model)]
    losses = _train(model, _batches(), rank, world)
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"losses": losses, "params": full, "sharded": sharded}, out)


@pytest.mark.slow
def test_fsdp2_two_processes_match_one_process(tmp_path):
    out = str(tmp_path / "fsdp.pt")
    spawn_gloo(_worker, 2, out)
    got = torch.load(out, weights_only=False)
    assert set(got["sharded"]) == {"DTensor"}  # the scale vectors were sharded too
    model = _model()
    reference = _train(model, _batches())
    assert reference[-1] < reference[0] - 1.0  # it trains
    for step, (a, b) in enumerate(zip(got["losses"], reference)):
        assert abs(a - b) <= TOLERANCE * abs(b), (step, a, b)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got["params"][name], p.detach(), rtol=TOLERANCE, atol=TOLERANCE * 1e-2)


def _fsdp_args(data, root, steps, *extra):
    ckpt = root / "ckpt.yaml"
    ckpt.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 5,"
        " save_last: true, save_top_k: -1}\n"
    )
    return smoke_args(
        data, root, steps, "--config", str(ckpt), "--trainer.devices=2", "--trainer.accelerator=cpu",
        "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
        "--trainer.strategy.data_parallel_size=2", "--trainer.strategy.tensor_parallel_size=1",
        "--trainer.strategy.process_group_backend=gloo", "--trainer.log_every_n_steps=1",
        "--trainer.limit_val_batches=0", "--data.batch_size=4", *extra,
    )


@pytest.mark.slow
def test_cli_fsdp2_distributed_checkpoint_and_resume(prepared_data, tmp_path):
    from helpers import scalars

    env = {"OMP_NUM_THREADS": "1"}
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    res = run_cli(_fsdp_args(prepared_data, a, 10), cwd=a, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    reference = dict(scalars(a / "smoke" / "version_0")["train/loss"])
    assert sorted(reference) == list(range(10))
    ckpt = a / "checkpoints" / "step000005.ckpt"
    assert ckpt.is_dir() and list(ckpt.glob("*.distcp"))  # a distributed (DCP) checkpoint: one shard per rank
    # written synchronously, with each file's size and CRC32 (tests/test_checkpoint_folder.py)
    assert sorted(json.loads((ckpt / "checksums.json").read_text())["crc32"]) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]

    res = run_cli(_fsdp_args(prepared_data, b, 10, f"--ckpt_path={ckpt}"), cwd=b, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    resumed = dict(scalars(b / "smoke" / "version_0")["train/loss"])
    assert sorted(resumed) == list(range(5, 10))
    for step, value in resumed.items():
        assert abs(value - reference[step]) <= 1e-6 * abs(reference[step]), (step, value, reference[step])
