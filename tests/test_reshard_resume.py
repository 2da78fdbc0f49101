"""A distributed (FSDP2, DCP folder) checkpoint resumes on another number of processes (``lit/reshard.py``).

One uninterrupted run of 4 processes, then one chain of runs that starts from its checkpoints and changes
the world size at every resume: 4 -> 2 -> 1 -> 2 processes, 2 optimizer steps each, the same global batch
of 8 sequences (``global_batch_size``: 1, 2, 4 and 2 accumulation steps per rank). Every rank logs, per
micro-batch, the step it feeds, the hash of each sequence it read and its loss (``reshard_probe.py``).

The uninterrupted run and the 1-process run save asynchronously (DCP's ``async_save``), the others
synchronously: the chain resumes from both kinds.

- **No sample repeated or skipped**: at every step the chain reads exactly the sequences the
  uninterrupted run read at that step (as a multiset), so over the whole run too. This is exact.
- **The loss curve continues**: the mean micro-batch loss of every step (all ranks together) equals the
  uninterrupted run's within a relative 1e-4. Why not bitwise: a step's gradient is a sum over the same 8
  sequences in another order (accumulation on one rank against FSDP2's reduce-scatter over several), and
  so is its mean loss. Reordering an fp32 sum of n positive terms moves it by at most (n-1)u relative
  (u = 2^-24 = 6e-8); a step's loss is a mean over 8 × 32 = 256 token losses, so 255u = 1.5e-5 bounds
  the loss itself, and the weights differ only by such rounding for 2 steps at a time. One sequence
  repeated or skipped changes a step's loss by the difference of two sequence losses over 8, about 1e-2
  here: 100 times the tolerance. (Observed: equal to the last bit on this machine.)
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from helpers import ROOT, run_cli, smoke_args

TINY = ["--model.config.n_layer=2", "--model.config.n_embd=32", "--model.config.n_head=2", "--model.config.n_kv_head=1",
        "--model.config.seq_len=32", "--data.batch_size=2", "--global_batch_size=8"]
RTOL = 1e-4


def _fit(data: Path, root: Path, world: int, steps: int, *extra: str, async_save: bool = False, fsdp: bool = True):
    root.mkdir(parents=True, exist_ok=True)
    (root / "ckpt.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 2,"
        f" save_last: false, save_top_k: -1, async_save: {str(async_save).lower()}}}\n"
        f"    - class_path: reshard_probe.SampleLog\n      init_args: {{out: {root / 'samples'}}}\n")
    strategy = ["--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
                "--trainer.strategy.data_parallel_size=auto", "--trainer.strategy.tensor_parallel_size=1",
                "--trainer.strategy.process_group_backend=gloo"] if fsdp else []
    args = smoke_args(data, root, steps, "--config", str(root / "ckpt.yaml"), f"--trainer.devices={world}", *strategy,
                      "--trainer.limit_val_batches=0", *TINY, *extra)
    res = run_cli(args, cwd=root, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"})
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def _steps(folder: Path) -> dict[int, list[tuple[list[str], float]]]:
    out: dict[int, list] = defaultdict(list)
    for f in sorted(folder.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            out[rec["step"]].append((rec["rows"], rec["loss"], rec["accumulate"], rec["world"]))
    return out


@pytest.mark.slow
def test_a_checkpoint_resumes_on_4_2_1_and_2_processes_with_the_same_samples_and_losses(prepared_data, tmp_path):
    ref = tmp_path / "ref"
    _fit(prepared_data, ref, 4, 8, async_save=True)  # DCP's async_save: the chain starts from its checkpoint
    reference = _steps(ref / "samples")
    assert sorted(reference) == list(range(8))
    ckpt = ref / "checkpoints" / "step000002.ckpt"
    assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == 4  # one shard file per rank
    assert sorted(p.name for p in (ref / "checkpoints").iterdir() if p.name != "run.lock") == \
        [f"step{s:06d}.ckpt" for s in (2, 4, 6, 8)]  # all renamed into place by the end of fit

    chain: dict[int, list] = {}
    lines = []
    for i, world in enumerate((2, 1, 2)):
        run = tmp_path / f"w{world}_{i}"
        res = _fit(prepared_data, run, world, 4 + 2 * i, f"--ckpt_path={ckpt}", async_save=world == 1)
        # the ranks share stderr, so another rank's warning may follow the note on the same line
        lines += re.findall(r"note: resuming a checkpoint of .*? over \d+ rank\(s\)", res.stderr)
        got = _steps(run / "samples")
        assert sorted(got) == [2 + 2 * i, 3 + 2 * i], sorted(got)
        chain.update(got)
        ckpt = run / "checkpoints" / f"step{4 + 2 * i:06d}.ckpt"
        assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == world
    assert lines == [
        "note: resuming a checkpoint of 4 process(es) on 2: the same global batch of 8 sequences, 2 accumulation "
        "step(s) per rank (were 1); data position: 16 sequences read in this epoch, the rest dealt out over 2 rank(s)",
        "note: resuming a checkpoint of 2 process(es) on 1: the same global batch of 8 sequences, 4 accumulation "
        "step(s) per rank (were 2); data position: 32 sequences read in this epoch, the rest dealt out over 1 rank(s)",
        "note: resuming a checkpoint of 1 process(es) on 2: the same global batch of 8 sequences, 2 accumulation "
        "step(s) per rank (were 4); data position: 48 sequences read in this epoch, the rest dealt out over 2 rank(s)",
    ]
    for step in range(2, 8):
        mine, theirs = chain[step], reference[step]
        world = {w for *_, w in mine}
        assert len(world) == 1 and len(mine) == 4, (step, len(mine))  # 8 sequences in micro-batches of 2
        assert Counter(h for rows, *_ in mine for h in rows) == Counter(h for rows, *_ in theirs for h in rows), step
        loss = sum(x[1] for x in mine) / len(mine)
        expected = sum(x[1] for x in theirs) / len(theirs)
        assert abs(loss - expected) <= RTOL * abs(expected), (step, loss, expected)
    seen = Counter(h for s in range(2) for rows, *_ in reference[s] for h in rows)
    seen.update(h for s in range(2, 8) for rows, *_ in chain[s] for h in rows)
    assert seen == Counter(h for s in range(8) for rows, *_ in reference[s] for h in rows)
    assert max(seen.values()) == 1  # the 64 sequences of 8 steps are distinct: nothing read twice


@pytest.mark.slow
def test_a_one_file_checkpoint_of_one_process_resumes_under_fsdp2_on_two(prepared_data, tmp_path):
    """One process with the default strategy writes a one-file ``.ckpt``; FSDP2 on 2 processes reads it whole,
    shards it (the optimizer's moments re-keyed by name: ``reshard.optimizer_state_by_name``) and goes on
    with the same samples and losses (same tolerance as above; observed: equal to the last bit)."""
    ref = tmp_path / "ref"
    _fit(prepared_data, ref, 1, 4, fsdp=False)
    reference = _steps(ref / "samples")
    ckpt = ref / "checkpoints" / "step000002.ckpt"
    assert ckpt.is_file()
    run = tmp_path / "two"
    res = _fit(prepared_data, run, 2, 4, f"--ckpt_path={ckpt}")
    assert "note: resuming a checkpoint of 1 process(es) on 2: the same global batch of 8 sequences, 2 " \
           "accumulation step(s) per rank (were 4); data position: 16 sequences read in this epoch" in res.stderr
    got = _steps(run / "samples")
    assert sorted(got) == [2, 3]
    for step in (2, 3):
        assert Counter(h for rows, *_ in got[step] for h in rows) == \
            Counter(h for rows, *_ in reference[step] for h in rows), step
        loss = sum(x[1] for x in got[step]) / len(got[step])
        expected = sum(x[1] for x in reference[step]) / len(reference[step])
        assert abs(loss - expected) <= RTOL * abs(expected), (step, loss, expected)
