"""The global batch of a recipe, whatever the number of processes (``lit/batch.py``), and the headline GPU
recipes' code path kept alive on CPU.

- ``resolve_global_batch``/``data_parallel_size``: the accumulation for 1 .. 64 devices and several nodes,
  and every refusal names its key, its value and the fix.
- ``recipes/dense_2b.yaml`` unchanged but for a tiny shape (eager), on 1 process and on 2 processes (FSDP2, gloo):
  the same global batch (the printed line, ``train/tokens`` at every step) and the same loss curve within
  a tolerance derived from the curve's own step-to-step noise.
- every GPU recipe (dense and MoE), shrunk to a tiny shape, on 2 CPU processes with all of its own options
  (FSDP2, bf16 mixed precision, meta init, compile where the recipe has it, activation checkpointing turned
  on, its callbacks, a distributed checkpoint) for a few steps.

The 2-process runs share one ``torchrun`` launch (``tests/fit_many.py``): one import of torch and
Lightning, and torch.compile's caches, serve them all.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, run_cli

from scalevec_lit.errors import UserError
from scalevec_lit.lit.batch import data_parallel_size, resolve_global_batch

GPU_RECIPES = ["dense_0.12b.yaml", "dense_0.5b.yaml", "dense_1b.yaml", "dense_2b.yaml", "moe_0.5b.yaml", "moe_2b.yaml"]
TINY = ["--model.config.n_layer=2", "--model.config.n_embd=64", "--model.config.n_head=4", "--model.config.n_kv_head=2",
        "--model.config.intermediate_size=128", "--model.config.seq_len=64"]
TINY_MOE = ["--model.config.moe.num_experts=4", "--model.config.moe.top_k=2",
            "--model.config.moe.expert_intermediate_size=32"]
CURVE_STEPS, CURVE_TOKENS = 40, 4096  # the 1-vs-2-process comparison: 40 steps of 4,096 tokens
GLOBAL_LINE = re.compile(r"global batch: ([\d,]+) tokens = ([\d,]+) sequences of (\d+) tokens = data.batch_size (\d+) "
                         r"× (\d+) accumulation steps × (\d+) data-parallel ranks")


# -- the arithmetic ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("devices,nodes,accumulate", [(1, 1, 64), (2, 1, 32), (4, 1, 16), (8, 1, 8), (8, 2, 4),
                                                       (8, 8, 1)])
def test_dense_2b_keeps_its_global_batch_on_any_number_of_devices(devices, nodes, accumulate):
    dp, set_to = data_parallel_size(devices * nodes, "auto", 1, devices)
    assert dp == set_to == devices * nodes  # data_parallel_size: auto follows the world size
    batch = resolve_global_batch(tokens=524288, sequences=None, seq_len=2048, micro_batch=4, data_parallel=dp,
                                 devices=devices, num_nodes=nodes)
    assert (batch.accumulate, batch.sequences, batch.tokens) == (accumulate, 256, 524288)
    assert batch.accumulate * batch.micro_batch * batch.data_parallel == 256
    same_in_sequences = resolve_global_batch(tokens=None, sequences=256, seq_len=2048, micro_batch=4, data_parallel=dp,
                                             devices=devices, num_nodes=nodes)
    assert same_in_sequences == batch


def test_data_parallel_size_follows_the_world_size_and_tensor_parallelism():
    assert data_parallel_size(8, "auto", 2, 8) == (4, 4)
    assert data_parallel_size(16, "auto", "auto", 8) == (2, None)  # Lightning's own meaning: DP over nodes
    assert data_parallel_size(8, 4, 2, 8) == (4, None)
    with pytest.raises(UserError, match=r"tensor_parallel_size: 3: does not divide the world size 8"):
        data_parallel_size(8, "auto", 3, 8)
    with pytest.raises(UserError, match=r"data_parallel_size: 8: × tensor_parallel_size 1 is not the world size 2 .*"
                                        r"set data_parallel_size: auto"):
        data_parallel_size(2, 8, 1, 2)


def test_a_global_batch_that_cannot_be_met_names_the_key_the_value_and_the_fix():
    common = dict(seq_len=2048, micro_batch=4, devices=8, num_nodes=16)
    with pytest.raises(UserError, match=r"global_batch_tokens: 524,288: is not a multiple of data.batch_size 4 × "
                                        r"model.config.seq_len 2048 × data-parallel size 128 .*= 1,048,576 tokens.*"
                                        r"e.g. 1,048,576\), or --data.batch_size=2 \(which divides it\)"):
        resolve_global_batch(tokens=524288, sequences=None, data_parallel=128, **common)
    with pytest.raises(UserError, match=r"global_batch_tokens: 8: and global_batch_size \(4\) are both set; keep one"):
        resolve_global_batch(tokens=8, sequences=4, data_parallel=1, **common)
    with pytest.raises(UserError, match=r"global_batch_size: 0: must be at least 1"):
        resolve_global_batch(tokens=None, sequences=0, data_parallel=1, **common)
    with pytest.raises(UserError, match=r"trainer.accumulate_grad_batches: 4: is derived from global_batch_tokens"):
        resolve_global_batch(tokens=524288, sequences=None, data_parallel=8, accumulate_set=4, **common)
    assert resolve_global_batch(tokens=None, sequences=None, data_parallel=8, **common) is None  # Lightning's stands


# -- runs ---------------------------------------------------------------------------------------------------------
def _cpu_args(recipe: str, data: Path, root: Path, devices: int, steps: int, *extra: str) -> list[str]:
    """``recipe`` as it is, on ``devices`` CPU processes (gloo), shrunk to a tiny shape, writing under ``root``."""
    args = ["fit", "--config", str(ROOT / "recipes" / recipe), "--trainer.accelerator=cpu", f"--trainer.devices={devices}",
            "--trainer.strategy.process_group_backend=gloo", f"--data.data_dir={data}", "--data.num_workers=0",
            f"--trainer.max_steps={steps}", f"--trainer.default_root_dir={root}",
            f"--trainer.logger.init_args.save_dir={root}", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1", *TINY]
    if recipe.startswith("moe"):
        args += TINY_MOE
    return args + list(extra)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _curve(recipe_root: Path, name: str) -> dict[str, dict[int, float]]:
    from helpers import scalars

    (version,) = (recipe_root / name).glob("version_*")
    return {tag: dict(values) for tag, values in scalars(version).items()}


def _global_line(text: str) -> tuple[int, ...]:
    found = GLOBAL_LINE.findall(text)
    assert found, text[-3000:]
    return tuple(int(v.replace(",", "")) for v in found[0])


@pytest.fixture(scope="module")
def two_process_runs(prepared_data, tmp_path_factory):
    """One torchrun launch of 2 CPU processes running: ``dense_2b`` for the curve, then every GPU recipe for 3
    steps. Returns (work folder, per-command results, the launch's output)."""
    work = tmp_path_factory.mktemp("two_process")
    commands = [_cpu_args("dense_2b.yaml", prepared_data, work / "curve2", 2, CURVE_STEPS, *_curve_extra(2))]
    for recipe in GPU_RECIPES:
        commands.append(_cpu_args(recipe, prepared_data, work / recipe, 2, 3, "--data.batch_size=2",
                                  "--global_batch_tokens=512", "--trainer.val_check_interval=3",
                                  "--trainer.limit_val_batches=1", "--model.parallel.activation_checkpointing=true"))
    (work / "commands.json").write_text(json.dumps(commands))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
         str(ROOT / "tests" / "fit_many.py"), str(work / "commands.json"), str(work / "results.json")],
        cwd=work, capture_output=True, text=True, timeout=900, env=env,
    )
    results = json.loads((work / "results.json").read_text()) if (work / "results.json").exists() else []
    return work, results, res.stdout + res.stderr


