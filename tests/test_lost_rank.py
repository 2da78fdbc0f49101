"""A lost rank (issue 34 item 4): the others stop in bounded time with one line naming it and the step, exit 75.

The heartbeat and the mapping of collective failures are checked in-process against a real ``TCPStore``; the
two slow tests run the issue's scenario (``fit --trainer.devices=2 --trainer.strategy=ddp`` on CPU, gloo) and
lose rank 1 in the middle of step 5 (``peer_probes.LoseRank``), once by SIGKILL and once by SIGSTOP.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from helpers import ROOT, finish, free_port, smoke_args
from scalevec_lit.errors import UserError, report
from scalevec_lit.lit import peers


def test_collective_failures_are_recognised():
    assert peers.is_collective_failure(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Read error: Connection reset by peer"))
    assert peers.is_collective_failure(dist.DistBackendError("NCCL communicator was aborted"))
    assert peers.is_collective_failure(RuntimeError("[gloo] Timed out waiting 5000ms for recv operation"))
    assert not peers.is_collective_failure(ValueError("data.batch_size: 0"))
    assert not peers.is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_lost_rank_is_one_line_with_its_exit_code(capsys):
    err = peers.lost_error([1], 117, "its connection closed (killed, or its node is down)",
                           "the newest checkpoint is step 100 (runs/checkpoints/last.ckpt), the steps after it are lost")
    assert report(err) == peers.PEER_LOST_EXIT == 75
    line = capsys.readouterr().err
    assert line == (
        "error: rank 1: lost at step 117: its connection closed (killed, or its node is down); this rank stopped "
        "(exit 75); the newest checkpoint is step 100 (runs/checkpoints/last.ckpt), the steps after it are lost; "
        "resume with the same command and --ckpt_path last (launch/torchrun_fit.sh restarts by itself, "
        "MAX_RESTARTS times); a slow but healthy cluster needs a larger --peer_timeout (seconds)\n")


def test_install_sets_the_process_group_timeout_and_the_heartbeat():
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    for strategy, seconds, expected in ((DDPStrategy(), 300.0, 300), (ModelParallelStrategy(), 5.0, 60)):
        trainer = SimpleNamespace(strategy=strategy, callbacks=[])
        peers.install(trainer, seconds)
        assert strategy._timeout == timedelta(seconds=expected)  # at least a minute: it bounds the rendezvous too
        assert [type(c) for c in trainer.callbacks] == [peers.PeerWatch] and trainer.callbacks[0].timeout == seconds
    with pytest.raises(UserError, match=r"^peer_timeout: 0: must be a positive number of seconds; set e.g. "
                                              r"--peer_timeout=300$"):
        peers.install(SimpleNamespace(strategy=DDPStrategy(), callbacks=[]), 0)
    assert peers.heartbeat_interval(300) == 5.0 and peers.heartbeat_interval(4) == 0.4


@pytest.fixture()
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    yield dist.PrefixStore("test", server)


def _watch(store, timeout: float, rank: int = 0, world: int = 3) -> peers.PeerWatch:
    watch = peers.PeerWatch(timeout)
    watch.rank, watch.world, watch._store = rank, world, store
    watch._seen = {r: (-1, time.monotonic()) for r in range(world) if r != rank}
    return watch


def test_a_peer_silent_for_the_timeout_is_lost_one_that_finished_is_not(store):
    watch = _watch(store, 0.6)
    for peer in (1, 2):
        store.add(f"beat/{peer}", 1)
    assert watch._poll() == []
    store.add("done/2", 1)  # rank 2 finished on its own: never reported
    polls, deadline = 1, time.monotonic() + 0.5
    while time.monotonic() < deadline:
        assert watch._poll() == []
        polls += 1
        time.sleep(0.1)
    time.sleep(0.2)
    assert watch._poll() == [1]
    assert store.add("beat/0", 0) == polls + 1  # it beats at every poll


def test_after_a_failed_collective_the_silent_peer_is_named(store):
    watch = _watch(store, 2.0)  # interval 0.2 s: a window of 1 s
    stop = threading.Event()

    def survivor():  # rank 2 keeps beating, as every survivor does while it names the lost
        while not stop.wait(0.1):
            store.add("beat/2", 1)

    beating = threading.Thread(target=survivor)
    beating.start()
    try:
        store.add("beat/1", 3)
        assert watch.name_lost() == ([1], "its connection closed (killed, or its node is down)")
        store.add("done/1", 1)
        assert watch.name_lost() == ([1], "it stopped on an error of its own (its own message says which)")
    finally:
        stop.set()
        beating.join()


class _Watch:
    """What ``translate`` asks of the active watch, with the answer of ``name_lost`` given."""

    def __init__(self, lost, how):
        self.answer, self.step, self.interval, self.finished = (lost, how), 117, 0.2, False
        self._trainer = None  # not Lightning's launcher: no child ranks

    def name_lost(self):
        return self.answer

    def finish(self):
        self.finished = True

    def _newest_checkpoint(self):
        return "the newest checkpoint is step 100 (c/last.ckpt), the steps after it are lost"


@pytest.fixture()
def active(monkeypatch):
    def make(lost, how=""):
        watch = _Watch(lost, how)
        monkeypatch.setattr(peers, "_active", watch)
        monkeypatch.setattr(peers, "_reported", False)
        return watch
    return make


def _translated(err: BaseException) -> BaseException:
    try:
        with peers.translate():
            raise err
    except BaseException as raised:  # noqa: BLE001 - what translate let out
        return raised
    raise AssertionError("nothing raised")


def test_translate_names_the_lost_rank_and_leaves_other_errors_alone(active):
    from scalevec_lit.stopsignal import StopSignal

    reset = RuntimeError("[gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:4242: Connection reset by peer")
    watch = active([1], "its connection closed (killed, or its node is down)")
    got = _translated(reset)
    assert isinstance(got, peers.PeerLostError) and got.__cause__ is reset and watch.finished
    assert str(got).startswith("rank 1: lost at step 117: its connection closed (killed, or its node is down); this "
                               "rank stopped (exit 75); the newest checkpoint is step 100 (c/last.ckpt)")
    stop = StopSignal(15)  # torchrun stops the survivors of a lost worker with SIGTERM
    active([1], "its connection closed (killed, or its node is down)")
    assert str(_translated(stop)).startswith(
        "rank 1: lost at step 117: its connection closed (killed, or its node is down), and the launcher stopped "
        "this rank;")
    active([], "")  # nobody lost: a stop signal of its own, an error that only reads like a network one
    assert _translated(stop) is stop
    active([], "")
    reader = RuntimeError("socket timeout while reading the tokenizer")
    assert _translated(reader) is reader
    active([], "")
    backend = dist.DistBackendError("[gloo] Timed out waiting 60000ms")  # a c10d error: a peer, unnamed
    assert str(_translated(backend)) == (
        "a collective: failed at step 117: [gloo] Timed out waiting 60000ms (every rank is alive: one waited longer "
        "than the process group timeout for another); this rank stopped (exit 75); the newest checkpoint is step 100 "
        "(c/last.ckpt), the steps after it are lost; a rank that legitimately runs ahead of the others for long (a "
        "long write or compile on one rank) needs a larger --peer_timeout (seconds); resume with the same command "
        "and --ckpt_path last")
    active([1], "")
    mistake = ValueError("data.batch_size: 0")
    assert _translated(mistake) is mistake  # not a collective failure


def _launched(*procs) -> SimpleNamespace:
    """A trainer under Lightning's own launcher, whose other local ranks are ``procs`` (children of rank 0)."""
    return SimpleNamespace(strategy=SimpleNamespace(launcher=SimpleNamespace(procs=list(procs))))


