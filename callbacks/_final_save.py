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
  no step (resumed at ``max_steps`` already) and a run that ends by an exception save nothing more;
- the final checkpoint holds the loop state of the end of its step, as a save on the cadence there would:
  at ``on_train_end`` Lightning has already marked the epoch done, and resuming that state with a larger
  ``max_steps`` started a new epoch (other batches: litdata shuffles per epoch), or, after the last batch of
  an epoch, took one more batch as if in that epoch and then ended it. So the state is kept at the end of
  each step that may be the last one (``max_steps`` reached, ``trainer.should_stop`` set, as by ``max_time``,
  the last batch of an epoch: once per epoch) and written in its place: a longer run resumed from the final
  checkpoint continues exactly as an uninterrupted one. An early stop decided by a validation after the
  step keeps Lightning's state (its epoch marked done).

With several processes every rank reaches the same decision (the step and the settings are the same on
every rank, whether the monitored value is logged is agreed), and the save is the usual collective one.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

import torch


class FinalSave:
    """``SafeModelCheckpoint``'s final save; the methods of ``ModelCheckpoint`` it calls come with it."""

    _start_step: Optional[int] = None  # the step this fit started from (``on_train_start``)
    _step_end: Optional[dict] = None  # the fit loop's state at the end of a step that may be the last one
    _saving_final = False

    def _started(self, trainer) -> None:
        self._start_step, self._step_end = trainer.global_step, None

    def keep_step_end(self, trainer) -> None:
        """At the end of a step (``on_train_batch_end``, after the saves there) that may be the run's last and is
        not saved yet: its loop state, for the final save (module docstring). Once per epoch and at the end."""
        loop = trainer.fit_loop
        if self._last_global_step_saved == trainer.global_step or (self.save_top_k == 0 and not self.save_last):
            return
        if trainer.should_stop or 0 < trainer.max_steps <= trainer.global_step or \
                loop.epoch_loop.batch_progress.is_last_batch:
            self._step_end = copy.deepcopy(loop.state_dict())

    def _step_end_loops(self, trainer) -> Optional[dict]:
        """The kept state, when the final save is written after its step's end and the epoch marked done since."""
        kept, loop = self._step_end, trainer.fit_loop
        if kept is None or not self._saving_final:
            return None
        done = loop.epoch_progress.total.processed > kept["epoch_progress"]["total"]["processed"]
        same_step = loop.epoch_loop.batch_progress.total.ready == kept["epoch_loop.batch_progress"]["total"]["ready"]
        return kept if done and same_step else None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        kept = self._step_end_loops(trainer) if "loops" in checkpoint else None
        if kept is not None:
            checkpoint["loops"]["fit_loop"] = copy.deepcopy(kept)
            checkpoint["epoch"] = kept["epoch_progress"]["current"]["completed"]
        super().on_save_checkpoint(trainer, pl_module, checkpoint)

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
        self._saving_final = True
        try:
            self._save_final(trainer)
        finally:
            self._saving_final = False

    def _save_final(self, trainer) -> None:
        candidates = self._monitor_candidates(trainer)
        kept = self._step_end_loops(trainer)
        if kept is not None:  # the file name's epoch too, as a save on the cadence at this step would name it
            candidates["epoch"] = torch.tensor(kept["epoch_progress"]["current"]["completed"])
        logged = self.monitor is None or trainer.strategy.reduce_boolean_decision(self.monitor in candidates)
        if self.save_top_k != 0 and logged:
            self._save_topk_checkpoint(trainer, candidates)
        if self.save_last or self._last_global_step_saved != trainer.global_step:
            asked = self.save_last
            self.save_last = asked or True  # keeps "link"; not among the best k: last.ckpt holds the final model
            try:
                self._save_last_checkpoint(trainer, candidates)
            finally:
                self.save_last = asked
        self._defer_save_until_validation = False  # a cadence save waiting for a validation that will not come
