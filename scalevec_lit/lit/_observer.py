"""Lightning's own launcher (``--trainer.devices=N`` without torchrun) watches its child ranks from a thread
of the main process (rank 0): every 5 s, and when a child has ended with a non-zero code it SIGKILLs the other
children and the main process itself, without a word. A lost local rank then races that kill against the
survivor's line (``lit/peers.py``): on a loaded machine the kill can win, and rank 0 ends with -9 and no line.
``replace_kill`` puts a hook in place of that kill while a peer watch runs; the hook says what to do.

Lightning kills those children itself only on Ctrl-C (``KeyboardInterrupt``), not when rank 0 fails otherwise.
A rank 0 that leaves with ``os._exit`` after a lost peer (``lit/peers.py``) kills the ones still running first
(``kill_children``): a child stopped by SIGSTOP, or hung outside a collective, would otherwise outlive the run,
holding its memory and device, until someone finds it.
"""
from __future__ import annotations

import signal
import threading
from contextlib import suppress
from typing import Callable, Iterable, Optional

OBSERVER = "child-process-observer"  # lightning.fabric.strategies.launchers.subprocess_script


def replace_kill(hook: Callable[[Callable[[], None]], None], threads: Optional[Iterable] = None) -> bool:
    """Replace the kill of Lightning's child-process observer by ``hook(the original kill)``; whether one ran."""
    found = False
    for thread in threading.enumerate() if threads is None else threads:
        original = getattr(thread, "_terminate_all", None)
        if getattr(thread, "name", "") == OBSERVER and callable(original):
            thread._terminate_all = lambda original=original: hook(original)
            found = True
    return found


def _children(trainer) -> list:
    """The local ranks this process launched (``Popen``s of Lightning's launcher); none under torchrun."""
    return getattr(getattr(getattr(trainer, "strategy", None), "launcher", None), "procs", None) or []


def kill_children(trainer) -> None:
    """SIGKILL the child ranks that still run (as Lightning's observer does), before this process leaves."""
    for proc in _children(trainer):
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                proc.kill()


def children_ended(trainer) -> Optional[tuple[list[int], str]]:
    """Under Lightning's own launcher the other local ranks are this process's children: the ranks of those that
    ended with a non-zero code, and how (named at once: the observer kills this process a few seconds later)."""
    procs = _children(trainer)
    codes = {i + 1: p.poll() for i, p in enumerate(procs)}
    ended = {i: c for i, c in codes.items() if c not in (None, 0)}
    if not ended:
        return None
    first = trainer.node_rank * trainer.num_devices
    how = [f"killed by {signal.Signals(-c).name}" if c < 0 and -c in signal.valid_signals() else f"exit {c}"
           for c in ended.values()]
    return [first + i for i in ended], f"its process ended ({', '.join(how)})"
