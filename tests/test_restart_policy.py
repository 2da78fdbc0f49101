"""``launch/torchrun_fit.sh``'s restart policy (issue 34 item 4): a rank killed with SIGKILL in the middle of a
step, after a checkpoint exists, and the job restarts by itself from the newest complete checkpoint
(``--ckpt_path last``) and finishes with the weights of an uninterrupted run, bitwise (CPU, DDP, gloo).

Two topologies: one torchrun with 2 processes, and 2 "nodes" (two torchrun processes, 1 process each) meeting
through the c10d rendezvous on 127.0.0.1. Every run reads its data from the S3-compatible server on 127.0.0.1
(``tests/s3_server.py``: ``s3://corpus/shakespeare``, the standard AWS environment), each "node" through a
cache folder of its own.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT, finish, free_port
from s3_server import session_server

pytestmark = pytest.mark.slow  # torchrun processes, several fits

STEPS, EVERY, KILL_AT = 9, 3, 5  # checkpoints at steps 3, 6, 9; rank 1 killed during step 5 (after 3 exists)


def _fit_options(data: str, root: Path, kill: bool, how: str = "SIGKILL") -> list[str]:
    ckpt = root / "ckpt.yaml"
    ckpt.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, "
        f"every_n_train_steps: {EVERY}, save_last: true, save_top_k: -1}}\n")
    options = [
        "--config", str(ckpt), f"--data.data_dir={data}", f"--trainer.max_steps={STEPS}", "--trainer.accelerator=cpu",
        "--trainer.strategy=ddp", f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.save_dir={root}",
        "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false", "--model.config.n_layer=1",
        "--model.config.n_embd=32", "--model.config.seq_len=32", "--data.batch_size=2",
        "--model.schedule.init_args.warmup_steps=2",
    ]
    if kill:
        options += ["--trainer.callbacks+=peer_probes.LoseRank", f"--trainer.callbacks.init_args.step={KILL_AT}",
                    f"--trainer.callbacks.init_args.signal={how}",
                    f"--trainer.callbacks.init_args.marker={root / 'lost.marker'}"]
    return options


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _launch(s3, root: Path, nodes: int, per_node: int, restarts: int, kill: bool, how: str = "SIGKILL",
            watch=None) -> list[tuple[int, str]]:
    """Run ``launch/torchrun_fit.sh`` ``nodes`` times side by side (one per "node"); (exit code, output) each.
    ``watch(procs)``, when given, runs in a thread of its own while they do (it ends before this returns)."""
    root.mkdir(parents=True)
    data = s3.url
    env = {**os.environ, **s3.env, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "NNODES": str(nodes), "GPUS_PER_NODE": str(per_node), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "MAX_RESTARTS": str(restarts), "PEER_TIMEOUT": "10",
           "RUN_ID": root.name, "TORCHRUN": str(Path(sys.executable).with_name("torchrun")), "PYTHONFAULTHANDLER": "1"}
    command = ["bash", str(ROOT / "launch" / "torchrun_fit.sh"), str(ROOT / "recipes" / "smoke.yaml"), "",
               *_fit_options(data, root, kill, how)]
    procs = [subprocess.Popen(command, cwd=ROOT, env={**env, "SCALEVEC_CACHE_DIR": str(root / f"cache-node{node}")},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for node in range(nodes)]
    results, watching = [], threading.Thread(target=watch, args=(procs,), daemon=True) if watch else None
    try:
        if watching:
            watching.start()
        for proc in procs:
            out, _ = finish(proc, 420)
            results.append((proc.returncode, out))
        if watching:
            watching.join(60)
    finally:
        for proc in procs:
            for pid in [*_descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    return results


def _final(root: Path) -> dict:
    checkpoint = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == STEPS
    return checkpoint


@pytest.fixture(scope="module")
def s3(request, tmp_path_factory):
    return session_server(request, tmp_path_factory)


@pytest.fixture(scope="module")
def uninterrupted(s3, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("restart") / "uninterrupted"
    started = time.monotonic()
    (code, out), = _launch(s3, root, 1, 2, 0, kill=False)
    print(f"uninterrupted: finished in {time.monotonic() - started:.0f} s")
    assert code == 0, out[-4000:]
    return _final(root)


def _assert_same(got: dict, expected: dict) -> None:
    assert got["state_dict"].keys() == expected["state_dict"].keys()
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][name], tensor), name
    mine, theirs = got["optimizer_states"][0]["state"], expected["optimizer_states"][0]["state"]
    assert mine.keys() == theirs.keys()
    for index, state in theirs.items():
        for key, value in state.items():
            assert torch.equal(mine[index][key], value), (index, key)


@pytest.mark.parametrize("nodes, per_node", [(1, 2), (2, 1)], ids=["2-processes", "2-nodes"])
def test_a_killed_rank_restarts_from_the_newest_checkpoint_and_finishes_bitwise(s3, tmp_path, uninterrupted, nodes,
                                                                               per_node):
    root = tmp_path / f"killed-{nodes}x{per_node}"
    started = time.monotonic()
    results = _launch(s3, root, nodes, per_node, 1, kill=True)
    took = time.monotonic() - started
    text = "\n".join(out for _, out in results)
    assert [code for code, _ in results] == [0] * nodes, text[-6000:]
    assert (root / "lost.marker").is_file()  # rank 1 was killed during step 5: torchrun saw it once ...
    assert text.count("failed (exitcode: -9)") == 1 and "Root Cause" not in text, text[-6000:]  # ... and restarted
    assert text.count("error: rank 1: lost at step 5: its connection closed (killed, or its node is down); this rank "
                      "stopped (exit 75); the newest checkpoint is step 3 (") == 1, text[-6000:]  # rank 0's line
    assert text.count(f"Restored all states from the checkpoint at {root / 'checkpoints' / 'last.ckpt'}") == 1, text[-6000:]
    assert sorted(p.name for p in (root / "checkpoints").glob("step*.ckpt")) == [
        "step000003.ckpt", "step000006.ckpt", "step000009.ckpt"]
    _assert_same(_final(root), uninterrupted)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("cache-node")) == [
        f"cache-node{n}" for n in range(nodes)]  # each "node" read the bucket through its own cache
    print(f"{nodes}x{per_node}: killed, restarted and finished in {took:.0f} s")


def test_a_stopped_rank_ends_the_group_with_75_and_torchrun_restarts_it(s3, tmp_path, uninterrupted):
    """Rank 1 stopped (SIGSTOP) during step 5 under ``launch/torchrun_fit.sh`` (one torchrun, 2 processes): it is
    alive for torchrun, so rank 0's heartbeat ends the group (its line, exit 75); torchrun then stops the workers
    (the stopped one takes its 30-second grace and SIGKILL), starts them again from the step-3 checkpoint, and the
    job finishes with the uninterrupted weights. No worker is left behind."""
    root, seen = tmp_path / "stopped", {}

    def watch(procs):  # when rank 0 (the worker that is not the stopped one) and the stopped worker end
        marker, deadline = root / "lost.marker", time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stopped = seen["lost"] = int(marker.read_text())
        workers = [p for p in _descendants(procs[0].pid) if "scalevec_lit" in _cmdline(p) and p != stopped]
        for name, pids in (("rank 0", workers), ("stopped", [stopped])):
            while any(_cmdline(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            seen[name] = time.time() - marker.stat().st_mtime

    try:
        (code, out), = _launch(s3, root, 1, 2, 1, kill=True, how="SIGSTOP", watch=watch)
    finally:
        for signum in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, KeyError):
                os.kill(seen["lost"], signum)
    assert code == 0, out[-6000:]
    assert out.count("error: rank 1: lost at step 5: no heartbeat for 10 s (killed, stopped, or its node is down); "
                     "this rank stopped (exit 75); the newest checkpoint is step 3 (") == 1, out[-6000:]
    assert out.count("failed (exitcode: 75) local_rank: 0") == 1, out[-6000:]  # torchrun saw rank 0's 75
    assert out.count(f"Restored all states from the checkpoint at {root / 'checkpoints' / 'last.ckpt'}") == 1
    _assert_same(_final(root), uninterrupted)
    assert not _cmdline(seen["lost"]), f"the stopped rank {seen['lost']} outlived the job"
    print(f"SIGSTOP under torchrun: rank 0 ended {seen['rank 0']:.1f} s after rank 1 was stopped, the stopped rank "
          f"{seen['stopped']:.1f} s after")


def _cmdline(pid: int) -> str:
    """The command line of a live process (not a zombie), else ``""``."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return "" if state in ("Z", "X") else Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, IndexError):
        return ""
