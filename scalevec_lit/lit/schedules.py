"""Learning-rate schedules: multipliers of the base learning rate as a function of the step.

Each schedule is a small class chosen in YAML (``model.schedule: {class_path: ..., init_args: ...}``);
``max_steps=None`` takes the trainer's total optimizer steps at fit start (``with_max_steps``, called
again at every fit, so a schedule object reused for a second fit follows the new length). The value at
step ``s`` is the multiplier of the optimizer step with index ``s`` (0-based, as ``LambdaLR`` calls it):
warmup gives ``(s + 1) / warmup_steps``, so no step runs at lr 0; decays reach their floor at
``s = max_steps`` (the step after the last one), as Hugging Face's and torchtitan's schedules do.
A warmup longer than the run (``--trainer.max_steps=5`` on a recipe with 30 warmup steps) is clipped to
the run (for WSD: to the start of the decay) with a one-line notice, so a short run of any recipe works.

Must not import Lightning.
"""
from __future__ import annotations

import math
from typing import Literal, Optional


class Schedule:
    """Base: ``multiplier(step)`` in [0, 1] with linear warmup over ``warmup_steps``.

    Called as ``schedule(step)`` by ``LambdaLR`` with the 0-based optimizer step: ``warmup(step)`` below
    ``warmup_steps``, ``after_warmup(step)`` from there on. A new schedule subclasses it and overrides
    ``after_warmup`` (and ``check`` to validate its own options once ``max_steps`` is known); its constructor
    arguments are what a recipe gives as ``init_args``, and it passes ``warmup_steps`` and ``max_steps`` on."""

    def __init__(self, warmup_steps: int = 0, max_steps: Optional[int] = None) -> None:
        if warmup_steps < 0:
            raise ValueError(f"model.schedule.warmup_steps: {warmup_steps} must be >= 0")
        self.warmup_steps = int(warmup_steps)
        self._warmup_requested = self.warmup_steps  # what the recipe asked for; clipped per run in check()
        self.max_steps = None if max_steps is None else int(max_steps)
        self._max_steps_fixed = max_steps is not None  # given by the user: never replaced by the trainer's
        if self.max_steps is not None:
            self.check()

    def with_max_steps(self, max_steps: int) -> "Schedule":
        """Set the total number of steps (the trainer's) unless the user fixed ``max_steps``."""
        if not self._max_steps_fixed:
            self.max_steps = int(max_steps)
        self.check()
        return self

    def check(self) -> None:
        """Validate the schedule once ``max_steps`` is known; clip a warmup longer than the run."""
        self._clip_warmup(self.max_steps)

    def _clip_warmup(self, limit: int) -> None:
        requested = self._warmup_requested
        self.warmup_steps = requested
        if requested > self.max_steps:
            self.warmup_steps = max(0, int(limit))
            from ..errors import notice

            notice(f"model.schedule.warmup_steps: {requested} is longer than this run ({self.max_steps} steps); "
                   f"warming up over {self.warmup_steps} steps instead")

    def total_steps(self) -> int:
        """``max_steps``, the run's length in optimizer steps (a decay reaches its floor there); ``ValueError`` while
        it is unknown (neither given nor set by ``with_max_steps``)."""
        if self.max_steps is None:
            raise ValueError(
                f"model.schedule.max_steps: None; {type(self).__name__} needs the run length after warmup: set "
                "max_steps or call with_max_steps() (CausalLM does this from the trainer at fit start)"
            )
        return self.max_steps

    def warmup(self, step: int) -> float:
        """The multiplier during warmup: ``(step + 1) / warmup_steps``, linear up to 1 at the last warmup step."""
        return (step + 1) / self.warmup_steps if step < self.warmup_steps else 1.0

    def after_warmup(self, step: int) -> float:
        """The multiplier at ``step >= warmup_steps``, in [0, 1]: what a subclass overrides (the base: 1). It may
        read ``warmup_steps`` (already clipped to the run) and ``total_steps()``, and holds its final value for
        steps past ``max_steps``."""
        return 1.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.warmup(step)
        return self.after_warmup(step)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Constant(Schedule):
    """Warmup, then the base learning rate."""


class WarmupCosine(Schedule):
    """Warmup, then cosine from 1 down to ``min_lr_ratio`` at ``max_steps`` (held there after)."""

    def __init__(self, warmup_steps: int = 100, min_lr_ratio: float = 0.1, max_steps: Optional[int] = None) -> None:
        _check_ratio(min_lr_ratio)
        self.min_lr_ratio = float(min_lr_ratio)
        super().__init__(warmup_steps, max_steps)

    def after_warmup(self, step: int) -> float:
        """Cosine from 1 at the end of warmup down to ``min_lr_ratio`` at ``max_steps``, held there after."""
        total = max(1, self.total_steps() - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / total)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class WSD(Schedule):
    """Warmup-stable-decay: warmup, a constant plateau, then a decay over the last ``decay_fraction`` of
    ``max_steps`` to ``min_lr_ratio`` with shape ``linear``, ``cosine`` or ``1-sqrt``."""

    def __init__(
        self,
        warmup_steps: int = 100,
        decay_fraction: float = 0.2,
        decay_shape: Literal["linear", "cosine", "1-sqrt"] = "1-sqrt",
        min_lr_ratio: float = 0.0,
        max_steps: Optional[int] = None,
    ) -> None:
        if not 0.0 <= decay_fraction <= 1.0:
            raise ValueError(f"model.schedule.decay_fraction: {decay_fraction} must be in [0, 1]")
        if decay_shape not in ("linear", "cosine", "1-sqrt"):
            raise ValueError(f"model.schedule.decay_shape: {decay_shape!r} is not one of linear, cosine, 1-sqrt")
        _check_ratio(min_lr_ratio)
        self.decay_fraction = float(decay_fraction)
        self.decay_shape = decay_shape
        self.min_lr_ratio = float(min_lr_ratio)
        super().__init__(warmup_steps, max_steps)

    def decay_steps(self) -> int:
        """Length of the decay phase: ``decay_fraction * max_steps`` rounded half up."""
        return int(math.floor(self.decay_fraction * self.total_steps() + 0.5))

    def check(self) -> None:
        self._clip_warmup(self.max_steps - self.decay_steps())
        start = self.max_steps - self.decay_steps()
        if self.decay_steps() and start < self.warmup_steps:
            raise ValueError(
                f"model.schedule.decay_fraction: {self.decay_fraction} starts the decay at step {start}, before "
                f"warmup_steps={self.warmup_steps} ends (max_steps={self.max_steps}); lower decay_fraction or warmup_steps"
            )

    def after_warmup(self, step: int) -> float:
        """1 until the decay starts (``max_steps − decay_steps()``), then ``decay_shape`` down to ``min_lr_ratio``
        at ``max_steps``, held there after."""
        total = self.total_steps()
        decay_steps = self.decay_steps()
        start = total - decay_steps
        if step < start or decay_steps == 0:
            return 1.0
        p = min(1.0, (step - start) / decay_steps)
        if self.decay_shape == "linear":
            f = 1.0 - p
        elif self.decay_shape == "cosine":
            f = 0.5 * (1 + math.cos(math.pi * p))
        else:
            f = 1.0 - math.sqrt(p)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * f


def _check_ratio(min_lr_ratio: float) -> None:
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"model.schedule.min_lr_ratio: {min_lr_ratio} must be in [0, 1] (a fraction of the base lr)")
