"""``ScaleVecLM`` on 2 CPU processes (gloo) when a rank gets little or no work: nothing waits forever.

One 2-process run (a subprocess with a time limit, its gloo group with a collective timeout: a hang fails the
test instead of blocking CI) evaluates the same weights as plain replicas (as under DDP) and sharded with FSDP2
(``lit/parallel.py``, as ``fit`` shards them), each on every case of ``CASES``:

- ``limit: 1`` (one document: rank 1 has no forward of its own) on (a) a multiple-choice task, (b) a
  generate_until task, (c) both in one call, (d) a perplexity (loglikelihood_rolling) task;
- ``limit: 3`` of the three tasks, two rows a batch (uneven shares: 3 + 2 log-likelihood batches, 2 + 1 decodes).

Every case finishes with the metrics of a one-process evaluation of the same weights, on rank 0 only; a sharded
model runs as many forwards on each rank (one-token forwards on the rank with less work), plain replicas none
on a rank with no work. Ranks given different requests stop together with one error naming the counts. The callback's own 2-process run is in ``test_downstream_eval.py``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # helpers, also when this file runs as the 2-process script
from helpers import ROOT, free_port, tiny_config  # noqa: E402

pytest.importorskip("lm_eval", reason="lm-eval is in the test extra (pip install -e '.[test]')")
for _k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
    os.environ.setdefault(_k, "1")  # the tasks read local files: nothing may reach the network
TASKS = ROOT / "tests" / "data" / "evaluate_tasks"
ALL = ["tiny_choice", "tiny_gen", "tiny_rolling"]
#: case → (tasks, limit, batch size)
CASES = {"a": (["tiny_choice"], 1, 8), "b": (["tiny_gen"], 1, 8), "c": (["tiny_choice", "tiny_gen"], 1, 8),
         "d": (["tiny_rolling"], 1, 8), "shares": (ALL, 3, 2)}
KINDS = ("plain", "fsdp2")
TIMEOUT = 240  # the whole 2-process run (~15 s on 2 busy cores); a collective waits at most COLLECTIVE_S
COLLECTIVE_S = 90
# Rank 0's metrics vs one process's, the same float32 weights and the same batches (the wrapper runs one
# process's batches, shared out): they differ at most by the sums' order under another thread count or the
# FSDP2 forward. bits_per_byte is -Σ log p / bytes over ~80 tokens: each log-probability moves by ≤ ~1e-5
# relative (64-channel fp32 matmuls, u32 = 6e-8, over ~10 chained layers: 64·10·u32 ≈ 4e-5 of |logit|), so
# the sum by ≤ 4e-5 relative; a document dropped, doubled or scored in a wrong window moves it by > 1e-2.
REL = 1e-4


def spec() -> dict:
    return {"config": dataclasses.asdict(tiny_config()), "strategy": {},
            "block": {"class_path": "scalevec_lit.model.block.Block"}}


def build(weights: Path | None = None):
    from scalevec_lit.model.spec import build_from_spec

    torch.manual_seed(0)
    model = build_from_spec(spec())
    if weights is not None:
        model.load_state_dict(torch.load(weights, weights_only=True))
    return model.eval()


def evaluate_case(model, name: str, rank: int = 0, world: int = 1):
    """``(results or None, forwards this rank ran)`` of case ``name``."""
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer
    from scalevec_lit.evaluate.harness import run_tasks, task_manager
    from scalevec_lit.evaluate.lm import ScaleVecLM

    tasks, limit, batch = CASES[name]
    lm = ScaleVecLM(model, Tokenizer(DEFAULT_TOKENIZER), batch_size=batch, rank=rank, world_size=world)
    runs, run = [0], lm._run

    def counted(*args, **kwargs):
        runs[0] += 1
        return run(*args, **kwargs)

    lm._run = counted
    out = run_tasks(lm, tasks, task_manager(tasks, [str(TASKS)]), limit=limit, bootstrap_iters=0)
    return out, runs[0]


def disagree(model, rank: int, world: int) -> str:
    """Ranks given different work (3 batches on rank 0, 2 on rank 1): the error every rank raises."""
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer
    from scalevec_lit.evaluate.lm import ScaleVecLM

    lm = ScaleVecLM(model, Tokenizer(DEFAULT_TOKENIZER), rank=rank, world_size=world)
    try:
        lm._share(list(range(3 - rank)), lambda u: u, "log-likelihood")
    except RuntimeError as err:
        return str(err)
    return "no error"


# -- the 2-process script ------------------------------------------------------------------------------------
def _rank(rank: int, world: int, port: int, weights: str, out: str) -> None:
    import torch.distributed as dist

    from scalevec_lit.evaluate.harness import metrics

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=COLLECTIVE_S))
    try:
        report: dict = {}
        for kind in KINDS:
            model = build(Path(weights))
            if kind == "fsdp2":
                from torch.distributed.device_mesh import init_device_mesh

                from scalevec_lit.lit.parallel import ParallelOptions, parallelize

                parallelize(model, init_device_mesh("cpu", (world,)), ParallelOptions())
            for name in CASES:
                results, runs = evaluate_case(model, name, rank, world)
                report[f"{kind}/{name}"] = {"runs": runs, "metrics": None if results is None else metrics(results)}
        report["disagree"] = disagree(model, rank, world)
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def two_processes(weights: Path, out: Path) -> list[dict]:
    """Run this file as the 2-process script; each rank's report. A hang is a failure after TIMEOUT s."""
    proc = subprocess.Popen([sys.executable, __file__, str(weights), str(out)], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    try:
        text, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and both ranks
        text, _ = proc.communicate()
        pytest.fail(f"the 2-process evaluation did not finish in {TIMEOUT} s (a rank waits on another):\n"
                    f"{text[-4000:]}")
    assert proc.returncode == 0, text[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


@pytest.mark.slow
def test_every_case_finishes_with_one_process_metrics(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the task YAML names its data files relative to the repository root
    torch.save(build().state_dict(), tmp_path / "weights.pt")
    reports = two_processes(tmp_path / "weights.pt", tmp_path)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build(tmp_path / "weights.pt")
        one = {name: evaluate_case(model, name) for name in CASES}
    finally:
        torch.set_num_threads(threads)
    from scalevec_lit.evaluate.harness import metrics

    for kind in KINDS:
        for name, (tasks, limit, _) in CASES.items():
            key = f"{kind}/{name}"
            r0, r1 = reports[0][key], reports[1][key]
            want, alone = metrics(one[name][0]), one[name][1]
            assert r1["metrics"] is None and r0["metrics"] is not None, key  # results on rank 0 only
            got = r0["metrics"]
            assert sorted(got) == sorted(want), key
            assert sorted({t.split("/")[0] for t in got}) == tasks, key
            for tag, value in want.items():
                if "perplexity" in tag or "bits_per_byte" in tag:
                    assert abs(got[tag] - value) <= REL * abs(value), (key, tag, got[tag], value)
                else:  # accuracies: counts of documents, equal
                    assert f32(got[tag]) == f32(value), (key, tag, got[tag], value)
            if kind == "fsdp2":  # lock-step: as many forwards on both ranks, at least the busier rank's share
                assert r0["runs"] == r1["runs"] >= (alone + 1) // 2, (key, r0["runs"], r1["runs"], alone)
            else:  # replicas: the forwards of one process, shared out, none repeated or lost
                assert r0["runs"] + r1["runs"] == alone, (key, r0["runs"], r1["runs"], alone)
            if limit == 1:  # the case under test: rank 1 has no forward of its own (rank 0 runs them all)
                assert (r0["runs"], r1["runs"]) == (alone, alone if kind == "fsdp2" else 0), key
    for report in reports:  # ranks given different requests stop together, with the counts named
        assert report["disagree"] == ("the 2 ranks were given different log-likelihood work: from 2 to 3 units "
                                      "(lm-eval must build the same requests on every rank: the same tasks, limit "
                                      "and seeds)")


if __name__ == "__main__":  # the 2-process script: python tests/test_evaluate_ranks.py WEIGHTS OUT
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(2, free_port(), sys.argv[1], sys.argv[2]), nprocs=2, join=True,
                       start_method="fork")
