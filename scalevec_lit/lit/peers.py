"""A lost rank: the other ranks stop in bounded time with one line naming it and the step (exit 75).

With several processes, one that dies (SIGKILL, a crashed node) or stops answering (SIGSTOP, a hung
driver) leaves the others in a collective: gloo fails within a second or two when a peer's socket closes
(``Connection reset by peer``), but waits for the process group's timeout (30 minutes by default) when the
peer is merely silent. Two mechanisms bound that wait, both set by the top-level ``peer_timeout`` (seconds):

- the process group's own timeout (``timeout=`` of Lightning's DDP and ModelParallel strategies) is set to
  it (at least a minute: it also bounds the start-up rendezvous), so a collective that waits longer raises;
- every rank beats a counter in the rendezvous store (the ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT`` that
  torchrun or Lightning already set up; a thread of its own, its own connection and timeout) and watches the
  others' counters. A peer whose counter has not moved for ``peer_timeout`` seconds is lost: this process
  prints the line and exits, even while its main thread is blocked inside a collective that Python cannot
  interrupt. A store that stops answering means its host is lost (rank 0 under Lightning's own launcher,
  the node running the rendezvous under torchrun).

When a collective fails (``translate``), the ranks that stopped beating are named: the survivors keep beating
for a short window (three heartbeat intervals), so only the lost ones fall silent. A rank that finishes or
fails on its own marks itself done first, so that it is never reported as lost. The line itself, its exit code
and which failures are a peer's: ``lit/peer_errors.py``.

How a survivor leaves: after its one line, by ``os._exit(75)`` (streams flushed), from the watchdog or the main
thread (``PeerLostError.leave_at_once``, ``errors.leave``). A normal exit is not safe with a broken process group
(NCCL's teardown may hang), and a thread returning from C++ (the watchdog in a store call) while the interpreter
finalizes is ended by ``pthread_exit``, which aborts (``terminate called without an active exception``, -6).
Before the line, a one-file checkpoint being written in the background is completed (the checkpoint callback's
``on_exception`` on the main thread, ``_finish_writes`` on the watchdog's); a distributed one stays ``.tmp``.
Any other end of ``fit`` goes through ``finish``, which waits for the watchdog to leave its store call.

What a lost peer leaves: the newest complete checkpoint. The step in flight is not saved: under FSDP2 the
survivors hold only their shards; under DDP rank 0 holds a full copy of the weights and optimizer state, but
the data position and the loop's counters are only consistent between steps, and writing them needs
collectives. So checkpoint often enough (asynchronously, ``docs/scale-out.md``) and let the launcher restart
the job from ``--ckpt_path last`` (``launch/torchrun_fit.sh``'s restart policy).
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Iterator, Optional

from lightning.pytorch.callbacks import Callback

from .. import stopsignal
from ..runlock import checkpoints_in
from ._observer import children_ended, kill_children, replace_kill
from .peer_errors import (  # noqa: F401 - the line of a lost rank (peer_errors.py); importable from here too
    DEFAULT_PEER_TIMEOUT, PEER_LOST_EXIT, TIMEOUT_KEY, PeerLostError, is_c10d_error, is_collective_failure, lost_error,
    peer_timeout_argument, unnamed_error)
from .peer_store import _Call, _store_client, clear_lost_note, heartbeat_interval, note_lost  # noqa: F401

MIN_GROUP_TIMEOUT = 60.0  # seconds: the process group's timeout also bounds the start-up rendezvous

_active: Optional["PeerWatch"] = None
_report_lock = threading.Lock()
_reported = False


class PeerWatch(Callback):
    """Heartbeat and watchdog of one rank during ``fit`` (added by the CLI; nothing to configure here)."""

    def __init__(self, timeout: float = DEFAULT_PEER_TIMEOUT) -> None:
        self.timeout = float(timeout)
        self.interval = heartbeat_interval(self.timeout)
        self.store_timeout = max(self.interval * 2, 5.0)  # of one store call (its own connection)
        self._step = 0
        self.rank, self.world = 0, 1
        self._seen: dict[int, tuple[int, float]] = {}  # peer -> (counter, local time it last moved)
        self._store_ok = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._store = None
        self._trainer = None
        self._call: Optional[_Call] = None  # the watchdog's store call in flight
        self._hosts: dict[int, str] = {}  # rank -> its host's name, as that rank published it

    # -- Lightning hooks ---------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        import torch.distributed as dist

        global _active
        if stage != "fit" or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        clear_lost_note()  # a note of an earlier start: this one has not lost a peer
        self.rank, self.world, self._trainer = dist.get_rank(), dist.get_world_size(), trainer
        try:
            self._store = _store_client(self.store_timeout)
        except Exception as err:  # noqa: BLE001 - the process group's timeout still bounds a wait
            from ..notices import notice

            notice(f"{TIMEOUT_KEY}: no heartbeat between the ranks ({type(err).__name__}: {err}); a lost rank is "
                   f"still noticed within the process group's timeout", kind="warning")
            return
        now = time.monotonic()
        self._seen = {r: (-1, now) for r in range(self.world) if r != self.rank}
        self._store_ok = now
        self._beat()
        with suppress(Exception):  # the line then names the rank without its host
            self._store.set(f"host/{self.rank}", socket.gethostname())
        self._thread = threading.Thread(target=self._run, name="scalevec-peer-watch", daemon=True)
        self._thread.start()
        _active = self
        replace_kill(self._observer_kill)

    def _observer_kill(self, kill) -> None:
        """Instead of Lightning's kill of this process after a child rank ended (``_observer.py``): the line and
        exit 75, the other children killed as Lightning does; nothing while the main thread prints the line."""
        ended = None if self._stop.is_set() else children_ended(self._trainer)
        if _reported or ended is None:
            return None if _reported else kill()  # the main thread leaves with 75; or this rank ended on its own
        kill_children(self._trainer)
        self._lost_now(*ended)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step = trainer.global_step

    @property
    def step(self) -> int:
        """The step the run reached: the trainer's optimizer steps now (read from the watchdog thread too), at least
        the step whose batch started last. A rank lost after step N-1's update, while step N's checkpoint is saved
        (rank 0 writes it, then waits in a barrier), is lost at step N, as that checkpoint says."""
        live = 0
        with suppress(Exception):  # no trainer (yet), or one without its loops
            live = int(self._trainer.global_step)
        return max(self._step, live)

    @step.setter
    def step(self, value: int) -> None:
        self._step = value

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not (is_collective_failure(exception) or type(exception).__name__ == "StopSignal"):
            self.finish()  # an error of its own; a stop signal is judged by ``translate``

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self.finish()

    # -- the heartbeat -----------------------------------------------------------------------------------
    def _beat(self) -> None:
        self._store.add(f"beat/{self.rank}", 1)

    def _poll(self) -> list[int]:
        """Beat once, read the peers' counters; the peers silent for ``timeout`` seconds."""
        self._beat()
        now = time.monotonic()
        self._store_ok = now
        for peer, (count, moved) in list(self._seen.items()):
            if self._store.add(f"done/{peer}", 0):  # it stopped on its own
                del self._seen[peer]
                continue
            current = self._store.add(f"beat/{peer}", 0)
            self._seen[peer] = (current, now) if current != count else (count, moved)
            if peer not in self._hosts and self._store.check([f"host/{peer}"]):
                self._hosts[peer] = self._store.get(f"host/{peer}").decode(errors="replace")
        # a peer is watched once it has beaten (one still starting is left to the process group's timeout)
        return sorted(p for p, (count, moved) in self._seen.items() if count > 0 and now - moved >= self.timeout)

    def _counters(self, peers) -> dict[int, tuple[int, int]]:
        return {p: (self._store.add(f"beat/{p}", 0), self._store.add(f"done/{p}", 0)) for p in peers}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self._call is None or self._call.done.is_set():  # else the last call still waits for an answer
                self._call = _Call(self._poll)
            try:
                lost = self._call.wait(self.store_timeout)
            except Exception:  # noqa: BLE001 - the store's host is gone, cut off, or not answering
                if time.monotonic() - self._store_ok >= self.timeout:
                    self._lost_now(self._store_host(), "the rendezvous store stopped answering")
                continue
            if lost:
                self._lost_now(lost, f"no heartbeat for {self.timeout:g} s (killed, stopped, or its node is down)")

    def _store_host(self) -> list[int]:
        return [] if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else [0]

    def _lost_now(self, lost: list[int], how: str) -> None:
        """From the watchdog thread: the main thread may be blocked in a collective; print and leave."""
        if self._stop.is_set():
            return
        self._finish_writes()
        newest = self._newest_checkpoint()
        self._release_lock()
        host = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        if say(lost_error(lost, self.step, how, newest, self.other_hosts()) if lost else
               unnamed_error(self.step, how, f"its host {host}, torchrun's agent on the first node, is down or stopped",
                             newest)):
            note_lost()
            kill_children(self._trainer)  # Lightning's launcher: no child rank outlives this one (``_observer.py``)
            os._exit(PEER_LOST_EXIT)

    def other_hosts(self) -> dict[int, str]:
        """The hosts of the ranks on another host than this one (named in the line): none on one machine."""
        mine = socket.gethostname()
        return {rank: host for rank, host in self._hosts.items() if host != mine}

    def _finish_writes(self) -> None:
        """Complete a one-file checkpoint being written in the background (no other rank needed): the line names it."""
        wait = getattr(getattr(self._trainer, "checkpoint_callback", None), "wait_for_writes", None)
        with suppress(Exception):  # the line matters more than that write
            wait and wait(self._trainer, raise_error=False, distributed=False)

    def _release_lock(self) -> None:
        """The checkpoint folder's ``run.lock``, released as ``on_exception`` does on the main thread (which is
        blocked in a collective here): a restart on another host would otherwise be refused by it."""
        for callback in getattr(self._trainer, "checkpoint_callbacks", None) or []:
            with suppress(Exception):  # the line matters more than the lock
                getattr(callback, "_unlock", lambda: None)()

    def _newest_checkpoint(self) -> str:
        """What is kept: the newest complete checkpoint's step and file (the steps after it are lost), as on disk:
        the callback records a save when it starts, and an asynchronous or distributed write in flight (rank 0
        renames the folder) may never be completed by the lost rank."""
        from ..checkpoint.folder import step_on_disk

        callback = getattr(self._trainer, "checkpoint_callback", None)
        path = str(getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "") or "")
        saved = getattr(callback, "_last_global_step_saved", 0) or 0
        folder = getattr(callback, "dirpath", None) or (Path(path).parent if path else None)
        found = [(step_on_disk(q), str(q)) for q in checkpoints_in(Path(folder))] if folder else []
        # a save is recorded once it returns: rank 0 writes a one-file checkpoint, then waits for the others in a
        # barrier, so step N's file may be complete (and what --ckpt_path last resumes) with the record at N-1
        found = sorted((s, q) for s, q in found if s is not None and s <= max(saved, self.step))
        if path and saved and step_on_disk(path) == saved and not (found and found[-1][0] > saved):
            return f"the newest checkpoint is step {saved} ({path}), the steps after it are lost"
        pending = f"step {saved}'s was being written and is not complete ({Path(path).name}.tmp or missing)"
        if not found:
            return f"no checkpoint is complete ({pending}): a restart begins at step 0" if saved else ""
        step, newest = found[-1]
        if step >= saved:  # the record named a copy (last) still being made, or lags a complete write
            return f"the newest checkpoint is step {step} ({newest}), the steps after it are lost"
        return f"the newest complete checkpoint is step {step} ({newest}; {pending}), the steps after it are lost"

    def finish(self) -> None:
        """This rank stops on its own: mark it done (never reported as lost), stop watching, and wait for the
        watchdog to leave the store call it may be in (module docstring; a failed call ends its poll)."""
        global _active
        if self._store is not None and not self._stop.is_set():
            with suppress(Exception):  # the store's host may be gone (or cut off) already
                _Call(lambda: self._store.add(f"done/{self.rank}", 1)).wait(self.store_timeout)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.store_timeout + 1.0)
        if self._call is not None:
            self._call.thread.join(self.store_timeout + 1.0)
        if _active is self:
            _active = None

    def name_lost(self) -> tuple[list[int], str]:
        """After a failed collective: the peers whose counters do not move for three heartbeat intervals
        (this rank's watchdog keeps beating meanwhile, and so do the other survivors')."""
        ended = children_ended(self._trainer)
        if ended:
            return ended
        peers = [r for r in range(self.world) if r != self.rank]
        try:
            before = _Call(lambda: self._counters(peers)).wait(self.store_timeout)
            time.sleep(max(3 * self.interval, 1.0))
            after = _Call(lambda: self._counters(peers)).wait(self.store_timeout)
        except Exception:  # noqa: BLE001 - the store's host is gone or cut off
            return self._store_host(), "the rendezvous store stopped answering"
        lost = [p for p in peers if after[p] == before[p] and not after[p][1]]
        if lost:
            return lost, "its connection closed (killed, or its node is down)"
        done = [p for p in peers if after[p][1]]
        if done:
            return done, "it stopped on an error of its own (its own message says which)"
        return [], ""


