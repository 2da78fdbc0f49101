"""A progress bar that counts optimizer steps against ``trainer.max_steps`` (pre-training runs are step-based:
the data stream has no meaningful epoch, and Lightning's bars show ``Epoch 1/-2`` and the batches of an epoch).

``StepProgressBar`` is a ``TQDMProgressBar`` whose training bar shows ``step 120/300`` (the rate is in steps
per second, gradient accumulation included; a resumed run starts at its step); validation bars are
Lightning's. The CLI puts it in place of Lightning's default bar and of a plain ``TQDMProgressBar`` or
``RichProgressBar`` in a recipe, keeping their ``refresh_rate`` (``install_step_progress_bar``).
"""
from __future__ import annotations

import math
from typing import Any

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    """Training progress in optimizer steps: ``step n/max_steps`` (``refresh_rate`` counts steps)."""

    _last_step = -1

    def _total_steps(self, trainer) -> Any:
        if trainer.max_steps and trainer.max_steps > 0:
            return trainer.max_steps
        total = trainer.estimated_stepping_batches
        return int(total) if total is not None and math.isfinite(total) else None

    def on_train_start(self, trainer, pl_module) -> None:
        self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.reset(total=self._total_steps(trainer))
        self.train_progress_bar.initial = 0
        self.train_progress_bar.n = trainer.global_step
        self.train_progress_bar.set_description("step")
        self.train_progress_bar.refresh()
        self._last_step = trainer.global_step

    def on_train_epoch_start(self, trainer, *_: Any) -> None:
        """Steps continue across epochs: nothing to reset."""

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        bar = self.train_progress_bar
        step = trainer.global_step
        if bar is None or step == self._last_step:  # a micro-batch inside an accumulation window
            return
        self._last_step = step
        if self.is_enabled and (step % self.refresh_rate == 0 or step == bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.n = trainer.global_step
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))


def install_step_progress_bar(trainer) -> None:
    """Replace Lightning's default bar, or a plain ``TQDMProgressBar``/``RichProgressBar`` of a recipe, by a
    ``StepProgressBar`` with the same refresh rate (a subclass someone chose is left alone)."""
    for i, cb in enumerate(trainer.callbacks):
        if type(cb) in (TQDMProgressBar, RichProgressBar):
            rate = getattr(cb, "refresh_rate", 1) or 1
            bar = StepProgressBar(refresh_rate=rate, process_position=getattr(cb, "process_position", 0))
            if cb.is_disabled:
                bar.disable()
            trainer.callbacks[i] = bar


def drop_bars_when_disabled(trainer_config) -> None:
    """``--trainer.enable_progress_bar=false`` on a recipe that lists a progress bar: the recipe's bar goes
    (Lightning would refuse the pair), so that turning the bar off works on any recipe."""
    import importlib

    from lightning.pytorch.callbacks import ProgressBar

    callbacks = trainer_config.get("callbacks")
    if trainer_config.get("enable_progress_bar") is not False or not isinstance(callbacks, list):
        return

    def is_bar(entry) -> bool:
        path = entry.get("class_path") if hasattr(entry, "get") else None
        if not isinstance(path, str) or "." not in path:
            return isinstance(entry, ProgressBar)
        module, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return False  # named wrongly: the recipe checks report it
        return isinstance(cls, type) and issubclass(cls, ProgressBar)

    trainer_config["callbacks"] = [c for c in callbacks if not is_bar(c)]
