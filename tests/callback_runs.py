"""What the callback tests share (``tests/test_callbacks.py``, ``tests/test_role_decay.py``): tiny ``CausalLM`` runs
fitted in-process on random tokens, a module whose loss is multiplied by 0 (only weight decay moves its
parameters), callbacks that record the state at train start and the learning rates of each step, and the
hand-computed decayed reference. Test files import it as ``from callback_runs import ...``.
"""
from __future__ import annotations

import copy
import warnings

import torch
from torch.utils.data import DataLoader

from helpers import tiny_config
from scalevec_lit.lit.module import CausalLM
from scalevec_lit.lit.schedules import Constant
from scalevec_lit.scale import MagnitudeDirectionScale, PlainScale
from scalevec_lit.scale.strategy import ScaleStrategy

QK_NORM = dict(vector=PlainScale, branch_specific=False, placement=dict(q="dual_norm", k="dual_norm"),
               output_shape="head")
UNIFIED = dict(vector=MagnitudeDirectionScale, branch_specific=True, placement=dict(q="dual_norm", k="dual_norm"))
VOCAB = 128


class ZeroGradLM(CausalLM):
    """The loss times 0: every parameter gets a zero gradient, so only weight decay moves parameters."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * 0.0


class Start:
    """Keeps a copy of the model's state at train start (before any update)."""

    def __init__(self):
        from lightning.pytorch.callbacks import Callback

        outer = self
        self.state: dict[str, torch.Tensor] = {}

        class _CB(Callback):
            def on_train_start(self, trainer, pl_module):
                outer.state = copy.deepcopy(pl_module.model.state_dict())

        self.callback = _CB()


class LrRecorder:
    """Records the lr of every group at each optimizer step (after RoleWeightDecay ran, before the update)."""

    def __init__(self):
        from lightning.pytorch.callbacks import Callback

        outer = self
        self.lrs: list[dict[str, float]] = []

        class _CB(Callback):
            def on_before_optimizer_step(self, trainer, pl_module, optimizer):
                outer.lrs.append({g["name"]: g["lr"] for g in optimizer.param_groups})

        self.callback = _CB()


def _data(n=64, seq=32):
    return DataLoader(torch.randint(0, VOCAB, (n, seq + 1)), batch_size=4)


def _fit(module, callbacks, steps, root=None):
    import lightning as L

    logger = False
    if root is not None:
        from lightning.pytorch.loggers import TensorBoardLogger

        logger = TensorBoardLogger(str(root), name="t")
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=logger, callbacks=callbacks, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, train_dataloaders=_data())
    return trainer, [str(w.message) for w in caught]


def _lm(strategy, optimizer, schedule=None, cls=ZeroGradLM, **kw):
    return cls(config=tiny_config(vocab_size=VOCAB), strategy=ScaleStrategy(**strategy), optimizer=optimizer,
               schedule=schedule or Constant(), **kw)


def _decayed(start: torch.Tensor, lrs: list[float], wd: float) -> torch.Tensor:
    ref = start.detach().clone()
    for lr in lrs:
        ref.mul_(1 - lr * wd)
    return ref
