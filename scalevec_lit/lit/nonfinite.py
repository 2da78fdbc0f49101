"""NonFiniteGuard: watch the training loss for NaN/Inf without a host-device sync per step.

On a CPU the check is immediate (reading a CPU tensor costs nothing). On CUDA, ``observe`` only queues
device work: a flag ``~isfinite(loss)``, a running count and the index and value of the first non-finite
loss, packed in one small device tensor; ``poll`` starts a non-blocking copy of it into pinned host memory
and reads the copy that has already arrived (``Event.query()``, which never waits), so the host learns of
a non-finite loss a step or two later, without ever waiting for the device. ``poll(block=True)`` waits:
``CausalLM`` calls it before every checkpoint save and at the end of training (which synchronize anyway),
so no checkpoint is ever written after an unnoticed non-finite loss.

The update of a non-finite step is skipped on the device when the optimizer supports it: fused
``torch.optim.Adam``/``AdamW``/``SGD`` read ``optimizer.found_inf`` (the mechanism ``GradScaler`` uses)
and leave parameters, moments and step counts unchanged when it is 1. Then ``skip`` costs no sync at all,
and ``stop``'s ``nonfinite.ckpt`` holds the weights from before the bad step. With other optimizers,
``skip`` falls back to an immediate per-step check (one sync per step, with a notice), and ``stop`` /
``raise`` may see up to a few updates from non-finite steps before they stop (the message says so).
Either way a skipped step is the whole optimizer step: with gradient accumulation, one non-finite
micro-batch drops the step of its window (on the device: ``found_inf`` is the OR over the window; on the
host: ``SkipWindow`` drops the window's gradients and its remaining micro-batches), so no parameter moves.

``DEFERRED_ON_CPU = True`` (tests only) runs the deferred path on a CPU, with the copy started at one
poll read at the next (one step late), so that the CUDA logic and every policy are tested without a GPU.

Must not import Lightning.
"""
from __future__ import annotations

from typing import Optional

import torch

DEFERRED_ON_CPU = False  # tests: exercise the CUDA (deferred) path on a CPU


class _ArrivedEvent:
    """Stands in for a CUDA event on a CPU: the copy started at one poll is read at the next one."""

    def query(self) -> bool:
        return True

    def record(self) -> None:
        pass


class SkipWindow:
    """Host-side ``skip``: a non-finite micro-batch drops the optimizer step of its accumulation window.

    ``drop`` sets the window's gradients to None (those of its earlier, finite micro-batches too), and
    ``dropped`` is true for the window's remaining micro-batches (no forward, no backward), so at the step
    no parameter has a gradient: the optimizer and ``RoleWeightDecay`` leave every parameter unchanged.
    """

    def __init__(self) -> None:
        self._bad = False

    def dropped(self, batch_idx: int, accumulate: int) -> bool:
        if batch_idx % max(1, accumulate) == 0:  # a new window (Lightning zeroes gradients here)
            self._bad = False
        return self._bad

    def drop(self, optimizer) -> None:
        self._bad = True
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)


def supports_found_inf(optimizer) -> bool:
    """Whether ``optimizer.step`` skips on device when ``optimizer.found_inf`` is 1 (fused Adam/AdamW/SGD)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False) and
                getattr(optimizer, "defaults", {}).get("fused"))


class NonFiniteGuard:
    """Device-side bookkeeping of non-finite losses; ``poll`` reports ``(step, value, count)`` once per new one."""

    def __init__(self) -> None:
        self._device: Optional[torch.device] = None
        self._state: Optional[torch.Tensor] = None  # [count, first index, first value] on the device
        self._window_bad: Optional[torch.Tensor] = None
        self._host: Optional[torch.Tensor] = None
        self._event = None
        self._steps: list[int] = []  # observation index -> global step
        self._reported = 0

    def reset(self, device: torch.device) -> None:
        self._device = device
        self._state = torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64, device=device)
        self._host = torch.zeros(3, dtype=torch.float64, pin_memory=device.type == "cuda")
        self._event, self._steps, self._reported, self._window_bad = None, [], 0, None

    @property
    def deferred(self) -> bool:
        return self._device is not None and (self._device.type == "cuda" or DEFERRED_ON_CPU)

    def observe(self, loss: torch.Tensor, step: int, optimizer=None, first_micro_batch: bool = True) -> torch.Tensor:
        """Record ``loss`` (device ops only); sets ``optimizer.found_inf`` when supported. Returns the flag."""
        if self._state is None or self._state.device != loss.device:
            self.reset(loss.device)
        bad = ~torch.isfinite(loss.detach())
        index = len(self._steps)
        self._steps.append(int(step))
        first = (self._state[1] < 0) & bad
        update = torch.stack([self._state[0] + bad.double(),
                              torch.where(first, torch.full_like(self._state[1], index), self._state[1]),
                              torch.where(first, loss.detach().double(), self._state[2])])
        self._state.copy_(update)
        self._window_bad = bad if first_micro_batch or self._window_bad is None else (self._window_bad | bad)
        if optimizer is not None and supports_found_inf(optimizer):
            optimizer.found_inf = self._window_bad.float()
        return bad

    def poll(self, block: bool = False) -> Optional[tuple[int, float, int]]:
        """``(global step of the first non-finite loss, its value, count so far)`` when a new one is known."""
        if self._state is None:
            return None
        if not self.deferred or block:
            values = self._state.tolist()  # CPU: free; CUDA with block=True: one sync
            self._event = None
        elif self._event is not None and self._event.query():
            values, self._event = self._host.tolist(), None
        else:
            values = None
        if self.deferred and self._event is None:
            self._host.copy_(self._state, non_blocking=True)
            self._event = torch.cuda.Event() if self._device.type == "cuda" else _ArrivedEvent()
            self._event.record()
        if values is None or int(values[0]) <= self._reported:
            return None
        self._reported = int(values[0])
        return self._steps[int(values[1])], float(values[2]), int(values[0])