def test_rank_0_kills_the_ranks_it_launched_before_it_leaves(active, monkeypatch):
    """Under Lightning's own launcher the other local ranks are rank 0's children, which Lightning kills on Ctrl-C
    only. A rank 0 that leaves after a lost peer, from its main thread (``translate``) or its watchdog, kills those
    still running first: a stopped one (SIGSTOP, a hung driver) would otherwise outlive the run."""
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)]
    try:
        for child in children:
            os.kill(child.pid, signal.SIGSTOP)
        watch = active([1], "its connection closed (killed, or its node is down)")
        watch._trainer = _launched(children[0])
        assert isinstance(_translated(RuntimeError("[gloo] Connection reset by peer")), peers.PeerLostError)
        assert children[0].wait(10) == -signal.SIGKILL and children[1].poll() is None
        exits = []
        monkeypatch.setattr(peers.os, "_exit", exits.append)
        monkeypatch.setattr(peers, "_reported", False)
        dog = peers.PeerWatch(4.0)
        dog._trainer = _launched(children[0], children[1])  # one ended already, one stopped
        dog._lost_now([1], "no heartbeat for 4 s (killed, stopped, or its node is down)")
        assert exits == [75] and children[1].wait(10) == -signal.SIGKILL
    finally:
        for child in children:
            child.kill()
            child.wait()


