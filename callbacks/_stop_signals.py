"""Stop signals during training (``SafeModelCheckpoint``): SIGINT (Ctrl-C), SIGTERM and SIGUSR1 (SLURM's
pre-emption warning) finish the current step, save a checkpoint at that step (and ``last``), stop the trainer
(``trainer.should_stop``) and make the CLI exit with 128 + the signal number; a second signal stops at once,
without saving. With several processes the ranks agree every ``stop_check_every_n_steps`` steps (one small
all-reduce), so they stop at the same step.

Before training the command's own handlers (``scalevec_lit/stopsignal.py``) stop it at once. A signal whose
``StopSignal`` a library swallowed while ``fit`` started up (its ``__del__``, its ``except BaseException``)
stops the run when the signals are taken over here, before the first step, with the start-up line (nothing
trained, nothing saved), instead of after a whole run.
"""
from __future__ import annotations

import signal
import threading
from typing import Any, Optional

from scalevec_lit import stopsignal
from scalevec_lit.errors import notice

STOP_SIGNALS = stopsignal.STOP_SIGNALS


class StopSignals:
    """``SafeModelCheckpoint``'s stop signals; the methods of ``ModelCheckpoint`` it calls come with it."""

    stop_check_every_n_steps: int = 10
    stop_signal: Optional[int] = None  # the signal that stopped the run
    stop_exit_code: int = 0
    _received: Optional[int] = None

    def take_signals(self, trainer) -> None:
        """At train start: answer a stop signal swallowed during start-up, then own the signals."""
        self._received, self.stop_signal, self.stop_exit_code = None, None, 0
        self._previous_handlers = {}
        if threading.current_thread() is not threading.main_thread():
            return
        stopsignal.raise_if_swallowed()  # StopSignal: fit stops here, before its first step (module docstring)
        for signum in STOP_SIGNALS:
            self._previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        stopsignal.enter_training()
        stopsignal.at_step(trainer.global_step)

    def release_signals(self, trainer) -> None:
        """At train end, once the last writes are done: a signal from now on is the command's."""
        stopsignal.leave_training(trainer.global_step)  # a signal now waits for the last writes
        if self._received is not None and self.stop_signal is None:  # arrived after the last step's check
            stopsignal.remember(self._received)
        self._restore_handlers()

    def _on_signal(self, signum: int, frame) -> None:
        if self._received is not None:  # the second one: stop at once, as without this callback
            self._restore_handlers()
            signal.raise_signal(signum)
            return
        self._received = signum
        notice(f"received {signal.Signals(signum).name}: saving a checkpoint at the end of this step, then stopping "
               "(send it again to stop at once, without saving)")

    def _restore_handlers(self) -> None:
        for signum, handler in getattr(self, "_previous_handlers", {}).items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous_handlers = {}

    def stop_if_signalled(self, trainer) -> None:
        """At the end of each step: a received signal saves this step and stops the run. With gradient
        accumulation, only at the micro-batch that ends the step: one saved inside the window lost the gradients
        of its micro-batches and could not resume on another number of processes (``lit/reshard.py``)."""
        stopsignal.at_step(trainer.global_step)
        if _inside_accumulation_window(trainer):
            return
        received = self._received
        if trainer.world_size > 1:
            if trainer.global_step % self.stop_check_every_n_steps:
                return
            stop = trainer.strategy.reduce_boolean_decision(received is not None, all=False)
            received = received or (signal.SIGTERM if stop else None)
        if received is None or self.stop_signal is not None:
            return
        self.stop_signal = received
        self.stop_exit_code = 128 + int(received)
        candidates = self._monitor_candidates(trainer)
        path = self.format_checkpoint_name(candidates)
        if self._last_global_step_saved != trainer.global_step:
            self._save_checkpoint(trainer, path)
        else:
            path = self._last_checkpoint_saved
        if self.save_last:
            self._save_last_checkpoint(trainer, candidates)
        trainer.should_stop = True
        notice(f"stopped by {signal.Signals(received).name} at step {trainer.global_step}: saved {path}; resume "
               "with the same command and --ckpt_path last")


def _inside_accumulation_window(trainer) -> bool:
    """The micro-batch just ended is not the last of its optimizer step (Lightning's own test, the same on every
    rank)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    try:
        return bool(loop._should_accumulate())
    except Exception:  # noqa: BLE001 - another loop: as before, every micro-batch ends a step
        return False
