"""The checkpoint of a run's final step (``SafeModelCheckpoint``).

Lightning's ``ModelCheckpoint`` saves only at its cadence (``every_n_train_steps``, ``every_n_epochs``,
``train_time_interval``): a run of ``max_steps: 7`` saving every 5 steps ended with step 5 on disk, and
``export``, ``inspect`` or a resume got the step-5 model. Here the end of a run that finishes normally
(``max_steps``, ``max_epochs``, ``max_time`` or an early stop: ``fit`` returns) is always on disk:

- the final step is saved as its cadence would save it, and ``last`` (``save_last``) then points at it;
  when the final step is itself on the cadence it is saved once, not twice (nor again after a stop signal,
  whose path saves that step already);
- without a ``monitor`` it is saved at the end of that step (``on_train_batch_end`` of the step reaching
  ``max_steps``), so the file is the same as a cadence save at that step would be and resuming it with a
  larger ``max_steps`` continues exactly; every other end is saved at ``on_train_end``;
- with a ``monitor`` it is saved at ``on_train_end``, after a validation that runs at that step, and kept
  among the best ``save_top_k`` only when its score qualifies; otherwise, or when the monitored value is
  not logged, it goes to ``last.ckpt``, even with ``save_last`` off, so that the trained model is never
  lost (and ``--ckpt_path last``, which takes the newest checkpoint, resumes from it);
- ``save_top_k: 0`` with ``save_last`` off (no checkpoints asked for), ``fast_dev_run``, a run that took
  no step (resumed at ``max_steps`` already) and a run that ends by an exception save nothing more.

With several processes every rank reaches the same decision (the step and the settings are the same on
every rank, whether the monitored value is logged is agreed), and the save is the usual collective one.
"""
from __future__ import annotations

from typing import Optional


class FinalSave:
    """``SafeModelCheckpoint``'s final save; the methods of ``ModelCheckpoint`` it calls come with it."""

    _start_step: Optional[int] = None  # the step this fit started from (``on_train_start``)

    def _started(self, trainer) -> None:
        self._start_step = trainer.global_step

    def save_at_last_step(self, trainer) -> None:
        """At the end of the step that reaches ``max_steps``, without a monitor (module docstring)."""
        if self.monitor is None and 0 < trainer.max_steps <= trainer.global_step:
            self.save_final(trainer)

    def save_final(self, trainer) -> None:
        """Save this step as the run's final one unless it is on disk already (module docstring)."""
        if self._start_step is None or trainer.global_step <= self._start_step:
            return  # no step taken in this fit: its state is the checkpoint it started from
        if (self.save_top_k == 0 and not self.save_last) or self._should_skip_saving_checkpoint(trainer):
            return  # no checkpoints wanted; fast_dev_run; or this step is saved already
        candidates = self._monitor_candidates(trainer)
        logged = self.monitor is None or trainer.strategy.reduce_boolean_decision(self.monitor in candidates)
        if self.save_top_k != 0 and logged:
            self._save_topk_checkpoint(trainer, candidates)
        if self.save_last or self._last_global_step_saved != trainer.global_step:
            asked = self.save_last
            self.save_last = asked or True  # not among the best k: last.ckpt holds the final model
            try:
                self._save_last_checkpoint(trainer, candidates)
            finally:
                self.save_last = asked
        self._defer_save_until_validation = False  # a cadence save waiting for a validation that will not come