def _left_running(pid: int, wait: float = 10.0) -> str:
    """The state of ``pid`` if it is still a live process after ``wait`` seconds (``T``: stopped), else ``""``."""
    deadline = time.monotonic() + wait
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return ""
        if state in ("Z", "X") or time.monotonic() > deadline:
            return "" if state in ("Z", "X") else state
        time.sleep(0.1)


def test_a_stop_signal_while_the_lost_rank_is_named_does_not_cut_the_line(active):
    """torchrun stops the survivors of a dead worker with SIGTERM, often while they name it: that signal is
    held for that second (the rank is stopping anyway, with the line saying why), and counts again after."""
    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        watch = active([1], "its connection closed (killed, or its node is down)")

        def name_lost():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs here, if one runs
            return watch.answer

        watch.name_lost = name_lost
        raised = _translated(RuntimeError("[gloo] Connection reset by peer"))
        assert isinstance(raised, peers.PeerLostError) and got == []
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert got == [signal.SIGTERM]  # the handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the scenario: 2 processes, DDP on CPU, rank 1 lost in the middle of step 5 ---------------------
PEER_TIMEOUT = 4.0


def _fit_args(data: Path, root: Path, how: str) -> list[str]:
    ckpt = root / "ckpt.yaml"
    ckpt.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        "      init_args: {filename: 'step{step:06d}', auto_insert_metric_name: false, every_n_train_steps: 3,"
        " save_last: true, save_top_k: -1}\n")
    return smoke_args(
        data, root, 10, "--config", str(ckpt), "--trainer.devices=2", "--trainer.accelerator=cpu",
        "--trainer.strategy=ddp", "--trainer.limit_val_batches=0", "--model.config.n_layer=1",
        "--model.config.n_embd=32", "--model.config.seq_len=32", "--data.batch_size=2",
        f"--peer_timeout={PEER_TIMEOUT}", "--trainer.callbacks+=peer_probes.LoseRank",
        "--trainer.callbacks.init_args.step=5", f"--trainer.callbacks.init_args.signal={how}",
        f"--trainer.callbacks.init_args.marker={root / 'lost.marker'}")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_lost_rank_stops_the_other_with_one_line(prepared_data, tmp_path, how):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONFAULTHANDLER": "1"}
    log = tmp_path / "out.txt"
    marker = tmp_path / "lost.marker"
    lost_pid = None
    with open(log, "w") as sink:  # a file, not a pipe: the stopped rank keeps a pipe open
        proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *_fit_args(prepared_data, tmp_path, how)],
                                cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        finish(proc, 300, log)
        took = time.time() - marker.stat().st_mtime  # from the loss to this process's end
        lost_pid = int(marker.read_text())
        left = _left_running(lost_pid)  # rank 1 is rank 0's child: rank 0 ends it before it leaves
    finally:
        for pid in filter(None, (proc.pid if proc.poll() is None else None, lost_pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    out = log.read_text()
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 75, out[-3000:]
    assert not left, f"rank 1 (pid {lost_pid}) outlived the run, in state {left}"
    assert len(errors) == 1 and "Traceback" not in out, out[-3000:]
    # a killed child is seen ended by its parent, or (when the socket closes before the process is reaped) as
    # silent in the store
    whys = (["its process ended (killed by SIGKILL)", "its connection closed (killed, or its node is down)"]
            if how == "SIGKILL" else [f"no heartbeat for {PEER_TIMEOUT:g} s (killed, stopped, or its node is down)"])
    first, _, tail = errors[0].partition("; ")
    head, _, why = first.rpartition(": ")
    assert head == "error: rank 1: lost at step 5" and why in whys, errors[0]
    assert tail.startswith("this rank stopped (exit 75); the newest checkpoint is step 3 ("), errors[0]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["last.ckpt", "step000003.ckpt"]
    assert took < PEER_TIMEOUT + 20, took  # bounded: seconds here, not the process group's 30 minutes
    print(f"{how}: rank 0 stopped {took:.1f} s after rank 1 was lost")
