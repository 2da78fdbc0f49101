"""The training and validation steps of ``CausalLM`` (``module.py`` sets the module up: the model, its
optimizer, the checks before a run and the checkpoint's extras).

A step: next-token cross-entropy plus the model's auxiliary losses (MoE balancing), the non-finite loss
policy (``model.nonfinite``: skip, stop or raise; on CUDA checked without a host sync per step,
``nonfinite.py``), and what a step logs (loss, tokens, tokens per second, MFU). Validation keeps one
token-weighted mean, and one per data source when the data has several; ``test`` runs the same on the val
split of the folders it is given (``test/loss``).
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn

from . import nonfinite as nonfinite_check
from .nonfinite import supports_found_inf
from .parallel import graph_break_report


class NonFiniteLossError(RuntimeError):
    """Raised by the ``stop`` policy when the loss is NaN or infinite."""


class TrainingSteps(L.LightningModule):
    """The steps of ``CausalLM``; the state they read (``model``, ``nonfinite``, the metrics, the counters and
    the non-finite guard) is made by ``CausalLM.__init__``."""

    def _loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        x, y = batch[:, :-1].long(), batch[:, 1:].long()
        logits = self.model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()), y.numel()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> Optional[torch.Tensor]:
        accumulate = max(1, int(getattr(self.trainer, "accumulate_grad_batches", 1)))
        if self._skip_window.dropped(batch_idx, accumulate):  # the rest of a skipped step's micro-batches
            return None
        loss, ntok = self._loss(batch)
        aux = self.model.aux_losses()
        total = loss + sum(aux.values()) if aux else loss
        if self._immediate_check:  # CPU (free), or skip with an optimizer that cannot skip on the device
            if not torch.isfinite(total):
                skipped = self._on_nonfinite(self.global_step, total.item(), self.skipped_steps + 1, deferred=False)
                self._skip_window.drop(self._torch_optimizer())  # (skip only: the others raised) no update at all
                return skipped
        else:  # CUDA: device-side flag; the host reads it when it has arrived, never waiting for it
            self._guard.observe(total, self.global_step, self._torch_optimizer(), batch_idx % accumulate == 0)
            found = self._guard.poll()
            if found is not None:
                self._on_nonfinite(*found, deferred=True)
        self.tokens_seen += ntok * self.trainer.world_size
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        for name, value in aux.items():
            self.log(f"train/{name}", value, on_step=True, on_epoch=False)
        if self._logging_step():  # a float is copied to the device: only when the logger writes
            self.log("train/tokens", float(self.tokens_seen), on_step=True, on_epoch=False)
        return total

    def _torch_optimizer(self):
        opt = self.optimizers(use_pl_optimizer=False) if self._trainer is not None else None
        return opt[0] if isinstance(opt, list) else opt

    def _logging_step(self) -> bool:
        connector = getattr(self.trainer, "_logger_connector", None)
        return bool(getattr(connector, "should_update_logs", True))

    def on_train_start(self) -> None:
        deferred = self.device.type == "cuda" or nonfinite_check.DEFERRED_ON_CPU
        can_skip_on_device = supports_found_inf(self._torch_optimizer())
        self._immediate_check = not deferred or (self.nonfinite == "skip" and not can_skip_on_device)
        self._guard.reset(self.device)
        if deferred and self._immediate_check:
            rank_zero_warn(
                f"model.nonfinite: skip: {type(self._torch_optimizer()).__name__} cannot skip a step on the device, so "
                "the loss is checked on the host at every step (one sync per step); use torch.optim.AdamW with "
                "fused: true for a sync-free skip, or nonfinite: stop"
            )

    def on_train_end(self) -> None:
        found = self._guard.poll(block=True)
        if found is not None:
            self._on_nonfinite(*found, deferred=True, log=False)

    def _on_nonfinite(self, step: int, value: float, count: int, deferred: bool, log: bool = True) -> Optional[torch.Tensor]:
        hint = ("check the data and the recipe (this is the first step)" if step == 0 else
                "lower the learning rate (model.optimizer.init_args.lr) or resume from the last good checkpoint "
                "with --ckpt_path")
        msg = f"model.nonfinite: {self.nonfinite}: non-finite loss {value} at step {step}"
        if deferred and step != self.global_step:
            msg += f" (seen at step {self.global_step}: on CUDA the check does not wait for the device)"
        if self.nonfinite == "skip":
            if self.trainer.world_size > 1:
                raise NonFiniteLossError(f"{msg}; skip works in single-process runs only: use stop")
            self.skipped_steps = count
            if log:  # (not allowed, nor needed, from the checkpoint and end-of-training hooks)
                self.log("train/skipped_steps", float(self.skipped_steps), on_step=True, on_epoch=False)
            rank_zero_warn(f"{msg}: step skipped ({self.skipped_steps} so far)")
            return None
        if self.nonfinite == "stop":
            path = self._nonfinite_checkpoint_path()
            self.trainer.save_checkpoint(path)
            later = ("" if not deferred or supports_found_inf(self._torch_optimizer()) else
                     "; its weights may include the updates of the steps until it was seen")
            raise NonFiniteLossError(f"{msg}: stopped after saving {path}{later}; {hint}")
        raise NonFiniteLossError(f"{msg}; {hint}")

    def _nonfinite_checkpoint_path(self) -> str:
        cb = self.trainer.checkpoint_callback
        folder = getattr(cb, "dirpath", None) or self.trainer.default_root_dir
        return os.path.join(folder, "nonfinite.ckpt")

    def validation_step(self, batch: torch.Tensor, batch_idx: int, dataloader_idx: int = 0) -> None:
        loss, ntok = self._loss(batch)
        self.val_loss.update(loss, weight=ntok)  # val/loss: token-weighted mean over every validation batch
        if self.val_source_loss is not None:  # several sources: one validation loader each, in name order
            self.val_source_loss[dataloader_idx].update(loss, weight=ntok)

    def on_validation_epoch_end(self) -> None:
        self._log_heldout("val")

    def test_step(self, batch: torch.Tensor, batch_idx: int, dataloader_idx: int = 0) -> None:
        """``test``: the validation step, on the loaders of ``TokenDataModule.test_dataloader`` (the val split of
        ``data.data_dir``: a test set is a folder prepared on its own)."""
        self.validation_step(batch, batch_idx, dataloader_idx)

    def on_test_epoch_end(self) -> None:
        self._log_heldout("test")

    def _log_heldout(self, prefix: str) -> None:
        """Log the held-out loss gathered by ``validation_step`` as ``<prefix>/loss`` and ``<prefix>/ppl`` (and
        ``<prefix>/<name>/...`` per source), and reset the metrics for the next run (``val`` or ``test``)."""
        loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log(f"{prefix}/loss", loss, prog_bar=True, sync_dist=False)
        self.log(f"{prefix}/ppl", torch.exp(loss), sync_dist=False)
        for name, metric in zip(self.val_source_names, self.val_source_loss or []):
            if metric.update_count:
                source_loss = metric.compute()
                self.log(f"{prefix}/{name}/loss", source_loss, sync_dist=False)
                self.log(f"{prefix}/{name}/ppl", torch.exp(source_loss), sync_dist=False)
            metric.reset()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.compile and self._t_last is None and (report := graph_break_report()):
            rank_zero_warn(report)  # the first step of this process compiled the blocks
        now = time.perf_counter()
        if self._t_last is not None and self.trainer.is_global_zero and self._logging_step():
            tokens_per_sec = (batch.shape[1] - 1) * batch.shape[0] * self.trainer.world_size / max(1e-9, now - self._t_last)
            self.log("train/tokens_per_sec", tokens_per_sec, on_step=True, on_epoch=False, prog_bar=True,
                     rank_zero_only=True)
            if self.peak_tflops and self._flops_per_token:
                mfu = tokens_per_sec * self._flops_per_token / (self.peak_tflops * 1e12 * self.trainer.world_size)
                self.log("train/mfu", mfu, on_step=True, on_epoch=False, prog_bar=True, rank_zero_only=True)
        self._t_last = now
