"""Two hosts on one machine (issue 46 item 2): two network namespaces joined by a veth pair (``tests/netns_hosts.py``),
one ``launch/torchrun_fit.sh`` per host (``NNODES=2``, ``GPUS_PER_NODE=1``, CPU, DDP over gloo), the c10d
rendezvous at the first host's name, the data read from the S3 server (moto) that runs inside the first host on
its address. In the middle of step 5 (after the step-3 checkpoint) one fault:

- the second host's link cut (alive, unreachable: ``ip link set <veth> down`` inside its namespace);
- the second host's processes killed;
- the second host gone for good (its link cut, then its processes killed: no connection is closed, as when a
  machine loses power);
- the rendezvous host's processes killed (the agent that hosts the rendezvous and rank 0; the S3 server stays).

Each survivor prints one line naming the lost rank, its host and the step, its worker exits 75 (torchrun's summary
says ``exitcode  : 75``) and so does its launcher (torchrun itself exits 1; ``MAX_RESTARTS=0``: the exit is what is
observed), within ``peer_timeout`` (plus the heartbeat's interval and the poll) of the fault; the step-3
checkpoint is complete. A host cut off ends too: its launcher stops torchrun's agent, which hangs there. The
time from the fault to each launcher's end is printed (``pytest -s``).
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT
from netns_hosts import S3InHost, skip_reason, two_hosts

pytestmark = pytest.mark.slow  # two torchrun agents and two ranks per test, in network namespaces

PEER_TIMEOUT = 10
AGENT_GRACE = 5  # seconds the launcher gives torchrun's agent to end after its worker left with 75
STEP = 5  # the fault lands in the middle of step 5; checkpoints every 3 steps: step 3 is on disk
_ports = itertools.count(29400)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with two_hosts() as pair:
        started = time.monotonic()
        pair.s3 = S3InHost(pair.a).start(tmp_path_factory.mktemp("s3-setup"))
        print(f"S3 server inside {pair.a.hostname} ({pair.a.addr}) with the corpus: {time.monotonic() - started:.1f} s")
        yield pair


@pytest.fixture()
def fresh(hosts):
    """Each test: both links up, no process but the S3 server left afterwards."""
    yield hosts
    for host in hosts.hosts:
        host.restore()
        host.kill(keep=hosts.s3.pids())
    for host in hosts.hosts:
        host.procs[:] = [p for p in host.procs if p.pid in hosts.s3.pids() or p.wait(10) is None]


def _launch(hosts, root: Path) -> dict:
    ckpt = root / "ckpt.yaml"
    ckpt.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 3, "
        "save_last: true, save_top_k: -1}\n")
    options = [
        "--config", str(ckpt), f"--data.data_dir={hosts.s3.url}", "--trainer.max_steps=9", "--trainer.accelerator=cpu",
        "--trainer.strategy=ddp", f"--trainer.default_root_dir={root / 'run'}",
        f"--trainer.logger.init_args.save_dir={root / 'run'}", "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false", "--model.config.n_layer=1", "--model.config.n_embd=32",
        "--model.config.seq_len=32", "--data.batch_size=2", "--model.schedule.init_args.warmup_steps=2",
        "--trainer.callbacks+=host_probes.MarkStep", f"--trainer.callbacks.init_args.folder={root / 'marks'}",
        f"--trainer.callbacks.init_args.step={STEP}"]
    env = {**os.environ, **hosts.s3.env, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "NNODES": "2", "GPUS_PER_NODE": "1", "MASTER_ADDR": hosts.a.hostname,
           "MASTER_PORT": str(next(_ports)), "MAX_RESTARTS": "0", "PEER_TIMEOUT": str(PEER_TIMEOUT),
           "RUN_ID": root.name, "AGENT_GRACE": str(AGENT_GRACE),
           "TORCHRUN": str(Path(sys.executable).with_name("torchrun"))}
    command = ["bash", str(ROOT / "launch" / "torchrun_fit.sh"), str(ROOT / "recipes" / "smoke.yaml"), "", *options]
    launched = {}
    for host in hosts.hosts:
        log = root / f"{host.hostname}.log"
        proc = host.popen(command, cwd=ROOT, env={**env, "SCALEVEC_CACHE_DIR": str(root / f"cache-{host.hostname}")},
                          stdout=log.open("w"), stderr=subprocess.STDOUT)
        launched[host.hostname] = (proc, log)
    deadline = time.monotonic() + 240
    while not all((root / "marks" / f"rank{r}").exists() for r in (0, 1)):  # both ranks are in step 5
        ended = [name for name, (proc, _) in launched.items() if proc.poll() is not None]
        assert not ended and time.monotonic() < deadline, "\n".join(
            f"{name}:\n{log.read_text()[-3000:]}" for name, (_, log) in launched.items())
        time.sleep(0.1)
    ranks = {r: (root / "marks" / f"rank{r}").read_text().split()[0] for r in (0, 1)}
    assert ranks == {0: hosts.a.hostname, 1: hosts.b.hostname}  # the rendezvous orders the nodes by name
    return launched


def _wait(proc, fault: float, limit: float) -> float:
    try:
        proc.wait(limit)
    except subprocess.TimeoutExpired:
        pass
    return time.monotonic() - fault


def _line(text: str, lost, step: int, how: str) -> str:
    rank, host = lost
    return f"error: rank {rank} (host {host}): lost at step {step}: {how}; this rank stopped (exit 75); the newest " \
           f"checkpoint is step 3 ("


def _check_survivor(name: str, proc, log: Path, took: float, line: str, agent_failed: str = "") -> None:
    """``agent_failed``: torchrun's own error when its agent fails before it has seen its worker end."""
    text = log.read_text()
    print(f"{name}: launcher exit {proc.returncode} {took:.1f} s after the fault")
    assert proc.returncode == 75, text[-5000:]  # the launcher's, from its worker's note: torchrun says 1 ...
    assert (agent_failed or "exitcode  : 75") in text, text[-5000:]  # ... and names the worker's 75
    assert text.count(line) == 1 and text.count("error: rank") == 1, text[-5000:]
    assert took < PEER_TIMEOUT + 15, text[-3000:]


