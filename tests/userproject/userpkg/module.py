"""A plain LightningModule in lightning-hydra-template's style: the network and the optimizer come in from the
config (`net` through its own `_target_`, `optimizer` as a Hydra partial); attnlab adds checkpoints, resume, loggers,
sweeps and the run directory."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class LitClassifier(L.LightningModule):
    def __init__(self, net: nn.Module, optimizer=None, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["optimizer"])
        self.net = net
        self.optimizer = optimizer

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val/acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/acc", (self(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        if self.optimizer is not None:
            return self.optimizer(params=self.parameters())
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