def _curve_extra(devices: int) -> list[str]:
    """The same for 1 and 2 processes: a learning rate and warmup at which 40 steps of a tiny model move the loss.
    Eager: the curve is about the global batch, and dense_2b's compile runs in the GPU recipes' run of the same
    launch (compiling here cost the 1-process run 26 s of its 66 s). One validation, at the end:
    ``val_check_interval`` counts micro-batches, 16 (1 process) or 8 (2 processes) to an optimizer step."""
    accumulation = CURVE_TOKENS // (4 * 64 * devices)
    return ["--model.compile=false", "--data.batch_size=4", f"--global_batch_tokens={CURVE_TOKENS}",
            "--model.optimizer.init_args.lr=3e-3", "--model.schedule.init_args.warmup_steps=5",
            f"--trainer.val_check_interval={CURVE_STEPS * accumulation}", "--trainer.limit_val_batches=1.0"]


@pytest.mark.slow
def test_dense_2b_on_one_and_two_processes_has_one_global_batch_and_one_loss_curve(two_process_runs, prepared_data,
                                                                                   tmp_path):
    work, results, output = two_process_runs
    assert results and results[0]["code"] == 0, output[-6000:]
    one = run_cli(_cpu_args("dense_2b.yaml", prepared_data, tmp_path, 1, CURVE_STEPS, *_curve_extra(1)), cwd=tmp_path,
                  env={"OMP_NUM_THREADS": "1"}, timeout=900)
    assert one.returncode == 0, one.stderr[-6000:]
    # the printed composition: 4,096 tokens = 64 sequences of 64 = 4 × accumulation × data-parallel ranks
    assert _global_line(one.stdout + one.stderr) == (4096, 64, 64, 4, 16, 1)
    assert (4096, 64, 64, 4, 8, 2) in [tuple(int(v.replace(",", "")) for v in m) for m in GLOBAL_LINE.findall(output)]

    a, b = _curve(tmp_path, "dense_2b"), _curve(work / "curve2", "dense_2b")
    steps = list(range(CURVE_STEPS))
    for run in (a, b):  # every optimizer step consumed exactly the global batch, on all ranks together
        assert sorted(run["train/tokens"]) == steps
        assert [run["train/tokens"][s] for s in steps] == [CURVE_TOKENS * (s + 1) for s in steps]
    la, lb = [a["train/loss"][s] for s in steps], [b["train/loss"][s] for s in steps]
    # Different processes read different sequences (litdata shards the stream by rank), so the two curves
    # agree statistically, not bitwise. The noise of one logged loss is estimated from the curves themselves
    # (half the spread of successive differences, trend removed by the second difference); the means of the
    # last 10 steps then agree within 4 standard errors of their difference.
    second = [x - 2 * y + z for run in (la, lb) for x, y, z in zip(run, run[1:], run[2:])]
    noise = math.sqrt(sum(d * d for d in second) / len(second) / 6)  # var(x - 2y + z) = 6 σ² for iid noise
    window = 10
    tail_a, tail_b = sum(la[-window:]) / window, sum(lb[-window:]) / window
    assert la[0] - tail_a > 1.0 and lb[0] - tail_b > 1.0  # both trained
    assert abs(tail_a - tail_b) <= 4 * noise * math.sqrt(2 / window), (tail_a, tail_b, noise)
    # the full validation split, read by one process or shared by two, after the same number of tokens
    assert sorted(a["val/loss"]) == sorted(b["val/loss"]) == [CURVE_STEPS - 1]  # once, at the end
    va, vb = a["val/loss"][CURVE_STEPS - 1], b["val/loss"][CURVE_STEPS - 1]
    assert abs(va - vb) <= 4 * noise, (va, vb, noise)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_gpu_recipe_runs_shrunk_on_two_cpu_processes_with_its_own_options(two_process_runs, recipe):
    import yaml

    work, results, output = two_process_runs
    by_root = {next(a.split("=", 1)[1] for a in r["argv"] if a.startswith("--trainer.default_root_dir=")): r
               for r in results}
    run = by_root.get(str(work / recipe))
    assert run is not None and run["code"] == 0, output[-8000:]
    name = recipe.removesuffix(".yaml")
    text = (ROOT / "recipes" / recipe).read_text()
    own = yaml.safe_load(text)
    # the recipe's own options, as the run used them
    assert own["trainer"]["devices"] == "auto" and own["model"]["parallel"]["mixed_precision"] == "bf16"
    assert own["model"]["parallel"]["meta_init"] is True and "global_batch_tokens" in own
    config = yaml.safe_load(next((work / recipe / name).glob("version_*/config.yaml")).read_text())
    used = config["model"]["parallel"]
    assert {k: used[k] for k in own["model"]["parallel"]} == {**own["model"]["parallel"], "activation_checkpointing": True}
    assert config["model"]["compile"] == own["model"]["compile"]
    assert config["trainer"]["strategy"]["class_path"].endswith("ModelParallelStrategy")
    # its callbacks, less its progress bar: --trainer.enable_progress_bar=false drops it (Lightning refuses the pair)
    listed = [c["class_path"] for c in own["trainer"]["callbacks"]]
    assert "scalevec_lit.lit.progress.StepProgressBar" in listed
    assert [c["class_path"] for c in config["trainer"]["callbacks"]] == [c for c in listed if not c.endswith("ProgressBar")]
    curve = _curve(work / recipe, name)
    assert sorted(curve["train/tokens"]) == [0, 1, 2] and curve["train/tokens"][2] == 3 * 512  # accumulation 2 × 2 ranks
    assert all(math.isfinite(v) for v in curve["train/loss"].values()) and "val/loss" in curve
    assert any(t.startswith("scale/") for t in curve)  # ScaleVectorMonitor ran
    if recipe.startswith("moe"):
        assert any(t.startswith("moe/") for t in curve)  # MoELoadMonitor ran
    last = work / recipe / "checkpoints" / "last.ckpt"
    assert last.is_dir() and len(list(last.glob("*.distcp"))) == 2  # a distributed checkpoint, one shard per rank
