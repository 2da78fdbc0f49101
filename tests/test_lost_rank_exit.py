"""How a rank that lost a peer leaves: exit 75 after its one line, whatever the watchdog thread is doing.

A whole-suite run once saw the survivor of ``test_lost_rank.py``'s SIGKILL case print its line, then
``terminate called without an active exception`` and die with -6: its main thread had named the lost rank
and left through a normal interpreter exit while the watchdog thread was inside a store call (C++, the GIL
released); returning from it while the interpreter finalized ended that thread by ``pthread_exit``, whose
unwinding through C++ aborts. Here the watchdog is held in a store call (a ``wait`` for a key that never
comes, 2 s) and the interpreter's teardown takes 3 s (an object whose ``__del__`` sleeps, as a loaded
machine's teardown of torch and Lightning may): the overlap that was a race is certain.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from helpers import ROOT
from scalevec_lit.lit import peers

SURVIVOR = """
import sys, time
from datetime import timedelta
from types import SimpleNamespace
import torch.distributed as dist
from scalevec_lit.errors import run_guarded
from scalevec_lit.lit import peers

server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                       timeout=timedelta(seconds=5))
watch = peers.PeerWatch(2.0)  # a poll every 0.2 s
watch.rank, watch.world, watch._store = 0, 2, dist.PrefixStore("run", client)
watch._seen = {1: (-1, time.monotonic())}
# the watchdog's next store call, in flight for 2 s (a connection of its own: a call on the shared one would make
# finish()'s mark wait for it, which hides the race only as long as the watchdog has no further call to make)
slow = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5))
watch._beat = lambda: slow.wait(["never"], timedelta(seconds=2))
watch.name_lost = lambda: ([1], "its process ended (killed by SIGKILL)")


class SlowTeardown:
    def __del__(self, sleep=time.sleep):  # module globals are gone by then
        print("teardown ran", flush=True)
        sleep(3)


teardown = SlowTeardown()


def fit(argv):
    watch._thread = peers.threading.Thread(target=watch._run, daemon=True)
    watch._thread.start()
    peers._active = watch
    time.sleep(0.6)  # the watchdog is in its store call now
    with peers.translate():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Read error: Connection reset by peer")