def _checkpoint_kept(root: Path) -> None:
    folder = root / "run" / "checkpoints"
    assert sorted(p.name for p in folder.glob("step*.ckpt")) == ["step000003.ckpt"]
    assert torch.load(folder / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == 3


HOW = {"silent": f"no heartbeat for {PEER_TIMEOUT} s (killed, stopped, or its node is down)",
       "closed": "its connection closed (killed, or its node is down)",
       "store": "the rendezvous store stopped answering"}


@pytest.mark.parametrize("fault", ["killed", "gone"])
def test_a_host_lost_ends_the_other_within_peer_timeout(fresh, tmp_path, fault):
    hosts, root = fresh, tmp_path / f"lost-{fault}"
    root.mkdir()
    launched = _launch(hosts, root)
    fault_at = time.monotonic()
    if fault == "gone":
        hosts.b.cut()  # no reset reaches host A: silence, as from a machine without power
    hosts.b.kill(keep=hosts.s3.pids())
    proc, log = launched[hosts.a.hostname]
    took = _wait(proc, fault_at, PEER_TIMEOUT + 60)
    _check_survivor(f"{fault}: {hosts.a.hostname}", proc, log, took,
                    _line(log.read_text(), (1, hosts.b.hostname), STEP, HOW["silent" if fault == "gone" else "closed"]))
    _checkpoint_kept(root)


def test_the_rendezvous_host_lost_ends_the_other_within_peer_timeout(fresh, tmp_path):
    hosts, root = fresh, tmp_path / "lost-rendezvous"
    root.mkdir()
    launched = _launch(hosts, root)
    fault_at = time.monotonic()
    hosts.a.kill(keep=hosts.s3.pids())  # torchrun's agent hosting the rendezvous, and rank 0 with its store
    proc, log = launched[hosts.b.hostname]
    took = _wait(proc, fault_at, PEER_TIMEOUT + 60)
    _check_survivor(f"rendezvous host killed: {hosts.b.hostname}", proc, log, took,
                    _line(log.read_text(), (0, hosts.a.hostname), STEP, HOW["store"]),
                    # the agent's rendezvous store (on host A) is gone: torchrun fails and stops its worker, which
                    # names the lost rank on its way out
                    agent_failed="RendezvousConnectionError: The connection to the C10d store has failed")
    _checkpoint_kept(root)


def test_a_host_cut_off_alive_ends_both_hosts_within_peer_timeout(fresh, tmp_path):
    """Host B's link down mid-step: rank 0 (host A) stops on B's silence, rank 1 (host B, alive) on its store's
    (rank 0's, on host A). Host B's torchrun agent then stays in a rendezvous store call to host A that never
    returns (torch's c10d client, not bounded by its timeout): the launcher ends it ``AGENT_GRACE`` s after its
    worker's 75, with one line of its own, and exits 75."""
    hosts, root = fresh, tmp_path / "cut"
    root.mkdir()
    launched = _launch(hosts, root)
    fault_at = time.monotonic()
    hosts.b.cut()
    proc, log = launched[hosts.a.hostname]
    took = _wait(proc, fault_at, PEER_TIMEOUT + 60)
    _check_survivor(f"cut: {hosts.a.hostname}", proc, log, took,
                    _line(log.read_text(), (1, hosts.b.hostname), STEP, HOW["silent"]))
    proc_b, log_b = launched[hosts.b.hostname]
    line_b = _line("", (0, hosts.a.hostname), STEP, HOW["store"])
    while line_b not in log_b.read_text() and time.monotonic() < fault_at + PEER_TIMEOUT + 30:
        time.sleep(0.1)
    print(f"cut: {hosts.b.hostname} (the host cut off): its rank's line {time.monotonic() - fault_at:.1f} s after "
          "the cut")
    took = _wait(proc_b, fault_at, PEER_TIMEOUT + AGENT_GRACE + 60)
    text = log_b.read_text()
    print(f"cut: {hosts.b.hostname}: launcher exit {proc_b.returncode} {took:.1f} s after the cut")
    assert proc_b.returncode == 75 and text.count(line_b) == 1 and text.count("error: rank") == 1, text[-5000:]
    assert text.count("error: launch/torchrun_fit.sh: torchrun: still running ") == 1, text[-5000:]
    assert f"its agent waits for the rendezvous host {hosts.a.hostname}, which is down or cut off" in text
    assert took < PEER_TIMEOUT + AGENT_GRACE + 20, text[-3000:]
    _checkpoint_kept(root)