def say(err: PeerLostError) -> bool:
    """Print ``err`` once per process (watchdog or main thread), stdout flushed first: ``os._exit`` follows."""
    global _reported
    with _report_lock:
        if _reported:
            return False
        _reported = True
    with suppress(Exception):  # a closed stdout: the line still goes to stderr
        sys.stdout.flush()
    print(f"error: {err}", file=sys.stderr, flush=True)
    return True


@contextmanager
def translate() -> Iterator[None]:
    """Around ``fit``: a failed collective while a peer watch runs becomes ``PeerLostError`` (one line, 75);
    so does a stop signal that arrives because a peer is lost (torchrun stops the other workers of a group
    when one dies: the line names the lost rank rather than the signal)."""
    global _reported
    try:
        yield
    except BaseException as err:
        watch = _active
        stopped = type(err).__name__ == "StopSignal"
        if watch is None or not (stopped or is_collective_failure(err)):
            raise
        with _report_lock:
            claimed, _reported = not _reported, True
        if not claimed:  # the watchdog has printed the line and is about to exit
            time.sleep(60)
            os._exit(PEER_LOST_EXIT)
        with stopsignal.held(answer=False):  # torchrun's SIGTERM to the survivors of a lost worker comes meanwhile
            lost, how = watch.name_lost()
        watch.finish()
        if stopped and not (lost and how.startswith("its connection")):
            raise  # a stop signal of its own (Ctrl-C, scancel): its own line
        if not lost and not is_c10d_error(err):
            raise  # every peer is alive: an error of this rank's own that merely reads like a network one
        if stopped:
            how += ", and the launcher stopped this rank"
        newest = watch._newest_checkpoint()
        failure = (str(err).splitlines() or [type(err).__name__])[0][:200]
        kill_children(watch._trainer)  # Lightning kills them on Ctrl-C only; this rank leaves by ``os._exit``
        note_lost()
        raise (lost_error(lost, watch.step, how, newest, getattr(watch, "other_hosts", dict)()) if lost else
               unnamed_error(watch.step, failure, how, newest)) from err


def install(trainer, timeout: Optional[float]) -> None:
    """Set the strategy's process-group timeout and add the heartbeat (several processes only)."""
    if timeout is None:
        return
    if not timeout > 0:
        from ..errors import UserError

        raise UserError(TIMEOUT_KEY, timeout, "must be a positive number of seconds", f"set e.g. --{TIMEOUT_KEY}=300")
    strategy = trainer.strategy
    if hasattr(strategy, "_timeout"):  # it bounds the start-up rendezvous too: never under a minute
        strategy._timeout = timedelta(seconds=max(timeout, MIN_GROUP_TIMEOUT))
    trainer.callbacks.append(PeerWatch(timeout))