run_guarded(fit, sys.argv[1:])
"""


@pytest.mark.slow
def test_the_main_thread_leaves_with_75_while_the_watchdog_is_in_a_store_call(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SCALEVEC_DEBUG", None)
    res = subprocess.run([sys.executable, "-c", SURVIVOR], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 75, out[-3000:]
    assert "terminate called" not in out and "teardown ran" not in out, out[-3000:]  # left at once
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: rank 1: lost at step 0: its process ended (killed by SIGKILL); this rank stopped (exit 75); no "
        "checkpoint was written yet; resume with the same command and --ckpt_path last (launch/torchrun_fit.sh "
        "restarts by itself, MAX_RESTARTS times); a slow but healthy cluster needs a larger --peer_timeout "
        "(seconds)"], out[-3000:]
    assert "Traceback" not in out and "Connection reset by peer" not in out, out[-3000:]


def test_with_debug_the_traceback_comes_first_then_the_line_and_the_exit(monkeypatch, capsys):
    """``--debug`` shows the traceback (the collective's failure, then the lost rank), and still leaves at once."""
    from scalevec_lit import errors

    codes = []
    monkeypatch.setattr(errors.os, "_exit", codes.append)  # returns here: run_guarded then raises it again
    monkeypatch.setenv(errors.DEBUG_ENV, "0")  # restored afterwards (--debug sets it)

    def fit(argv):
        with peers.translate():
            raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Read error: Connection reset by peer")

    watch = peers.PeerWatch(4.0)
    watch.name_lost = lambda: ([1], "its connection closed (killed, or its node is down)")
    monkeypatch.setattr(peers, "_active", watch)
    monkeypatch.setattr(peers, "_reported", False)
    with pytest.raises(peers.PeerLostError):
        errors.run_guarded(fit, ["fit", "--debug"])
    assert codes == [75]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "RuntimeError: [gloo/transport/tcp/pair.cc:534] Read error: Connection reset by peer" in lines
    assert [i for i, line in enumerate(lines) if line.startswith("error: ")] == [len(lines) - 1]
    assert lines[-1].startswith("error: rank 1: lost at step 0: its connection closed (killed, or its node is down); "
                                "this rank stopped (exit 75); no checkpoint was written yet; resume with")


def test_finish_waits_for_the_watchdog_to_leave_its_store_call():
    """Every other end of fit (done, an error of its own, a stop signal) exits normally: the watchdog must not
    be in C++ then, so ``finish`` waits for it (a store call's timeout at most)."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    watch = peers.PeerWatch(60.0)  # never lost here (a watchdog that exits would end pytest), however slow
    watch.interval = 0.1
    watch.rank, watch.world, watch._store = 0, 2, dist.PrefixStore("finish", server)
    watch._seen = {1: (-1, time.monotonic())}
    other = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=5))  # its own connection: see SURVIVOR
    calls = []

    def slow_beat():
        calls.append(time.monotonic())
        other.wait(["never"], timedelta(seconds=0.8))  # raises after 0.8 s: the poll fails, the loop ends

    watch._beat = slow_beat
    watch._thread = threading.Thread(target=watch._run, daemon=True)
    watch._thread.start()
    try:
        while not calls:
            time.sleep(0.02)
        start = time.monotonic()
        watch.finish()
        assert not watch._thread.is_alive()
        assert time.monotonic() - start < watch.store_timeout + 1.0 == 11.0  # bounded by one call's timeout
        assert len(calls) == 1 and server.add("finish/done/0", 0) == 1
    finally:  # a failure here must not leave the thread in its call when pytest exits (the abort itself)
        watch._stop.set()
        watch._thread.join(5)


def test_the_watchdog_completes_a_one_file_write_before_its_line_and_exit(monkeypatch, capsys, tmp_path):
    """The watchdog leaves while the main thread is blocked in a collective: a one-file checkpoint being written
    in the background (its step already recorded) is completed first, so the line's checkpoint exists."""
    events = []
    last = tmp_path / "c" / "last.ckpt"

    class Checkpoints:
        last_model_path, _last_global_step_saved, dirpath = str(last), 6, str(last.parent)

        def wait_for_writes(self, trainer, raise_error=True, distributed=True):
            events.append(("wait", trainer is watch._trainer, raise_error, distributed))
            last.parent.mkdir()
            torch.save({"global_step": 6}, last)  # the write completes here: the line reads it from the disk

    watch = peers.PeerWatch(4.0)
    watch._trainer = SimpleNamespace(checkpoint_callback=Checkpoints())
    watch.step = 7
    monkeypatch.setattr(peers, "_reported", False)
    monkeypatch.setattr(peers.os, "_exit", lambda code: events.append(("exit", code)))
    watch._lost_now([1], "no heartbeat for 4 s (killed, stopped, or its node is down)")
    assert events == [("wait", True, False, False), ("exit", 75)]  # a distributed write is not waited for
    assert capsys.readouterr().err.startswith(
        "error: rank 1: lost at step 7: no heartbeat for 4 s (killed, stopped, or its node is down); this rank "
        f"stopped (exit 75); the newest checkpoint is step 6 ({last}), the steps after it are lost; resume")


def test_lightnings_kill_after_a_child_ended_becomes_the_line_and_75(monkeypatch, capsys):
    """Under Lightning's own launcher its observer SIGKILLs rank 0 (no line, -9) within 5 s of a child's end: a
    race with the line that a loaded machine lost. While the watch runs, that kill is the line and exit 75."""
    from scalevec_lit.lit._observer import OBSERVER, replace_kill

    dead = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead.wait()
    try:
        kills, exits = [], []
        observer = SimpleNamespace(name=OBSERVER, _terminate_all=lambda: kills.append("lightning"))
        watch = peers.PeerWatch(4.0)
        watch._trainer = SimpleNamespace(strategy=SimpleNamespace(launcher=SimpleNamespace(procs=[dead, alive])),
                                         node_rank=0, num_devices=3)
        assert replace_kill(watch._observer_kill, [SimpleNamespace(name="other"), observer])
        monkeypatch.setattr(peers.os, "_exit", exits.append)
        monkeypatch.setattr(peers, "_reported", True)  # the main thread has the line: it leaves with 75 itself
        observer._terminate_all()
        assert (kills, exits, alive.poll()) == ([], [], None)
        monkeypatch.setattr(peers, "_reported", False)
        observer._terminate_all()
        assert (kills, exits, alive.wait(10)) == ([], [75], -9)  # the other children killed, as Lightning does
        assert capsys.readouterr().err.startswith(
            "error: rank 1: lost at step 0: its process ended (killed by SIGKILL); this rank stopped (exit 75); no "
            "checkpoint was written yet; resume with")
        monkeypatch.setattr(peers, "_reported", False)
        watch.finish()  # this rank ended on its own: Lightning's kill, as without the watch
        observer._terminate_all()
        assert (kills, exits) == (["lightning"], [75])
    finally:
        alive.kill()
        alive.wait()
