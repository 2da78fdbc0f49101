"""A plain ``LightningModule`` with its own ``train_dataloader()`` (no data module): one linear map fitted
by SGD on seeded random pairs, counting its training steps. Shared by tests that need a user's own module."""
from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


def pairs(batch_size: int, n: int = 64) -> DataLoader:
    """``n`` seeded (x, y) pairs, x of width 4, in batches of ``batch_size``, in a fixed order."""
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
                      batch_size=batch_size)


class OwnLoader(pl.LightningModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)
        self.batch_size = batch_size
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def train_dataloader(self):
        return pairs(self.batch_size)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
